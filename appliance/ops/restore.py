"""`appliance restore BACKUP --state-dir DIR`: a backup (ops/backup.py) back into a state
directory, after checking it whole. Refused: a file whose size or SHA-256 is not the
manifest's, a backup from a newer version (an owner's schema above what this code migrates
to, or a newer app version: this code could not read what it wrote), and a state directory
that holds anything already, unless --force. Stop the service first: a server writing into
the directory meanwhile would mix its files with the backup's.

Every restored file is 0600 in 0700 directories, as the server makes them (statedir.py);
the config and keys files go to --etc DIR when given (the keys 0600), else they stay in the
backup and the output says where.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from appliance import __version__
from appliance.config import Config
from appliance.ops.backup import FORMAT, MANIFEST, known_versions, sha256
from appliance.statedir import DIR_MODE, FILE_MODE


class Refused(Exception):
    """The backup is not restored; str() says why."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)[:3])


def manifest_of(backup: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((backup / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise Refused(f"{backup} is not a backup of this appliance (its {MANIFEST}: {e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Refused(f"{backup}: a backup format this version does not know ({manifest.get('format')!r})")
    return manifest


def check_versions(manifest: dict[str, Any]) -> None:
    """Refuse what a newer version wrote: this code cannot migrate a schema down."""
    known = known_versions()
    for owner, version in manifest.get("schemas", {}).items():
        if owner in known and int(version) > known[owner]:
            raise Refused(f"the backup's {owner} tables are at schema version {version}, newer than this "
                          f"version knows ({known[owner]}): restore it with the version that made it "
                          f"({manifest.get('app_version')}) or newer")
    if _version(str(manifest.get("app_version", ""))) > _version(__version__):
        raise Refused(f"the backup was made by appliance {manifest['app_version']}, newer than this one "
                      f"({__version__}): restore it with that version or newer")


def _relative(text: str) -> PurePosixPath:
    """A file's path in the backup: under state/ or etc/, never out of the directory."""
    path = PurePosixPath(text)
    if path.is_absolute() or ".." in path.parts or path.parts[0] not in ("state", "etc") or len(path.parts) < 2:
        raise Refused(f"the manifest names a file outside the backup: {text!r}")
    return path


def verify(backup: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is there with its size and SHA-256."""
    for entry in manifest.get("files", []):
        path = backup / _relative(entry["path"])
        if not path.is_file() or path.is_symlink():
            raise Refused(f"{path} is missing from the backup")
        if path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
            raise Refused(f"{path} is not the file the backup made (its size or SHA-256 differs): the backup is "
                          "damaged, restore another one")


def _write(src: Path, dst: Path, mode: int) -> None:
    """dst as a copy of src, complete or not at all (a temporary name, then a rename)."""
    dst.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.restoring")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
        os.fchmod(out.fileno(), mode)
        while block := f.read(1 << 20):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, dst)


def _target(state_dir: Path, force: bool) -> None:
    if state_dir.is_symlink() or (state_dir.exists() and not state_dir.is_dir()):
        raise Refused(f"{state_dir} is not a directory")
    if state_dir.is_dir() and any(state_dir.iterdir()) and not force:
        raise Refused(f"{state_dir} is not empty: restore into an empty directory, or give --force to replace "
                      "what the backup holds there (stop the service first)")
    state_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    state_dir.chmod(DIR_MODE)


def restore(backup: Path, state_dir: Path, force: bool = False, etc: Path | None = None) -> list[str]:
    """Check the backup, then restore it; the lines to print."""
    manifest = manifest_of(backup)
    check_versions(manifest)
    verify(backup, manifest)
    _target(state_dir, force)
    lines, left = [], []
    for entry in manifest.get("files", []):
        rel = _relative(entry["path"])
        if rel.parts[0] == "state":
            dst = state_dir.joinpath(*rel.parts[1:])
            for side in ("-wal", "-shm", "-journal"):  # an old database's side file would be read as the new one's
                dst.with_name(dst.name + side).unlink(missing_ok=True)
            _write(backup / rel, dst, FILE_MODE)
            lines.append(f"restored {dst}")
        elif etc is not None:
            dst = etc / rel.name.split("-", 1)[1]
            _write(backup / rel, dst, FILE_MODE if rel.name.startswith("keys-") else 0o644)
            lines.append(f"restored {dst}")
        else:
            left.append(str(backup / rel))
    if left:
        lines.append("not restored (give --etc DIR, or copy them by hand where the config names them): " + ", ".join(left))
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("backup", metavar="BACKUP", help="a backup's directory (appliance-backup-...)")
    p.add_argument("--force", action="store_true",
                   help="restore into a state directory that is not empty (its files the backup holds are replaced)")
    p.add_argument("--etc", metavar="DIR", default=None,
                   help="also restore the config and API keys files into DIR (e.g. /etc/appliance)")


def run(cfg: Config, args: argparse.Namespace) -> tuple[int, str]:
    """`appliance restore`: into --state-dir (or the config's state_dir); the exit code and what to print."""
    if not cfg.state_dir:
        return 2, "appliance: restore into which state directory? give --state-dir DIR"
    try:
        lines = restore(Path(args.backup), Path(cfg.state_dir), args.force, Path(args.etc) if args.etc else None)
    except Refused as e:
        return 1, f"appliance: not restored: {e}"
    return 0, "\n".join(lines)
