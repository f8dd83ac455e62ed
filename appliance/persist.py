"""Session KV state on disk across restarts: written at shutdown, read lazily on a session's
next turn. A file that is corrupt, truncated or from another model, llama.cpp version or KV
type is discarded with a log line, never trusted: its payload is checksummed, and only a
verified payload ever reaches llama.cpp.

File layout: MAGIC, a 4-byte little-endian header length, a JSON header, the payload.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
MAGIC = b"APPLIANCE-KV\x01"
SUFFIX = ".kv"


@dataclass(frozen=True, slots=True)
class Saved:
    session: str
    tokens: list[int]
    shared_len: int
    path: Path
    last_used_age_s: float  # how long it had been idle when saved


def file_for(state_dir: Path, session: str) -> Path:
    # Session ids come from clients: never use them as file names.
    return state_dir / (hashlib.sha256(session.encode()).hexdigest()[:32] + SUFFIX)


def save_all(state_dir: Path, fingerprint: str, records: Iterable[tuple[str, list[int], int, float, bytes]],
             max_bytes: int) -> int:
    """Write (session, tokens, shared_len, idle seconds, state) records, most recent first,
    until max_bytes. Replaces what the directory held before. Returns files written."""
    state_dir.mkdir(parents=True, exist_ok=True)
    for old in state_dir.glob("*" + SUFFIX):
        old.unlink(missing_ok=True)
    total = written = 0
    for session, tokens, shared_len, idle_s, data in sorted(records, key=lambda r: r[3]):
        header = json.dumps({"session": session, "tokens": tokens, "shared_len": shared_len,
                             "idle_s": idle_s, "fingerprint": fingerprint, "size": len(data),
                             "sha256": hashlib.sha256(data).hexdigest()}).encode()
        size = len(MAGIC) + 4 + len(header) + len(data)
        if total + size > max_bytes:
            break
        path = file_for(state_dir, session)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            f.write(data)
        os.replace(tmp, path)
        total += size
        written += 1
    return written


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
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
    """Headers of the usable files; others are deleted with a log line."""
    found: list[Saved] = []
    if not state_dir.is_dir():
        return found
    for path in sorted(state_dir.glob("*" + SUFFIX)):
        try:
            h, offset = _read_header(path)
            if h.get("fingerprint") != fingerprint:
                raise ValueError("saved by another model, llama.cpp version or KV type")
            if path.stat().st_size != offset + int(h["size"]):
                raise ValueError("truncated")
            tokens = [int(t) for t in h["tokens"]]
            found.append(Saved(str(h["session"]), tokens, int(h["shared_len"]), path, float(h["idle_s"])))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("discarding session state %s: %s", path.name, e)
            path.unlink(missing_ok=True)
    return found


def load(saved: Saved) -> bytes | None:
    """The verified payload of a saved session (the file is consumed), or None."""
    try:
        h, offset = _read_header(saved.path)
        with open(saved.path, "rb") as f:
            f.seek(offset)
            data = f.read()
        if len(data) != int(h["size"]) or hashlib.sha256(data).hexdigest() != h["sha256"]:
            raise ValueError("checksum mismatch (truncated or corrupt)")
        return data
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("discarding session state %s: %s", saved.path.name, e)
        return None
    finally:
        saved.path.unlink(missing_ok=True)
