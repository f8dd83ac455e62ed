"""Official GGUF files from Hugging Face: which ones there are, and pull() to download one.

The only module that imports huggingface_hub (lazily, inside the functions that use it).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from appliance.model.gguf import ModelFileError, check_gguf, writable_dir

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

CONNECT_TIMEOUT_S = 5.0  # how long pull() waits for Hugging Face before calling us offline
_OFFLINE_HINT = ("This machine is offline: use the bundled model (scripts/setup.sh bundled-model) "
                 "or copy a GGUF into models/")


def official_file(quant: str) -> str:
    """The official repository's file name for a quantization type, e.g. q4_0."""
    if quant not in QUANTS:
        raise ModelFileError(f"no official file for quantization {quant!r}: choose one of {', '.join(QUANTS)}")
    return f"qwen2.5-0.5b-instruct-{quant}.gguf"


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
    writable_dir(models_dir)
    what = f"{repo}/{filename}" + (f"@{revision}" if revision else "")
    cached = _download(repo, filename, revision, what).resolve()  # the cache holds a symlink into blobs/; link the blob itself
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


def _offline() -> str | None:
    """Why to ask for the cached copy only (HF_HUB_OFFLINE, or the Hub does not answer), or None."""
    # Imported here: it is slow to import, and it reads HF_* variables at import time.
    import httpx2
    from huggingface_hub import constants, get_session

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    # hf_hub_download retries an unreachable Hub with backoff (~23 s even when DNS fails at once,
    # minutes when packets are dropped). Probe once with a short timeout and, if that fails,
    # ask it for the cached copy only.
    try:
        get_session().head(constants.ENDPOINT, timeout=CONNECT_TIMEOUT_S)
    except (httpx2.HTTPError, httpx2.InvalidURL) as e:
        return _reason(e)
    return None


def _download(repo: str, filename: str, revision: str | None, what: str) -> Path:
    """hf_hub_download (the cached copy only when offline), its errors as ModelFileErrors."""
    import httpx2
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    reason = _offline()
    local_only = reason is not None
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
            f"{problem} and {what} is not in the cache {constants.HF_HUB_CACHE}. {_OFFLINE_HINT}"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise ModelFileError(f"Hugging Face has no {what}: {_reason(e)}") from None
    except (HfHubHTTPError, httpx2.HTTPError) as e:
        raise ModelFileError(
            f"downloading {what} from Hugging Face failed: {_reason(e)}. {_OFFLINE_HINT}"
        ) from None
    except (OSError, ValueError) as e:  # disk full, cache not writable, invalid repo id
        raise ModelFileError(f"downloading {what} failed: {_reason(e)}") from None
    if local_only:
        log.warning("Hugging Face unreachable (%s): using the cached %s", reason, what)
    return cached
