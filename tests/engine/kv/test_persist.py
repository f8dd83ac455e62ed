"""Saved session state: round trip, budget, every kind of damaged file, and the file
hygiene: private modes, digests instead of ids, no symlinks followed, leftovers removed."""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.engine.kv import persist
from appliance.engine.names import saved_key
from appliance.statedir import StateDirError

FP = "model-a|llama-cpp-python 0.3.36|kv f16"


def rec(session: str, idle: float, size: int = 100) -> tuple[str, list[int], int, float, bytes]:
    return (saved_key(session), [1, 2, 3], 2, idle, bytes(range(256)) * (size // 256) + b"x" * (size % 256))


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_round_trip(tmp_path: Path) -> None:
    assert persist.save_all(tmp_path, FP, [rec("alice", 5.0), rec("bob", 1.0)], 10**6) == 2
    saved = {s.key: s for s in persist.scan(tmp_path, FP)}
    assert set(saved) == {saved_key("alice"), saved_key("bob")}
    alice, bob = saved[saved_key("alice")], saved[saved_key("bob")]
    assert alice.tokens == [1, 2, 3] and alice.shared_len == 2
    assert alice.last_used_age_s == 5.0
    assert persist.load(bob) == rec("bob", 1.0)[4]
    assert not bob.path.exists()  # consumed


def test_files_carry_only_a_digest_of_the_session_id(tmp_path: Path) -> None:
    session = "../../etc/passwd-" + "s3cr3t-session-id-XYZ"
    persist.save_all(tmp_path, FP, [rec(session, 1.0)], 10**6)
    (f,) = tmp_path.iterdir()
    assert f.parent == tmp_path and f.suffix == ".kv"
    assert f.name == saved_key(session)[:32] + ".kv"  # named by digest
    raw = f.read_bytes()
    assert raw.startswith(persist.MAGIC)
    for part in ("passwd", "s3cr3t", "XYZ"):
        assert part.encode() not in raw and part not in f.name
    assert saved_key(session).encode() in raw  # what a session is matched by on load


def test_session_key_hashes_whatever_string_it_gets() -> None:
    keys = {saved_key(s) for s in ("a", "b", "", "\ud800", "é" * 1000, "0" * 64)}
    assert len(keys) == 6 and all(len(k) == 64 for k in keys)
    assert saved_key("0" * 64) != "0" * 64  # a digest from the HTTP layer is hashed again


def test_a_raw_id_is_refused_as_a_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="digest"):
        persist.save_all(tmp_path, FP, [("alice", [1], 0, 1.0, b"x")], 10**6)
    assert list(tmp_path.iterdir()) == []


def test_budget_keeps_most_recent_first(tmp_path: Path) -> None:
    records = [rec("old", 100.0, 1000), rec("new", 1.0, 1000), rec("mid", 10.0, 1000)]
    assert persist.save_all(tmp_path, FP, records, 2800) == 2
    assert {s.key for s in persist.scan(tmp_path, FP)} == {saved_key("new"), saved_key("mid")}


def test_save_replaces_previous_files(tmp_path: Path) -> None:
    persist.save_all(tmp_path, FP, [rec("a", 1.0)], 10**6)
    persist.save_all(tmp_path, FP, [rec("b", 1.0)], 10**6)
    assert [s.key for s in persist.scan(tmp_path, FP)] == [saved_key("b")]


@pytest.mark.usefixtures("umask_022")
def test_new_directory_0700_and_files_0600_under_umask_022(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state"
    persist.save_all(state, FP, [rec("a", 1.0), rec("b", 2.0)], 10**6)
    assert mode(state) == 0o700
    files = list(state.iterdir())
    assert len(files) == 2 and all(mode(f) == 0o600 for f in files)
    assert all(os.lstat(f).st_uid == os.geteuid() for f in files)


@pytest.mark.usefixtures("umask_022")
def test_existing_directory_with_a_loose_mode_is_tightened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o775)
    with caplog.at_level(logging.WARNING):
        assert persist.scan(state, FP) == []  # at start already
    assert mode(state) == 0o700
    assert "had mode 0775: set to 0700" in caplog.text
    os.chmod(state, 0o755)
    persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    assert mode(state) == 0o700


def test_scan_of_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    assert persist.scan(tmp_path / "nope", FP) == []
    assert not (tmp_path / "nope").exists()


def test_state_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "state"
    link.symlink_to(real)
    with pytest.raises(StateDirError, match="symbolic link"):
        persist.save_all(link, FP, [rec("a", 1.0)], 10**6)
    with pytest.raises(StateDirError, match="symbolic link"):
        persist.scan(link, FP)
    assert list(real.iterdir()) == []


def test_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "state"
    f.write_text("x")
    with pytest.raises(StateDirError, match="not a directory"):
        persist.save_all(f, FP, [rec("a", 1.0)], 10**6)


def test_state_dir_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(persist.os, "geteuid", lambda: me + 1)  # as if we were someone else
    with pytest.raises(StateDirError, match="owned by uid"):
        persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    with pytest.raises(StateDirError, match="owned by uid"):
        persist.scan(state, FP)
    assert list(state.iterdir()) == []


def test_a_symlink_in_place_of_a_file_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    state = tmp_path / "state"
    persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    (f,) = state.glob("*.kv")
    f.unlink()
    f.symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        assert persist.scan(state, FP) == []
    assert "symbolic link" in caplog.text and not f.is_symlink()
    # Saving over a planted link replaces the link, never writes through it.
    f.symlink_to(victim)
    persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    assert victim.read_bytes() == b"precious" and not f.is_symlink() and mode(f) == 0o600


def test_a_fifo_in_place_of_a_file_does_not_hang(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    fifo = state / (saved_key("a")[:32] + ".kv")
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING):
        assert persist.scan(state, FP) == []
    assert "not a regular file" in caplog.text and not fifo.exists()


def test_temporary_write_never_follows_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The temporary name is fresh and opened O_EXCL|O_NOFOLLOW: even a link planted under
    # exactly that name makes the save fail rather than write through it.
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setattr(persist.secrets, "token_hex", lambda n: "fixed")
    tmp = state / f".{saved_key('a')[:32]}.kv.fixed.tmp"
    real_listdir = os.listdir

    def plant_after_cleanup(fd: int) -> list[str]:
        names = real_listdir(fd)
        tmp.symlink_to(victim)  # after the stale-file sweep, before the write
        return names

    monkeypatch.setattr(persist.os, "listdir", plant_after_cleanup)
    with pytest.raises(FileExistsError):
        persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    assert victim.read_bytes() == b"precious"


def test_interrupted_save_leftovers_are_removed_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    (state / f".{saved_key('b')[:32]}.kv.0123456789ab.tmp").write_bytes(persist.MAGIC + b"half")
    (state / "notes.txt").write_text("not ours to remove")
    with caplog.at_level(logging.WARNING):
        saved = persist.scan(state, FP)
    assert [s.key for s in saved] == [saved_key("a")]
    assert sorted(p.name for p in state.iterdir()) == sorted([saved[0].path.name, "notes.txt"])
    assert "removed 1 temporary session files left by an interrupted save" in caplog.text


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    assert list(state.iterdir()) == []


def test_file_and_directory_are_fsynced_before_and_after_rename(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(*a: object, **kw: object) -> None:
        events.append("rename")
        real_replace(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(persist.os, "fsync", fsync)
    monkeypatch.setattr(persist.os, "replace", replace)
    persist.save_all(state, FP, [rec("a", 1.0), rec("b", 2.0)], 10**6)
    assert events == ["fsync file", "rename", "fsync file", "rename", "fsync dir"]


def test_older_format_files_are_discarded_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    persist.save_all(state, FP, [rec("new", 1.0)], 10**6)
    for i in range(3):  # version 1 files: a JSON header with the raw session id
        header = b'{"session": "raw-id-%d", "tokens": [1], "shared_len": 0, "idle_s": 1.0}' % i
        (state / f"{i:032x}.kv").write_bytes(persist.FAMILY + b"\x01" + len(header).to_bytes(4, "little") + header)
    with caplog.at_level(logging.INFO):
        saved = persist.scan(state, FP)
    assert [s.key for s in saved] == [saved_key("new")]
    assert len(list(state.iterdir())) == 1
    lines = [r.getMessage() for r in caplog.records if "older format" in r.getMessage()]
    assert lines == [f"discarded 3 session files of an older format in {state} (they held raw session ids)"]


def test_a_file_renamed_to_another_digest_is_discarded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    persist.save_all(state, FP, [rec("a", 1.0)], 10**6)
    (f,) = state.glob("*.kv")
    f.rename(state / (saved_key("b")[:32] + ".kv"))  # would answer to session b
    with caplog.at_level(logging.WARNING):
        assert persist.scan(state, FP) == []
    assert "does not match its session digest" in caplog.text


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


def test_load_of_a_file_swapped_for_a_symlink_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = tmp_path / "victim"
    state = tmp_path / "state"
    persist.save_all(state, FP, [rec("s", 1.0, 5000)], 10**6)
    (saved,) = persist.scan(state, FP)
    saved.path.rename(victim)
    saved.path.symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        assert persist.load(saved) is None
    assert "symbolic link" in caplog.text and not saved.path.is_symlink() and victim.exists()


def test_missing_directory_is_empty(tmp_path: Path) -> None:
    assert persist.scan(tmp_path / "nope", FP) == []


def _read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every removal and creation fails as on a read-only filesystem (root ignores modes, so
    the test fails the calls themselves; tests/ops/test_faults_live.py mounts a real read-only directory)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")
    real_open = os.open

    def open_refusing_writes(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse()
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(os, "unlink", refuse)
    monkeypatch.setattr(os, "open", open_refusing_writes)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_read_only_directory_still_gives_the_saved_state_and_leaks_no_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    persist.save_all(tmp_path, FP, [rec("alice", 1.0, 5000), rec("bob", 2.0)], 10**6)
    saved = {s.key: s for s in persist.scan(tmp_path, FP)}
    _read_only(monkeypatch)
    before = _open_fds()
    for _ in range(20):  # a client retrying
        assert persist.load(saved[saved_key("alice")]) == rec("alice", 1.0, 5000)[4]
    assert _open_fds() == before
    assert saved[saved_key("alice")].path.exists()  # could not be consumed: harmless, matched by tokens
    assert {s.key for s in persist.scan(tmp_path, FP)} == set(saved)  # scanning does not fail either
    with pytest.raises(OSError):  # saving cannot work: the caller logs it (kv/store.save_sessions)
        persist.save_all(tmp_path, FP, [rec("carol", 1.0)], 10**6)
    assert _open_fds() == before


def test_a_damaged_file_on_a_read_only_directory_is_none_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    persist.save_all(tmp_path, FP, [rec("s", 1.0, 5000)], 10**6)
    (f,) = tmp_path.glob("*.kv")
    data = bytearray(f.read_bytes())
    data[-1] ^= 1  # only the checksum can tell
    f.write_bytes(bytes(data))
    (saved,) = persist.scan(tmp_path, FP)
    _read_only(monkeypatch)
    before = _open_fds()
    assert persist.load(saved) is None  # recomputed from its messages, never a 500
    assert _open_fds() == before
