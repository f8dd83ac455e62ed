"""A GGUF file checked cheaply (check_gguf), the error every model-file problem raises, and
the helpers that write model files into place."""

from __future__ import annotations

import os
import struct
from pathlib import Path

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what llama.cpp reads; v1 files predate it
GGUF_HEADER_SIZE = 24  # magic 4 + version u32 + tensor count u64 + metadata kv count u64 (bytes)
CHUNK = 1 << 20  # 1 MiB copy/hash chunks
_PULL = "delete it and run `appliance pull`"


class ModelFileError(Exception):
    """A model file problem; str() is one line saying what is wrong and what to run."""


def check_gguf(path: Path) -> None:
    """Cheap start-up check (stat + 8 bytes) that path looks like a GGUF llama.cpp can read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelFileError(
            f"{path} does not exist: run `appliance pull` or give a GGUF path"
        ) from None
    except OSError as e:
        raise ModelFileError(f"cannot read {path}: {e.strerror}") from None
    if not path.is_file():
        raise ModelFileError(f"{path} is not a regular file: give the path of a .gguf file")
    if st.st_size == 0:
        raise ModelFileError(f"{path} is empty: {_PULL}")
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelFileError(f"cannot read {path}: {e.strerror}") from None
    # A file shorter than the magic that matches it so far is a cut-off GGUF, not a foreign file.
    if not (head[:4] == GGUF_MAGIC or GGUF_MAGIC.startswith(head)):
        raise ModelFileError(f"{path} is not a GGUF file (starts with {head[:4]!r}): {_PULL}")
    if st.st_size < GGUF_HEADER_SIZE:
        raise ModelFileError(f"{path} is truncated ({st.st_size} bytes): {_PULL}")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in GGUF_VERSIONS:
        raise ModelFileError(
            f"{path} is GGUF version {version}, llama.cpp reads versions 2 and 3: {_PULL}"
        )


def writable_dir(models_dir: Path) -> None:
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create models directory {models_dir}: {e.strerror}") from None
    if not os.access(models_dir, os.W_OK):
        raise ModelFileError(
            f"models directory {models_dir} is not writable: fix its permissions or set models_dir"
        )


def fsync_dir(d: Path) -> None:
    # Makes the rename itself durable; best effort (not every filesystem allows it).
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
