"""Tests for appliance.config: precedence, sources, validation, describe(), `appliance config`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from appliance import cli
from appliance import config as config_mod
from appliance.config import FIELDS, Config, ConfigError, describe, load, parse_cpu_list
from appliance.documents.document import DocumentLimits


@pytest.fixture(autouse=True)
def no_system_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real /etc/appliance/appliance.toml or APPLIANCE_* variable must not leak in."""
    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", tmp_path / "absent" / "appliance.toml")
    for key in [k for k in os.environ if k.startswith("APPLIANCE_")]:
        monkeypatch.delenv(key)


def toml_file(tmp_path: Path, text: str, name: str = "appliance.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def config_error(excinfo: pytest.ExceptionInfo[ConfigError], key: str) -> str:
    """The message is one line and names the key."""
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    assert key in msg
    return msg


# -- defaults and precedence -----------------------------------------------------------
def test_defaults_with_nothing_given() -> None:
    cfg, sources = load(environ={})
    assert cfg == Config()
    assert sources == {name: "default" for name in FIELDS}


def test_config_is_frozen() -> None:
    cfg, _ = load(environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]


def test_flat_file_overrides_defaults(tmp_path: Path) -> None:
    path = toml_file(tmp_path, 'port = 9001\nhost = "127.0.0.1"\nqueue_timeout_s = 5\n')
    cfg, sources = load(config_file=path, environ={})
    assert (cfg.port, cfg.host, cfg.queue_timeout_s) == (9001, "127.0.0.1", 5.0)
    assert isinstance(cfg.queue_timeout_s, float)  # a TOML int is accepted for a float key
    assert sources["port"] == f"file {path}"
    assert sources["host"] == f"file {path}"
    assert sources["slots"] == "default"


def test_appliance_table_in_file(tmp_path: Path) -> None:
    path = toml_file(tmp_path, '[appliance]\nslots = 4\nlog_level = "debug"\n')
    cfg, sources = load(config_file=path, environ={})
    assert cfg.slots == 4 and cfg.log_level == "debug"
    assert sources["slots"] == f"file {path}"


def test_env_overrides_file(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "port = 9001\nslots = 4\n")
    cfg, sources = load(config_file=path, environ={"APPLIANCE_PORT": "9002", "PATH": "/bin"})
    assert cfg.port == 9002 and cfg.slots == 4
    assert sources["port"] == "env APPLIANCE_PORT"
    assert sources["slots"] == f"file {path}"


def test_cli_overrides_env_and_file(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "port = 9001\nslots = 4\nthreads = 2\n")
    env = {"APPLIANCE_PORT": "9002", "APPLIANCE_SLOTS": "6"}
    cfg, sources = load({"port": "9003", "slots": None}, config_file=path, environ=env)
    assert cfg.port == 9003  # CLI > env > file
    assert cfg.slots == 6  # a None CLI value means "not given"
    assert cfg.threads == 2
    assert sources["port"] == "command line"
    assert sources["slots"] == "env APPLIANCE_SLOTS"
    assert sources["threads"] == f"file {path}"
    assert sources["host"] == "default"


def test_cli_accepts_native_types() -> None:
    cfg, sources = load({"slots": 3, "queue_timeout_s": 2.5, "cpus": "0-1"}, environ={})
    assert (cfg.slots, cfg.queue_timeout_s, cfg.cpus) == (3, 2.5, "0-1")
    assert sources["slots"] == sources["queue_timeout_s"] == sources["cpus"] == "command line"


def test_env_text_is_parsed() -> None:
    env = {"APPLIANCE_SLOTS": "2", "APPLIANCE_GRACE_S": "1.5", "APPLIANCE_MODEL": "m.gguf"}
    cfg, _ = load(environ=env)
    assert (cfg.slots, cfg.grace_s, cfg.model) == (2, 1.5, "m.gguf")


def test_system_config_used_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system.toml"
    system.write_text("max_queue = 7\n")
    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", system)
    cfg, sources = load(environ={})
    assert cfg.max_queue == 7
    assert sources["max_queue"] == f"file {system}"


def test_explicit_file_replaces_system_config(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system.toml"
    system.write_text("max_queue = 7\n")
    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", system)
    path = toml_file(tmp_path, "slots = 2\n")
    cfg, _ = load(config_file=path, environ={})
    assert cfg.slots == 2 and cfg.max_queue == Config().max_queue


# -- unknown keys, files -----------------------------------------------------------------
def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "port = 1\nslotz = 3\n")
    with pytest.raises(ConfigError) as e:
        load(config_file=path, environ={})
    assert "'slotz'" in config_error(e, "slotz")


def test_unknown_key_in_appliance_table(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "[appliance]\nbogus = 1\n")
    with pytest.raises(ConfigError) as e:
        load(config_file=path, environ={})
    config_error(e, "bogus")


def test_unknown_table_beside_appliance_table(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "port = 1\n[appliance]\nslots = 2\n")
    with pytest.raises(ConfigError) as e:
        load(config_file=path, environ={})
    config_error(e, "appliance")


def test_unknown_env_key() -> None:
    with pytest.raises(ConfigError) as e:
        load(environ={"APPLIANCE_SLOTZ": "3"})
    msg = config_error(e, "APPLIANCE_SLOTZ")
    assert "slotz" in msg


def test_unrelated_env_ignored() -> None:
    cfg, _ = load(environ={"PORT": "1", "XAPPLIANCE_PORT": "2", "appliance_port": "3"})
    assert cfg.port == Config().port


def test_unknown_cli_key() -> None:
    with pytest.raises(ConfigError) as e:
        load({"nope": "1"}, environ={})
    config_error(e, "nope")


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as e:
        load(config_file=str(missing), environ={})
    config_error(e, str(missing))


def test_config_file_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(config_file=str(tmp_path), environ={})
    config_error(e, str(tmp_path))


@pytest.mark.parametrize("text", ["port = \n", "port 8080\n", "[appliance\nport = 1\n",
                                  'host = "x\n', "port = 1\nport = 2\n"])
def test_malformed_toml(tmp_path: Path, text: str) -> None:
    path = toml_file(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load(config_file=path, environ={})
    config_error(e, path)


def test_config_file_not_utf8(tmp_path: Path) -> None:
    # A binary or Latin-1 file is a malformed config, reported like any other.
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'host = "caf\xe9"\n')
    with pytest.raises(ConfigError) as e:
        load(config_file=str(path), environ={})
    config_error(e, str(path))


# -- types and values ------------------------------------------------------------------
@pytest.mark.parametrize(("line", "key"), [
    ('port = "8080"', "port"),  # TOML string for an int
    ("slots = true", "slots"),  # bool for an int
    ("slots = 2.0", "slots"),  # float for an int
    ("queue_timeout_s = true", "queue_timeout_s"),  # bool for a float
    ('queue_timeout_s = "5"', "queue_timeout_s"),
    ("host = 5", "host"),  # int for a string
    ("cpus = [0, 1]", "cpus"),
    ("port = {a = 1}", "port"),
])
def test_file_wrong_type(tmp_path: Path, line: str, key: str) -> None:
    path = toml_file(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as e:
        load(config_file=path, environ={})
    assert "expected" in config_error(e, f"'{key}'")


@pytest.mark.parametrize(("key", "raw"), [
    ("slots", "abc"), ("slots", "2.5"), ("slots", ""), ("port", "eighty"), ("grace_s", "soon"),
])
def test_env_wrong_type(key: str, raw: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(environ={f"APPLIANCE_{key.upper()}": raw})
    config_error(e, f"'{key}'")


@pytest.mark.parametrize(("key", "raw"),
                         [("slots", True), ("slots", 2.0), ("port", [1]), ("host", 1)])
def test_cli_wrong_native_type(key: str, raw: object) -> None:
    with pytest.raises(ConfigError) as e:
        load({key: raw}, environ={})
    config_error(e, f"'{key}'")


@pytest.mark.parametrize(("key", "raw"), [
    ("port", "70000"),
    ("port", "-1"),
    ("slots", "0"),
    ("slots", "-3"),
    ("ctx_per_slot", "0"),
    ("threads", "-1"),
    ("max_wait_ms", "-1"),
    ("queue_timeout_s", "0"),
    ("queue_timeout_s", "nan"),
    ("grace_s", "-0.5"),
    ("cpus", "abc"),
    ("cpus", "3-1"),
    ("cpus", "0-2,x"),
    ("log_level", "loud"),
    ("log_level", "INFO"),
    ("document_max_mb", "0"),
    ("document_max_pages", "0"),
    ("document_timeout_s", "0.5"),
    ("document_timeout_s", "nan"),
    ("document_workers", "0"),
    ("default_temperature", "2.5"),
    ("default_temperature", "-0.1"),
    ("default_temperature", "nan"),
    ("default_seed", "-2"),
])
def test_bad_values(key: str, raw: str) -> None:
    with pytest.raises(ConfigError) as e:
        load({key: raw}, environ={})
    config_error(e, f"'{key}'")
    with pytest.raises(ConfigError) as e:
        load(environ={f"APPLIANCE_{key.upper()}": raw})
    config_error(e, f"'{key}'")


@pytest.mark.parametrize(("key", "raw", "value"), [
    ("port", "0", 0), ("port", "65535", 65535), ("threads", "0", 0), ("max_queue", "0", 0),
    ("cpus", "", ""), ("cpus", "0-3,6", "0-3,6"), ("log_level", "warning", "warning"),
    ("document_timeout_s", "1", 1.0), ("document_max_mb", "1", 1),
])
def test_boundary_values_accepted(key: str, raw: str, value: object) -> None:
    cfg, _ = load({key: raw}, environ={})
    assert getattr(cfg, key) == value


def test_error_message_shows_bad_value() -> None:
    with pytest.raises(ConfigError) as e:
        load(environ={"APPLIANCE_PORT": "70000"})
    assert "70000" in config_error(e, "'port'")


def test_error_message_one_line_with_newline_in_value() -> None:
    with pytest.raises(ConfigError) as e:
        load(environ={"APPLIANCE_LOG_LEVEL": "info\ndebug"})
    config_error(e, "'log_level'")


# -- cross-field checks ------------------------------------------------------------------
@pytest.mark.parametrize(("cli_values", "key"), [
    ({"kv_tokens": "1000", "ctx_per_slot": "2048"}, "kv_tokens"),
    ({"batch_tokens": "4", "slots": "8"}, "batch_tokens"),
    ({"default_max_tokens": "4096", "max_tokens_limit": "2048"}, "default_max_tokens"),
    ({"ctx_per_slot": "32"}, "ctx_per_slot"),
])
def test_cross_field_checks(cli_values: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(cli_values, environ={})
    config_error(e, f"'{key}'")


def test_cross_field_equal_is_fine() -> None:
    cfg, _ = load({"kv_tokens": "2048", "ctx_per_slot": "2048", "batch_tokens": "8", "slots": "8",
                   "default_max_tokens": "100", "max_tokens_limit": "100"}, environ={})
    assert (cfg.kv_tokens, cfg.batch_tokens, cfg.default_max_tokens) == (2048, 8, 100)


def test_cross_field_across_sources(tmp_path: Path) -> None:
    # The check runs on the merged values: file sets one side, env the other.
    path = toml_file(tmp_path, "ctx_per_slot = 8192\n")
    with pytest.raises(ConfigError) as e:
        load(config_file=path, environ={"APPLIANCE_KV_TOKENS": "4096"})
    config_error(e, "'kv_tokens'")


# -- parse_cpu_list ----------------------------------------------------------------------
@pytest.mark.parametrize(("text", "cpus"), [
    ("", []),
    ("0", [0]),
    ("0-3", [0, 1, 2, 3]),
    ("0-3,6", [0, 1, 2, 3, 6]),
    ("0,2", [0, 2]),
    (" 1 , 3 ", [1, 3]),
    ("3,1,2-3", [1, 2, 3]),  # sorted and deduplicated
    ("5-5", [5]),
    ("0,,2,", [0, 2]),
])
def test_parse_cpu_list(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text",
                         ["abc", "3-1", "-1", "1-2-3", "0-x", "a-3", "1.5", "0 - 3", "1-", "0-,2"])
def test_parse_cpu_list_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


# -- describe ----------------------------------------------------------------------------
def test_describe_lists_every_field_with_source(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "slots = 4\n")
    cfg, sources = load({"port": "9003"}, config_file=path, environ={"APPLIANCE_THREADS": "2"})
    text = describe(cfg, sources)
    lines = text.splitlines()
    assert len(lines) == len(FIELDS)
    by_name = {line.split()[0]: line for line in lines}
    assert list(by_name) == list(FIELDS)
    for name, line in by_name.items():
        assert repr(getattr(cfg, name)) in line
        assert line.endswith("# " + sources[name])
    assert by_name["port"].endswith("# command line") and "9003" in by_name["port"]
    assert by_name["threads"].endswith("# env APPLIANCE_THREADS")
    assert by_name["slots"].endswith(f"# file {path}")
    assert by_name["host"].endswith("# default") and "'0.0.0.0'" in by_name["host"]


def test_describe_missing_source_is_default() -> None:
    text = describe(Config(), {})
    assert all(line.endswith("# default") for line in text.splitlines())


# -- the `appliance config` command ----------------------------------------------------
def output_line(text: str, name: str) -> str:
    [line] = [ln for ln in text.splitlines() if ln.split()[:1] == [name]]
    return line


def test_cli_config_shows_command_line_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "--slots", "3"]) == 0
    out = capsys.readouterr().out
    line = output_line(out, "slots")
    assert line.split()[1] == "3"
    assert "command line" in line
    assert output_line(out, "port").endswith("# default")


def test_cli_config_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "--slots", "zero"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err
    assert "slots" in err and "zero" in err


def test_cli_config_env(capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_PORT", "9000")
    assert cli.main(["config"]) == 0
    line = output_line(capsys.readouterr().out, "port")
    assert line.split()[1] == "9000"
    assert line.endswith("# env APPLIANCE_PORT")


def test_cli_config_file_env_and_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = toml_file(tmp_path, "port = 9001\nslots = 4\nthreads = 2\n")
    monkeypatch.setenv("APPLIANCE_SLOTS", "5")
    assert cli.main(["config", "--config", path, "--threads", "6", "--log-level", "debug"]) == 0
    out = capsys.readouterr().out
    assert output_line(out, "port").endswith(f"# file {path}")
    assert output_line(out, "slots").endswith("# env APPLIANCE_SLOTS")
    assert output_line(out, "threads").split()[1] == "6"
    assert output_line(out, "log_level").endswith("# command line")


def test_cli_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope.toml" in err


def test_ubatch_tokens_is_its_own_setting_at_most_batch_tokens() -> None:
    cfg, sources = load({"ubatch_tokens": "128"}, environ={})
    assert (cfg.ubatch_tokens, cfg.batch_tokens, sources["ubatch_tokens"]) == (128, 512, "command line")
    with pytest.raises(ConfigError) as e:
        load({"ubatch_tokens": "1024"}, environ={})
    assert "must be <= batch_tokens" in config_error(e, "ubatch_tokens")
    with pytest.raises(ConfigError) as e:
        load({"ubatch_tokens": "0"}, environ={})
    config_error(e, "ubatch_tokens")


def test_ubatch_tokens_reaches_the_context_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from appliance.model import llm
    from appliance.ops import engine as serve

    seen: list[llm.ContextSpec] = []
    monkeypatch.setattr(llm, "LLM", lambda path, spec: seen.append(spec))
    cfg, _ = load({"ubatch_tokens": "64", "batch_tokens": "256"}, environ={})
    engine = serve.build_engine(cfg, tmp_path / "m.gguf")
    engine._factory()
    assert (seen[0].n_batch, seen[0].n_ubatch) == (256, 64)


def test_a_small_batch_takes_the_default_ubatch_down_but_not_an_explicit_one() -> None:
    cfg, _ = load({"batch_tokens": "64", "slots": "8"}, environ={})
    assert cfg.ubatch_tokens == 64
    with pytest.raises(ConfigError, match="ubatch_tokens"):
        load({"batch_tokens": "64", "slots": "8", "ubatch_tokens": "128"}, environ={})


def test_llama_cpp_threads_spin_long_when_they_share_cores_briefly_when_not_and_the_environment_wins() -> None:
    from appliance.cpu import set_thread_waiting

    env: dict[str, str] = {}
    set_thread_waiting(env)
    assert env == {"GOMP_SPINCOUNT": "300000"}  # share_cores (the default) gives a busy core up
    env = {}
    set_thread_waiting(env, share_cores=False)
    assert env == {"GOMP_SPINCOUNT": "600"}
    for given in ({"OMP_WAIT_POLICY": "passive"}, {"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "0"}):
        for share in (True, False):
            env = dict(given)
            set_thread_waiting(env, share)
            assert env == given  # a drop-in wins


def test_document_settings_reach_the_reader() -> None:
    from appliance.ops.compose import document_reader

    cfg, _ = load({"document_max_mb": "3", "document_max_pages": "40", "document_timeout_s": "7",
                   "document_workers": "2"}, environ={})
    reader = document_reader(cfg)
    limits = reader.limits
    assert (limits.max_bytes, limits.max_pages, limits.wall_s, limits.cpu_s) == (3 * 2**20, 40, 7.0, 3)
    assert reader.workers == 2
    assert document_reader(Config()).limits == DocumentLimits()  # the defaults are the reader's own
