"""statedir.py, the one opener of the state directory and its files, as whatever keeps state
next would use it: a private file made 0600 in a 0700 directory, a fresh name never an
existing file, and no symbolic link or FIFO followed (the KV files' and the usage table's own
tests check the same through persist.py and usage/store.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from appliance import statedir


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_private_file_is_0600_in_a_0700_directory_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state"
    old = os.umask(0)
    try:
        path = statedir.private_file(state, "next.db")
    finally:
        os.umask(old)
    assert path == state / "next.db" and path.is_file()
    assert (mode(state), mode(path)) == (0o700, 0o600)
    os.chmod(path, 0o644)
    assert mode(statedir.private_file(state, "next.db")) == 0o600  # an existing one is tightened


def test_a_link_or_a_fifo_under_a_private_name_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "linked.db").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="symbolic link"):
        statedir.private_file(state, "linked.db")
    assert not (tmp_path / "elsewhere").exists()
    os.mkfifo(state / "fifo.db")
    with pytest.raises(OSError, match="not a regular file"):
        statedir.private_file(state, "fifo.db")  # and no hang: opened non-blocking


def test_a_new_file_takes_a_fresh_name_only_and_reads_back_through_open_file(tmp_path: Path) -> None:
    fd = statedir.open_dir(tmp_path / "state", create=True)
    assert fd is not None
    try:
        old = os.umask(0)
        try:
            wfd = statedir.new_file("f", fd)
        finally:
            os.umask(old)
        with os.fdopen(wfd, "wb") as f:
            f.write(b"kept")
        assert mode(tmp_path / "state" / "f") == 0o600
        with pytest.raises(FileExistsError):
            statedir.new_file("f", fd)
        with os.fdopen(statedir.open_file("f", fd), "rb") as f:
            assert f.read() == b"kept"
        os.symlink("f", "g", dir_fd=fd)
        with pytest.raises(ValueError, match="symbolic link"):
            statedir.open_file("g", fd)
        statedir.unlink("f", fd)
        statedir.unlink("f", fd)  # already gone: no error
        assert sorted(os.listdir(fd)) == ["g"]
    finally:
        os.close(fd)


def test_no_directory_is_made_unless_asked(tmp_path: Path) -> None:
    assert statedir.open_dir(tmp_path / "nope", create=False) is None
    assert not (tmp_path / "nope").exists()
