"""The appliance starts with its runtime dependencies alone (issue 47): every module of the
package is imported in a child interpreter where every installed distribution that
pyproject.toml's `dependencies` do not bring in (the test and optional extras: pytest,
openai, playwright, psycopg, matplotlib, ...) cannot be imported, as on a box set up by the
README's first command. The suite's own extras once hid `import psycopg` on the way to
`appliance serve`, which then crashed on every new machine.

A module that needs an extra (store/postgres.py: psycopg; people/postgres.py, built on it) may
fail there, but only with a message naming the extra to install. .ci/fresh-start.sh checks the same from a real clean
clone and venv; this is its cheap twin inside the suite."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Modules whose whole job is an optional feature: the extra they need, and the words their
# failure must carry.
NEED_EXTRA = {"appliance.store.postgres": "postgres", "appliance.people.postgres": "postgres"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def runtime_distributions() -> set[str]:
    """pyproject's dependencies and, from the installed metadata, all that they require in turn
    (requirements behind an `extra ==` marker left out: nothing installs those extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [_name(r) for r in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r.replace('"', " ").replace("'", " ")]
    return seen


def blocked_modules() -> list[str]:
    """Top-level modules of installed distributions that the runtime dependencies do not bring."""
    runtime = runtime_distributions()
    blocked = set()
    for module, dists in md.packages_distributions().items():
        if module in sys.stdlib_module_names or module in ("appliance", "_distutils_hack", "pip", "setuptools"):
            continue
        if not any(d.lower().replace("_", "-") in runtime for d in dists):
            blocked.add(module)
    return sorted(blocked)


CHILD = textwrap.dedent("""
    import importlib, importlib.abc, json, pkgutil, sys, traceback
    blocked = set(json.loads(sys.argv[1]))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r} (not a runtime dependency)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    import appliance
    failed = {}
    # appliance/__main__.py runs the CLI when imported: appliance.cli stands for it.
    names = [m.name for m in pkgutil.walk_packages(appliance.__path__, "appliance.")
             if not m.name.endswith(".__main__")]
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: B036 - a module may exit at import; that is a failure too
            failed[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
    from appliance.config import ConfigError, load
    try:
        load(environ={"APPLIANCE_DATABASE_URL": "postgresql://x@db/y"})
        config_error = ""
    except ConfigError as e:
        config_error = str(e)
    print(json.dumps({"imported": len(names), "failed": failed, "config_error": config_error}))
""")


def test_every_module_imports_with_the_runtime_dependencies_alone() -> None:
    blocked = blocked_modules()
    # The check means something only if the test extras are really kept out.
    assert {"pytest", "openai", "psycopg"} <= set(blocked), blocked
    assert not {"starlette", "llama_cpp", "numpy", "uvicorn"} & set(blocked)
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(blocked)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["imported"] > 100
    failed = result["failed"]
    for module, extra in NEED_EXTRA.items():
        assert module in failed and f"the {extra} extra" in failed[module], failed.get(module)
    unexpected = {m: e for m, e in failed.items() if m not in NEED_EXTRA}
    assert not unexpected, "modules that need more than the runtime dependencies:\n" + "\n".join(
        f"{m}: {e}" for m, e in unexpected.items())
    # database_url set without psycopg: one clear line at start naming the extra, not a traceback.
    assert "database_url" in result["config_error"] and "'postgres' extra" in result["config_error"]


def test_no_import_anywhere_reaches_past_the_runtime_dependencies() -> None:
    """The imports inside functions too (run only when a feature is used, so the test above
    cannot reach them): each names a runtime dependency, unless its module needs an extra."""
    blocked = set(blocked_modules())
    found = []
    for path in sorted((ROOT / "appliance").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [(module, node.lineno, n) for n in names if n.split(".")[0] in blocked]
    assert {m for m, _, _ in found} <= set(NEED_EXTRA), found
    assert found, "store/postgres.py imports psycopg: the scan found nothing at all"
