"""The settings grouped by the layer that reads them (appliance/config_groups.py): every key in
one group, group tables in the TOML file beside the flat keys, `appliance config` and
docs/SETTINGS.md by group, and the composition root's builders reading their groups only."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from appliance.config import FIELDS, Config, ConfigError, describe, load
from appliance.config_groups import GROUP_OF, GROUPS, markdown

ROOT = Path(__file__).resolve().parents[2]


def toml_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "appliance.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_every_key_is_in_exactly_one_group() -> None:
    listed = [key for _, keys in GROUPS.values() for key in keys]
    assert sorted(listed) == sorted(f.name for f in dataclasses.fields(Config))
    assert len(listed) == len(set(listed))


def test_fields_run_group_by_group() -> None:
    groups = [GROUP_OF[name] for name in FIELDS]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert runs == list(GROUPS)


@pytest.mark.parametrize("text", [
    "[engine]\nslots = 4\n[kv]\nkv_type = \"q8_0\"\n[library]\nlibrary = false\n",
    "[appliance]\nport = 9000\n[appliance.engine]\nslots = 4\n[appliance.kv]\nkv_type = \"q8_0\"\n"
    "[appliance.library]\nlibrary = false\n",
])
def test_group_tables_in_the_file(tmp_path: Path, text: str) -> None:
    path = toml_file(tmp_path, text)
    cfg, sources = load(config_file=path, environ={})
    assert (cfg.slots, cfg.kv_type, cfg.library) == (4, "q8_0", False)
    assert sources["slots"] == f"file {path}"


def test_flat_keys_and_tables_mix_and_system_prompts_stays_a_key(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "port = 9001\n[engine]\nslots = 4\n[system_prompts]\nhelp = \"Be brief.\"\n")
    cfg, _ = load(config_file=path, environ={})
    assert (cfg.port, cfg.slots, cfg.system_prompts) == (9001, 4, {"help": "Be brief."})


def test_a_key_in_another_groups_table_is_refused_with_its_group(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(config_file=toml_file(tmp_path, "[engine]\nkv_tokens = 8192\n"), environ={})
    assert "'kv_tokens' in [engine]" in str(e.value) and "[kv]" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load(config_file=toml_file(tmp_path, "[engine]\nslotz = 1\n"), environ={})
    assert "unknown key 'slotz' in [engine]" in str(e.value)


def test_a_key_given_flat_and_in_its_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(config_file=toml_file(tmp_path, "slots = 2\n[engine]\nslots = 4\n"), environ={})
    assert "'slots' given twice" in str(e.value)


def test_describe_names_each_keys_group() -> None:
    lines = describe(Config(), {}).splitlines()
    assert [line.split()[2] for line in lines] == [f"[{GROUP_OF[name]}]" for name in FIELDS]


def test_the_settings_doc_is_the_groups() -> None:
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                for f in dataclasses.fields(Config)}
    helps = {name: f.metadata["help"] for name, f in FIELDS.items()}
    doc = (ROOT / "docs" / "SETTINGS.md").read_text(encoding="utf-8")
    assert doc == markdown(defaults, helps), "regenerate docs/SETTINGS.md with config_groups.markdown"


# The composition root hands each layer its group: these builders read the groups named.
BUILDERS = {
    ("ops/engine.py", "build_engine"): {"engine", "kv", "server"},
    ("ops/compose.py", "compose"): {"server", "http", "kv"},
    ("ops/compose.py", "check_files"): {"server"},
    ("ops/compose.py", "keyring"): {"http"},
    ("ops/compose.py", "document_reader"): {"documents"},
    ("ops/compose.py", "people_store"): {"people", "server"},
    ("ops/compose.py", "accounting"): {"usage", "people", "server"},
    ("ops/compose.py", "request_bounds"): {"http", "engine"},
    ("ops/library.py", "library_reader"): {"documents"},
    ("ops/library.py", "build_library"): {"library", "server", "people"},  # database_url: the shared library
}


def _reads(path: Path) -> dict[str, set[str]]:
    """Each function taking a `cfg`: the keys it reads as cfg.<key>."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and any(a.arg == "cfg" for a in node.args.args):
            out[node.name] = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                              and isinstance(n.value, ast.Name) and n.value.id == "cfg"}
    return out


def test_each_builder_reads_its_groups_only() -> None:
    offenders, seen = [], set()
    for module in sorted({m for m, _ in BUILDERS}):
        for fn, keys in _reads(ROOT / "appliance" / module).items():
            seen.add((module, fn))
            allowed = BUILDERS.get((module, fn))
            if allowed is None:
                offenders.append(f"{module}:{fn} takes cfg and is not in BUILDERS")
                continue
            offenders += [f"{module}:{fn} reads {k} [{GROUP_OF.get(k)}]" for k in sorted(keys)
                          if k in GROUP_OF and GROUP_OF[k] not in allowed]
    assert not offenders, "\n".join(offenders)
    assert seen >= set(BUILDERS)


@pytest.mark.parametrize(("raw", "value"), [("false", False), ("off", False), ("0", False), ("true", True), ("on", True)])
def test_a_switch_reads_from_text(raw: str, value: bool) -> None:
    # The library switch: "false" from the environment was the truthy string 'false' (the library stayed on).
    assert load(environ={"APPLIANCE_LIBRARY": raw})[0].library is value
    assert load({"library": raw}, environ={})[0].library is value


def test_a_switch_is_a_toml_bool(tmp_path: Path) -> None:
    assert load(config_file=toml_file(tmp_path, "library = false\n"), environ={})[0].library is False
    with pytest.raises(ConfigError):
        load(config_file=toml_file(tmp_path, 'library = "maybe"\n'), environ={})
    with pytest.raises(ConfigError):
        load(environ={"APPLIANCE_LIBRARY": "maybe"})
