"""Session KV state on disk across restarts: written at shutdown, read lazily on a session's
next turn. A file that is corrupt, truncated or from another model, llama.cpp version or KV
type is discarded with a log line, never trusted: its payload is checksummed, and only a
verified payload ever reaches llama.cpp.

Session ids are bearer secrets, so a file holds none: it is named by, and its header
carries, only a digest of the id (`names.saved_key`), which is what a session is matched
by after a restart. The directory is ours and private (statedir.py: a real directory owned
by this user, mode 0700; files mode 0600, opened relative to it without following symlinks);
a file is written to a fresh temporary name (O_EXCL), fsynced, renamed into place, and the
directory fsynced after.
Temporary files left by an interrupted save, and files of an older format (which carried
raw ids), are removed at start.

File layout: MAGIC, a 4-byte little-endian header length, a JSON header, the payload.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import re
import secrets
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.statedir import new_file, open_dir, open_file
from appliance.statedir import unlink as _unlink

log = logging.getLogger(__name__)
FAMILY = b"APPLIANCE-KV"  # every version starts with this; one byte of version follows
MAGIC = FAMILY + b"\x02"  # 2: digests instead of raw session ids
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
_KEY = re.compile(r"[0-9a-f]{64}")
# Test-only (faults.py, APPLIANCE_FAULT=save-slow): called with a session file's temporary
# name once its bytes are written and fsynced, before its rename. None in production.
before_rename: Callable[[str], None] | None = None


class _OldFormat(ValueError):
    def __init__(self) -> None:
        super().__init__("an older file format")


@dataclass(frozen=True, slots=True)
class Saved:
    key: str  # names.saved_key(session): the only trace of the session's id
    tokens: list[int]
    shared_len: int
    path: Path
    last_used_age_s: float  # how long it had been idle when saved


def file_name(key: str) -> str:
    return key[:32] + SUFFIX


def save_all(state_dir: Path, fingerprint: str, records: Iterable[tuple[str, list[int], int, float, bytes]],
             max_bytes: int, deadline: float = math.inf) -> int:
    """Write (key, tokens, shared_len, idle seconds, state) records, most recent first,
    until max_bytes or the `deadline` (time.monotonic()); key is names.saved_key(session),
    never the id. Replaces what the directory held before. Returns files written."""
    fd = open_dir(state_dir, create=True)
    assert fd is not None
    try:
        for old in os.listdir(fd):
            if old.endswith((SUFFIX, TMP_SUFFIX)):
                _unlink(old, fd)
        total = written = 0
        for key, tokens, shared_len, idle_s, data in sorted(records, key=lambda r: r[3]):
            if not _KEY.fullmatch(key):
                raise ValueError("a session file is named by a sha256 hex digest, not by a session id")
            header = json.dumps({"key": key, "tokens": tokens, "shared_len": shared_len,
                                 "idle_s": idle_s, "fingerprint": fingerprint, "size": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest()}).encode()
            size = len(MAGIC) + 4 + len(header) + len(data)
            if total + size > max_bytes:
                break
            if time.monotonic() > deadline:
                log.warning("saving sessions ran out of time after %d files (%d MiB); the older ones are not kept",
                            written, total >> 20)
                break
            name = file_name(key)
            tmp = f".{name}.{secrets.token_hex(6)}{TMP_SUFFIX}"
            wfd = new_file(tmp, fd)
            try:
                with os.fdopen(wfd, "wb") as f:
                    f.write(MAGIC + struct.pack("<I", len(header)) + header)
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if before_rename is not None:
                    before_rename(tmp)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                _unlink(tmp, fd)
                raise
            total += size
            written += 1
        os.fsync(fd)  # the renames and removals themselves
        return written
    finally:
        os.close(fd)


def _read_header(f: Any) -> tuple[dict[str, Any], int]:
    head = f.read(len(MAGIC) + 4)
    if len(head) >= len(FAMILY) + 1 and head.startswith(FAMILY) and not head.startswith(MAGIC):
        raise _OldFormat
    if len(head) < len(MAGIC) + 4 or not head.startswith(MAGIC):
        raise ValueError("not a session state file")
    (n,) = struct.unpack("<I", head[len(MAGIC):])
    if n > 64 * 2**20:
        raise ValueError("header too large")
    header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("bad header")
    return header, len(MAGIC) + 4 + n


def scan(state_dir: Path, fingerprint: str) -> list[Saved]:
    """Headers of the usable files; others are deleted with a log line, as are temporary
    files of an interrupted save and files of an older format. Raises StateDirError (an
    OSError) for a directory we must not use."""
    found: list[Saved] = []
    fd = open_dir(state_dir, create=False)
    if fd is None:
        return found
    try:
        names = sorted(os.listdir(fd))
        tmps = [n for n in names if n.endswith(TMP_SUFFIX)]
        for name in tmps:
            _unlink(name, fd)
        if tmps:
            log.warning("removed %d temporary session files left by an interrupted save in %s", len(tmps), state_dir)
        old = 0
        for name in names:
            if not name.endswith(SUFFIX):
                continue
            try:
                with os.fdopen(open_file(name, fd), "rb") as f:
                    h, offset = _read_header(f)
                    size = os.fstat(f.fileno()).st_size
                if h.get("fingerprint") != fingerprint:
                    raise ValueError("saved by another model, llama.cpp version or KV type")
                if size != offset + int(h["size"]):
                    raise ValueError("truncated")
                key = h["key"]
                if not isinstance(key, str) or not _KEY.fullmatch(key) or file_name(key) != name:
                    raise ValueError("its name does not match its session digest")
                tokens = [int(t) for t in h["tokens"]]
                found.append(Saved(key, tokens, int(h["shared_len"]), state_dir / name, float(h["idle_s"])))
            except _OldFormat:
                old += 1
                _unlink(name, fd)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("discarding session state %s: %s", name, e)
                _unlink(name, fd)
        if old:
            log.warning("discarded %d session files of an older format in %s (they held raw session ids)",
                        old, state_dir)
    finally:
        os.close(fd)
    return found


def load(saved: Saved) -> bytes | None:
    """The verified payload of a saved session (the file is consumed), or None."""
    fd = None
    try:
        fd = open_dir(saved.path.parent, create=False)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "the state directory is gone")
        with os.fdopen(open_file(saved.path.name, fd), "rb") as f:
            h, _ = _read_header(f)
            data = f.read()
        if h.get("key") != saved.key:
            raise ValueError("replaced by another session's file")
        if len(data) != int(h["size"]) or hashlib.sha256(data).hexdigest() != h["sha256"]:
            raise ValueError("checksum mismatch (truncated or corrupt)")
        return data
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("discarding session state %s: %s", saved.path.name, e)
        return None
    finally:
        if fd is not None:
            try:
                _unlink(saved.path.name, fd)
            finally:
                os.close(fd)
