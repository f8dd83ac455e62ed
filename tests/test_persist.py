"""Saved session state: round trip, budget, and every kind of damaged file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from appliance import persist

FP = "model-a|llama-cpp-python 0.3.36|kv f16"


def rec(session: str, idle: float, size: int = 100) -> tuple[str, list[int], int, float, bytes]:
    return (session, [1, 2, 3], 2, idle, bytes(range(256)) * (size // 256) + b"x" * (size % 256))


def test_round_trip(tmp_path: Path) -> None:
    assert persist.save_all(tmp_path, FP, [rec("alice", 5.0), rec("bob", 1.0)], 10**6) == 2
    saved = {s.session: s for s in persist.scan(tmp_path, FP)}
    assert set(saved) == {"alice", "bob"}
    assert saved["alice"].tokens == [1, 2, 3] and saved["alice"].shared_len == 2
    assert saved["alice"].last_used_age_s == 5.0
    assert persist.load(saved["bob"]) == rec("bob", 1.0)[4]
    assert not saved["bob"].path.exists()  # consumed


def test_file_names_never_contain_session_ids(tmp_path: Path) -> None:
    persist.save_all(tmp_path, FP, [rec("../../etc/passwd", 1.0)], 10**6)
    (f,) = tmp_path.iterdir()
    assert f.parent == tmp_path and "passwd" not in f.name and f.suffix == ".kv"


def test_budget_keeps_most_recent_first(tmp_path: Path) -> None:
    records = [rec("old", 100.0, 1000), rec("new", 1.0, 1000), rec("mid", 10.0, 1000)]
    assert persist.save_all(tmp_path, FP, records, 2500) == 2
    assert {s.session for s in persist.scan(tmp_path, FP)} == {"new", "mid"}


def test_save_replaces_previous_files(tmp_path: Path) -> None:
    persist.save_all(tmp_path, FP, [rec("a", 1.0)], 10**6)
    persist.save_all(tmp_path, FP, [rec("b", 1.0)], 10**6)
    assert [s.session for s in persist.scan(tmp_path, FP)] == ["b"]


@pytest.mark.parametrize("damage", ["other-model", "truncated", "garbage", "empty", "bad-json", "huge-header"])
def test_damaged_or_mismatched_files_are_discarded(tmp_path: Path, damage: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    persist.save_all(tmp_path, FP, [rec("s", 1.0, 5000)], 10**6)
    (f,) = tmp_path.glob("*.kv")
    data = f.read_bytes()
    fp = FP
    if damage == "other-model":
        fp = "model-b|llama-cpp-python 0.3.36|kv q8_0"
    elif damage == "truncated":
        f.write_bytes(data[:-10])
    elif damage == "garbage":
        f.write_bytes(b"\x00" * 300)
    elif damage == "empty":
        f.write_bytes(b"")
    elif damage == "bad-json":
        f.write_bytes(persist.MAGIC + (5).to_bytes(4, "little") + b"{oops" + b"x" * 10)
    elif damage == "huge-header":
        f.write_bytes(persist.MAGIC + (2**31).to_bytes(4, "little"))
    with caplog.at_level(logging.WARNING):
        assert persist.scan(tmp_path, fp) == []
    assert not f.exists()
    assert "discarding session state" in caplog.text


def test_corrupt_payload_fails_checksum_on_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    persist.save_all(tmp_path, FP, [rec("s", 1.0, 5000)], 10**6)
    (f,) = tmp_path.glob("*.kv")
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    (saved,) = persist.scan(tmp_path, FP)  # sizes still agree: only the checksum can tell
    with caplog.at_level(logging.WARNING):
        assert persist.load(saved) is None
    assert "checksum mismatch" in caplog.text and not f.exists()


def test_missing_directory_is_empty(tmp_path: Path) -> None:
    assert persist.scan(tmp_path / "nope", FP) == []
