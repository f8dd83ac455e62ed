"""faults.py's save-slow kind over persist.py, in-process: the pause falls between a session
file being written under its temporary name and its rename, so a kill then leaves exactly
the files the reliability suite expects (tests/ops/test_reliability_live.py). The decode kinds
are tested in tests/ops/test_notify.py."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from helpers.fakes import Pauses

from appliance.engine import faults
from appliance.engine.kv import persist


@pytest.fixture(autouse=True)
def _unhooked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(persist, "before_rename", None)  # whatever a test arms goes with it


def key(i: int) -> str:
    return hashlib.sha256(b"s%d" % i).hexdigest()


def test_save_slow_specs() -> None:
    assert faults.parse("save-slow") == faults.Fault("save-slow", 10.0, 0)
    assert faults.parse("save-slow:2.5@1") == faults.Fault("save-slow", 2.5, 1)
    for bad in ("save-fail", "save-slow:", "save-slow@x"):
        with pytest.raises(faults.ConfigError, match="save-slow"):
            faults.parse(bad)


def test_save_slow_leaves_the_model_alone_and_pauses_each_file_after_the_first_n(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    class Model:
        def decode(self) -> str:
            return "real"

    m = Model()
    seen: list[list[str]] = []
    # The directory as each pause finds it (not polled: a poll could catch the first file's own
    # temporary name, which a loaded machine did).
    pauses = Pauses(at_pause=lambda: seen.append(sorted(os.listdir(tmp_path))))
    monkeypatch.setattr(faults, "threading", pauses)
    faults.inject(m, faults.Fault("save-slow", 0.4, after=1))
    assert m.decode() == "real" and "decode" not in vars(m)
    records = [(key(i), [1, 2, i], 0, float(i), b"x" * 100) for i in range(3)]
    persist.save_all(tmp_path, "fp", records, 2**20)
    assert pauses.seconds == [0.4, 0.4]  # two pauses of 0.4 s: the first file went through
    # Mid-save: the first file (the most recent) complete, the next one under a temporary name.
    mid = seen[0]
    assert [n for n in mid if n.endswith(persist.SUFFIX)] == [persist.file_name(key(0))]
    assert len([n for n in mid if n.endswith(persist.TMP_SUFFIX)]) == 1
    assert sorted(os.listdir(tmp_path)) == sorted(persist.file_name(key(i)) for i in range(3))


def test_a_failing_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a full disk does mid-save (the live suite uses RLIMIT_FSIZE for it): the
    temporary file goes, and the error reaches the caller, which logs it."""
    def full(tmp_name: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist, "before_rename", full)
    with pytest.raises(OSError, match="No space"):
        persist.save_all(tmp_path, "fp", [(key(0), [1], 0, 0.0, b"x")], 2**20)
    assert os.listdir(tmp_path) == []
