"""The state directory (`state_dir`) and its files: the one place that opens them, for the
saved KV sessions (engine/kv/persist.py), the usage table (usage/store.py) and whatever
keeps state next.

The directory is ours and private: a real directory (not a symlink) owned by this user,
mode 0700 (an existing one is tightened, with a log line). Its files are mode 0600 and
opened relative to the directory's descriptor without following symlinks, so a link
planted under one of our names, or the directory swapped for a link, is refused.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)
DIR_MODE = 0o700
FILE_MODE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under our name must not hang start-up (it is refused below).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_PRIVATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class StateDirError(OSError):
    """The state directory is not one we may use (a symlink, not a directory, not ours)."""


def open_dir(state_dir: Path, create: bool) -> int | None:
    """A descriptor of the state directory after checking it is ours: a real directory
    owned by this user, mode 0700 (tightened if it was looser). None if it does not exist
    and create is False. Raises StateDirError for a directory we must not use."""
    try:
        st = os.lstat(state_dir)
    except FileNotFoundError:
        if not create:
            return None
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(state_dir, DIR_MODE)  # umask only clears bits: 0700 stays 0700
        except FileExistsError:
            pass  # made meanwhile: checked below like any existing one
        st = os.lstat(state_dir)
    if stat.S_ISLNK(st.st_mode):
        raise StateDirError(f"state_dir {state_dir} is a symbolic link: refusing it (give the real directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"state_dir {state_dir} is not a directory: refusing it")
    try:
        fd = os.open(state_dir, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link since the lstat
            raise StateDirError(f"state_dir {state_dir} is not a directory or is a symbolic link: refusing it") from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise StateDirError(f"state_dir {state_dir} is owned by uid {st.st_uid}, not by this user "
                                f"(uid {os.geteuid()}): refusing it")
        mode = stat.S_IMODE(st.st_mode)
        if mode != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
            log.warning("state_dir %s had mode %04o: set to 0700 (saved sessions are private)", state_dir, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink(name: str, dir_fd: int) -> None:
    """Remove one of the directory's files, best effort: one already gone is no error, and
    on a read-only or failing disk (an SD card going bad, a remount) the file stays, which
    its caller must find harmless (a session file is matched by its tokens, and the next
    save replaces the directory's files), where raising here turned a read into a 500 and
    leaked the directory's descriptor."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("could not remove %s from the state directory: %s", name, e)


def new_file(name: str, dir_fd: int) -> int:
    """A descriptor, open for writing, of a file made under a fresh name (O_EXCL: never an
    existing file, never through a link), mode 0600 whatever the umask."""
    fd = os.open(name, _NEW_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        unlink(name, dir_fd)
        raise
    return fd


def open_file(name: str, dir_fd: int) -> int:
    """A descriptor, open for reading, of one of our files: not through a symlink, a regular
    file we own (ValueError otherwise)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("a symbolic link, not a session state file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ValueError("not a regular file of ours")
    os.set_blocking(fd, True)
    return fd


def private_file(state_dir: Path, name: str) -> Path:
    """Create (or check) the file `name` for a library that opens it by path itself (SQLite):
    a regular file of ours, mode 0600, in a 0700 directory of ours; never through a symbolic
    link. Returns its path."""
    fd = open_dir(state_dir, create=True)
    assert fd is not None
    try:
        try:
            file_fd = os.open(name, _PRIVATE_FLAGS, FILE_MODE, dir_fd=fd)
        except OSError as e:
            raise OSError(e.errno, f"{state_dir / name}: {e.strerror} (a symbolic link is refused)") from None
        try:
            st = os.fstat(file_fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{state_dir / name} is not a regular file: refusing it")
            if stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.fchmod(file_fd, FILE_MODE)
        finally:
            os.close(file_fd)
    finally:
        os.close(fd)
    return state_dir / name
