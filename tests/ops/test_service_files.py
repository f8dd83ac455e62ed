"""The systemd unit, the install/uninstall scripts and the default config they write.

Runs anywhere (no systemd as PID 1 needed): the unit is checked with `systemd-analyze` when
it is installed and by parsing it always. The scripts run either in modes that touch
nothing (--help, --print-config, --print-unit, refused arguments, non-root) or, as root,
with --root into a scratch directory tree, with every command that could touch this
system behind a logging shim that refuses calls not aimed at the tree.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance import config as config_mod

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "appliance.service"
INSTALL = ROOT / "scripts" / "install-service.sh"
UNINSTALL = ROOT / "scripts" / "uninstall-service.sh"
SETUP = ROOT / "scripts" / "setup.sh"
SCRIPTS = [INSTALL, UNINSTALL, SETUP]
# CI's own scripts: linted like the others; they take no arguments (none is run here: .ci/run
# is the whole suite, and fresh-start.sh serves the real model from a clean clone).
CI_SCRIPTS = [ROOT / ".ci" / "fresh-start.sh", ROOT / ".ci" / "run"]
PREFIX = "/opt/appliance"
STATE = "/var/lib/appliance"

# Every directive the unit uses, spelled right: the fallback check when systemd-analyze is
# not installed (it would flag unknown keys itself).
KNOWN = {
    "Unit": {"Description", "Documentation", "After", "Wants", "StartLimitIntervalSec",
             "StartLimitBurst"},
    "Service": {
        "Type", "NotifyAccess", "User", "Group", "ExecStart", "ExecReload", "StateDirectory",
        "StateDirectoryMode", "ConfigurationDirectory", "WorkingDirectory", "Environment", "KillSignal",
        "TimeoutStartSec", "WatchdogSec", "TimeoutStopSec", "MemoryHigh", "MemoryMax", "Restart",
        "RestartSec", "RestartPreventExitStatus", "LimitNOFILE",
        "UMask", "NoNewPrivileges", "CapabilityBoundingSet", "AmbientCapabilities",
        "ProtectSystem", "ReadWritePaths", "ProtectHome", "PrivateTmp", "PrivateDevices",
        "PrivateMounts", "ProtectProc", "ProtectKernelTunables", "ProtectKernelModules",
        "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname",
        "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID", "LockPersonality",
        "RemoveIPC", "RestrictAddressFamilies", "SystemCallArchitectures", "SystemCallFilter",
        "SystemCallErrorNumber", "MemoryDenyWriteExecute",
    },
    "Install": {"WantedBy"},
}


Unit = dict[str, dict[str, list[str]]]  # section -> key -> values in order


def parse_unit(text: str) -> Unit:
    """systemd's syntax: [Section], Key=Value, repeatable keys, # and ; comments."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"line {n}: continuation lines are not expected"
        if m := re.fullmatch(r"\[([A-Za-z]+)\]", line):
            current = sections.setdefault(m[1], {})
            continue
        key, eq, value = line.partition("=")
        assert eq and current is not None, f"line {n} is not Key=Value in a section: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: Unit, section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values is not None, f"[{section}] {key}= missing"
    assert len(values) == 1, f"[{section}] {key}= given {len(values)} times"
    return values[0]


def run(*args: str | Path, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, **kw)


def install_output(*args: str) -> str:
    r = run("bash", INSTALL, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def test_unit_hardening_and_paths(unit: Unit) -> None:
    for section, keys in unit.items():
        unknown = set(keys) - KNOWN.get(section, set())
        assert not unknown, f"[{section}] unexpected directives {sorted(unknown)}"
    s = "Service"
    expected = {
        "Type": "notify", "NotifyAccess": "main", "User": "appliance", "Group": "appliance",
        "ExecStart": f"{PREFIX}/.venv/bin/appliance serve",
        "StateDirectory": "appliance", "ConfigurationDirectory": "appliance",
        "WorkingDirectory": STATE, "ReadWritePaths": STATE,
        "KillSignal": "SIGTERM", "Restart": "on-failure", "RestartSec": "5",
        "UMask": "0077", "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "", "AmbientCapabilities": "",
        "ProtectSystem": "strict", "ProtectHome": "true",
        "PrivateTmp": "yes", "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes", "ProtectClock": "yes", "ProtectHostname": "yes",
        "RestrictNamespaces": "yes", "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes", "SystemCallArchitectures": "native",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        # Decided on evidence, see test_ctypes_callbacks_survive_memory_deny_write_execute.
        "MemoryDenyWriteExecute": "yes",
    }
    for key, value in expected.items():
        assert one(unit, s, key) == value, key
    assert unit[s]["SystemCallFilter"][0] == "@system-service"
    # @resources (inside @system-service) holds sched_setaffinity, which CPU pinning needs.
    assert not any("@resources" in f and f.startswith("~") for f in unit[s]["SystemCallFilter"])
    assert int(one(unit, s, "LimitNOFILE")) >= 4096
    env = dict(e.split("=", 1) for e in unit[s]["Environment"])
    assert env["PYTHONUNBUFFERED"] == "1"
    # StateDirectory=appliance is /var/lib/appliance: cwd, the writable path and the models.
    assert env["APPLIANCE_MODELS_DIR"] == f"{STATE}/models"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_unit_stop_timeout_covers_drain_and_saving(unit: Unit) -> None:
    # appliance/ops/serve.py: drain up to grace_s, then at most 5 s for what is left, then
    # sessions saved for at most save_timeout_s; a few seconds to unload and exit.
    cfg = config_mod.Config()
    assert float(one(unit, "Service", "TimeoutStopSec")) >= cfg.grace_s + 5 + cfg.save_timeout_s + 5


def test_unit_watchdog_and_start_timeouts(unit: Unit) -> None:
    from appliance.ops.notify import Notifier, Watchdog

    watchdog_s = float(one(unit, "Service", "WatchdogSec"))
    # The app pings every WatchdogSec/4 (at most 1 s apart) while its engine makes progress.
    dog = Watchdog(Notifier("/run/systemd/notify", watchdog_s), lambda: None, lambda: True)
    assert dog.tick_s <= watchdog_s / 4
    # A hang is restarted within stall_s + WatchdogSec; legitimate steps (~2 s here, an
    # estimated 15-20 s on a Pi 4) stay well inside stall_s.
    assert 10 <= watchdog_s and config_mod.Config().stall_s + watchdog_s <= 120
    # Loading the model from a slow SD card must not count as a failed start.
    assert float(one(unit, "Service", "TimeoutStartSec")) >= 120
    # notify.py sends through an AF_UNIX datagram socket: the unit must allow the family.
    assert "AF_UNIX" in one(unit, "Service", "RestrictAddressFamilies").split()


def test_unit_memory_limits_match_the_tuned_plan(unit: Unit) -> None:
    from appliance.ops.tune import MEM_SHARE

    high = float(one(unit, "Service", "MemoryHigh").rstrip("%"))
    top = float(one(unit, "Service", "MemoryMax").rstrip("%"))
    # tune plans the appliance's memory for MEM_SHARE of the machine: reclaim (MemoryHigh)
    # starts only beyond that plan, and the hard limit beyond that.
    assert MEM_SHARE * 100 < high < top <= 100


def test_exec_start_is_the_console_script_the_venv_installs(unit: Unit) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    binary, command = one(unit, "Service", "ExecStart").split()
    assert Path(binary).name in scripts and command == "serve"
    assert subprocess.run([sys.executable, "-m", "appliance", command, "--help"],
                          capture_output=True, cwd=ROOT).returncode == 0


def test_install_script_uses_the_unit_paths() -> None:
    # Default prefix: installed verbatim, so the unit's /opt/appliance is where the venv goes.
    assert install_output("--print-unit") == UNIT.read_text(encoding="utf-8")
    moved = parse_unit(install_output("--prefix", "/srv/llm/", "--print-unit"))
    assert one(moved, "Service", "ExecStart") == "/srv/llm/.venv/bin/appliance serve"
    assert PREFIX not in install_output("--prefix", "/srv/llm", "--print-unit")
    text = INSTALL.read_text(encoding="utf-8")
    assert f"prefix={PREFIX}" in text and f"state={STATE}" in text
    assert '"$dprefix/scripts/setup.sh" bundled-model' in text and "dprefix=$root$prefix" in text
    assert re.search(r"useradd .*--system", text) and "/usr/sbin/nologin" in text
    assert f"prefix={PREFIX}" in UNINSTALL.read_text(encoding="utf-8")


def _unit_installed_under(tmp_path: Path) -> Path:
    """The unit as install-service.sh writes it for a prefix that exists, so that
    systemd-analyze can check ExecStart points to an executable."""
    prefix = tmp_path / "prefix"
    exe = prefix / ".venv" / "bin" / "appliance"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    # The script refuses a prefix in /tmp (the service has a private /tmp), so ask it for a
    # stand-in prefix and move that to the temporary one.
    text = install_output("--prefix", "/srv/stand-in", "--print-unit")
    assert PREFIX not in text and "/srv/stand-in/.venv/bin/appliance" in text
    path = tmp_path / "appliance.service"
    path.write_text(text.replace("/srv/stand-in", str(prefix)))
    return path


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        # No systemd tools here: the spelling check in test_unit_hardening_and_paths and the
        # structural parse are all we can do; make sure they ran on this very text.
        parse_unit(_unit_installed_under(tmp_path).read_text())
        return
    path = _unit_installed_under(tmp_path)
    r = run(analyze, "verify", "--man=no", path)
    # verify exits 0 even for unknown keys or bad values; it only warns, so demand silence.
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr + r.stdout
    # The hardening as systemd scores it (0 = locked down, 10 = unprotected).
    r = run(analyze, "security", "--offline=yes", "--no-pager", path)
    assert r.returncode == 0, r.stderr
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
    assert m and float(m[1]) <= 2.0, r.stdout[-2000:]
    # The pristine unit differs only in the prefix; systemd must reject nothing else in it.
    r = run(analyze, "verify", "--man=no", UNIT)
    missing_exe = f"Command {PREFIX}/.venv/bin/appliance is not executable"
    problems = [ln for ln in (r.stderr + r.stdout).splitlines()
                if ln.strip() and missing_exe not in ln]
    assert not problems, problems


# ---- install-service.sh --root: a real install into a scratch tree, twice ----

SYSTEM_PYTHON = Path("/usr/bin/python3")  # the installer's default: the service's Python

# Stand-in for scripts/setup.sh in the scratch checkout (the real one is tests/ops/test_setup.py's):
# a venv without packages whose `appliance` is the installed copy, as `pip install -e` makes it.
FAKE_SETUP = """#!/usr/bin/env bash
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
echo "setup.sh $* PYTHON=$PYTHON" >> "$SHIM_LOG"
if [ ! -x "$root/.venv/bin/python" ]; then
  "$PYTHON" -m venv --without-pip "$root/.venv"
  site=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  printf '%s\\n' "$root" $TEST_SITE_PACKAGES > "$site/appliance-checkout.pth"
  printf '#!%s\\nfrom appliance.cli import main\\nmain()\\n' "$root/.venv/bin/python" \\
    > "$root/.venv/bin/appliance"
  chmod 755 "$root/.venv/bin/appliance"
fi
"""

# Logs each call; lets through only calls aimed at the tree, so a bug cannot touch this system.
SHIM = """#!/bin/sh
echo "{name} $*" >> "$SHIM_LOG"
case " $* " in
  *" {must} "*) exec {real} "$@" ;;
esac
echo "shim: refused {name} $* (not aimed at $TREE)" >&2
exit 97
"""

# The check as the service user, run as root here (pytest's directories are private).
SETPRIV_SHIM = """#!/bin/sh
echo "setpriv $*" >> "$SHIM_LOG"
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""


def manifest(tree: Path) -> dict[str, tuple]:
    """Every path under tree: type, mode, owner and content (hash or link target)."""
    out: dict[str, tuple] = {}
    for path in sorted(tree.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            what: str = "link " + os.readlink(path)
        elif path.is_dir():
            what = "dir"
        else:
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        out[str(path.relative_to(tree))] = (what, oct(st.st_mode), st.st_uid, st.st_gid)
    return out


class Tree:
    """A scratch system tree, a scratch checkout and a PATH of shims."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "tree"
        etc = self.path / "etc"
        etc.mkdir(parents=True)
        (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        (etc / "group").write_text("root:x:0:\n")
        for name, line in (("shadow", "root:*:19000:0:99999:7:::\n"), ("gshadow", "root:*::\n")):
            (etc / name).write_text(line)
            (etc / name).chmod(0o640)
        # systemd's own units, as in any system tree, so that `systemd-analyze --root` can
        # resolve multi-user.target and the default dependencies.
        shutil.copytree("/usr/lib/systemd/system", self.path / "usr/lib/systemd/system",
                        symlinks=True)
        # ExecReload's /bin/kill (procps), present on every Debian system.
        (self.path / "bin").mkdir()
        shutil.copy2("/bin/kill", self.path / "bin" / "kill")
        # A model already in the state directory (no 470 MiB assembly here).
        models = self.path / STATE.lstrip("/") / "models"
        models.mkdir(parents=True)
        (models / "tiny.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # header only

        self.repo = tmp / "checkout"
        shutil.copytree(ROOT, self.repo, ignore=shutil.ignore_patterns(
            ".git", ".venv", "models", "state", "__pycache__", "*.egg-info", ".pytest_cache"))
        (self.repo / "scripts" / "setup.sh").write_text(FAKE_SETUP)

        self.log = tmp / "calls.log"
        shims = tmp / "shims"
        shims.mkdir()
        sbin = "/usr/sbin:/sbin:/usr/bin:/bin"
        for name, must in (("useradd", f"--prefix {self.path}"), ("userdel", f"--prefix {self.path}"),
                           ("groupdel", f"--prefix {self.path}"), ("systemctl", f"--root={self.path}")):
            real = shutil.which(name, path=sbin)
            assert real, f"{name} is needed for this test"
            (shims / name).write_text(SHIM.format(name=name, must=must, real=real))
        for name in ("runuser", "groupadd", "usermod", "chown", "su", "sudo"):
            (shims / name).write_text(SHIM.format(name=name, must="never-allowed", real="false"))
        (shims / "setpriv").write_text(SETPRIV_SHIM)
        for shim in shims.iterdir():
            shim.chmod(0o755)
        site = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        self.env.update(PATH=f"{shims}:{os.environ['PATH']}", SHIM_LOG=str(self.log),
                        TREE=str(self.path), PYTHON=str(SYSTEM_PYTHON),
                        TEST_SITE_PACKAGES=" ".join(dict.fromkeys(site)))

    def run(self, script: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(self.repo / "scripts" / script), "--root",
                               str(self.path), *args],
                              env=self.env, capture_output=True, text=True, timeout=120)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.mark.skipif(os.geteuid() != 0, reason="installs into a scratch tree as root (chown)")
def test_install_with_root_twice_changes_nothing_and_systemd_accepts_the_unit(
        tmp_path: Path) -> None:
    analyze, systemctl = shutil.which("systemd-analyze"), shutil.which("systemctl")
    if analyze is None or systemctl is None:
        pytest.skip("systemd-analyze/systemctl not installed: apt-get install systemd "
                    "(scripts/setup.sh does so as root for the test extras)")
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} missing: the installer builds the service's venv with it")
    host_users = Path("/etc/passwd").read_text()
    host_unit = Path("/etc/systemd/system/appliance.service").exists()
    tree = Tree(tmp_path)
    t = tree.path

    r = tree.run("install-service.sh")
    assert r.returncode == 0, r.stderr
    assert "created system user appliance" in r.stderr
    assert "listening on 0.0.0.0:8080" in r.stderr, "the check ran on the tree's configuration"
    users = [ln for ln in (t / "etc/passwd").read_text().splitlines() if ln.startswith("appliance:")]
    assert len(users) == 1 and users[0].endswith(f":{STATE}:/usr/sbin/nologin"), users
    uid, gid = map(int, users[0].split(":")[2:4])
    state = t / STATE.lstrip("/")
    assert (state.stat().st_uid, state.stat().st_gid, oct(state.stat().st_mode & 0o777)) \
        == (uid, gid, "0o750")
    unit = t / "etc/systemd/system/appliance.service"
    assert unit.read_text() == UNIT.read_text(encoding="utf-8")
    assert os.readlink(t / "etc/systemd/system/multi-user.target.wants/appliance.service") \
        == "/etc/systemd/system/appliance.service"
    # The daily backup, installed and its timer enabled (--no-backup: installed only).
    assert (t / "etc/systemd/system/appliance-backup.service").is_file()
    assert os.readlink(t / "etc/systemd/system/timers.target.wants/appliance-backup.timer") \
        == "/etc/systemd/system/appliance-backup.timer"
    assert (t / PREFIX.lstrip("/") / "appliance" / "__pycache__").is_dir()
    assert os.access(t / PREFIX.lstrip("/") / ".venv/bin/appliance", os.X_OK)

    # The unit as installed: systemd finds nothing to say (ExecStart resolved in the tree).
    r = run(analyze, "verify", f"--root={t}", "--man=no", "appliance.service")
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr

    # An administrator's changes and the service's state survive an upgrade...
    config = t / "etc/appliance/appliance.toml"
    config.write_text(config.read_text() + "port = 9000\n")
    (state / "sessions").mkdir()
    (state / "sessions" / "abc.bin").write_bytes(b"kv")
    before = manifest(t)
    calls = len(tree.calls())
    # ...and a second run with nothing new changes no file.
    r = tree.run("install-service.sh")
    assert r.returncode == 0, r.stderr
    assert "user appliance exists" in r.stderr and "keeping" in r.stderr
    assert "listening on 0.0.0.0:9000" in r.stderr
    after = manifest(t)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, changed
    second = tree.calls()[calls:]
    assert not [c for c in second if c.startswith("useradd")], second
    assert any(c.startswith("setpriv --reuid=") for c in second), second

    # Uninstall keeps the state, the configuration and the user; --purge removes them.
    r = tree.run("uninstall-service.sh")
    assert r.returncode == 0, r.stderr
    assert not unit.exists() and not (t / PREFIX.lstrip("/")).exists()
    assert not (t / "etc/systemd/system/multi-user.target.wants/appliance.service").exists()
    assert not [p.name for p in (t / "etc/systemd/system").rglob("appliance-backup*")]
    assert config.exists() and (state / "sessions" / "abc.bin").exists()
    r = tree.run("uninstall-service.sh", "--purge")
    assert r.returncode == 0, r.stderr
    assert not state.exists() and not config.parent.exists()
    assert "appliance:" not in (t / "etc/passwd").read_text()
    assert "appliance:" not in (t / "etc/group").read_text()

    refused = [c for c in tree.calls() if c.split()[0] in ("runuser", "chown", "su", "sudo")]
    assert not refused, refused
    # This system was not touched.
    assert Path("/etc/passwd").read_text() == host_users
    assert Path("/etc/systemd/system/appliance.service").exists() == host_unit


def test_install_root_must_be_a_system_tree(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the installer checks --root only as root")
    r = run("bash", INSTALL, "--root", tmp_path, "--no-start")
    assert r.returncode == 1 and "etc/passwd" in r.stderr, r.stderr
    r = run("bash", INSTALL, "--root", "relative/tree")
    assert r.returncode == 1 and "--root must be an absolute path" in r.stderr, r.stderr


def test_scripts_are_valid_bash() -> None:
    for script in SCRIPTS + CI_SCRIPTS:
        r = run("bash", "-n", script)
        assert r.returncode == 0, f"{script.name}: {r.stderr}"
        assert script.read_text().startswith("#!/usr/bin/env bash\n")
        assert "set -euo pipefail" in script.read_text()
        assert os.access(script, os.X_OK), f"{script.name} is not executable"
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        r = run(shellcheck, "-S", "warning", *SCRIPTS, *CI_SCRIPTS)
        assert r.returncode == 0, r.stdout + r.stderr


def test_help_exits_zero() -> None:
    r = run("bash", INSTALL, "--help")
    assert r.returncode == 0, r.stderr
    assert "--no-start" in r.stdout and "--prefix" in r.stdout
    r = run("bash", UNINSTALL, "--help")
    assert r.returncode == 0, r.stderr
    assert "--purge" in r.stdout and "--prefix" in r.stdout


@pytest.mark.parametrize("prefix", ["relative/dir", "/home/pi/appliance", "/root/x", "/tmp/x",
                                    "/srv/with space", "/srv/per%cent", "/srv/../etc",
                                    f"{STATE}/code"])
def test_install_refuses_prefixes_the_service_cannot_use(prefix: str) -> None:
    r = run("bash", INSTALL, "--prefix", prefix, "--print-unit")
    assert r.returncode == 2 and not r.stdout and "--prefix" in r.stderr, (prefix, r.stderr)


def test_unknown_argument_is_refused() -> None:
    for script in [*SCRIPTS, ROOT / ".ci" / "fresh-start.sh"]:
        r = run("bash", script, "--frobnicate")
        assert r.returncode == 2 and "unknown argument" in r.stderr


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory anyone can read (pytest's tmp_path sits in a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="appliance-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_scripts_refuse_to_run_without_root(world_readable_dir: Path) -> None:
    drop: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")  # util-linux, essential on Debian
        assert setpriv, "setpriv is needed to drop root for this test"
        drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    scripts_dir = world_readable_dir / "scripts"
    scripts_dir.mkdir()
    scripts_dir.chmod(0o755)
    for script, args in ((INSTALL, ["--no-start"]), (UNINSTALL, ["--purge"])):
        copy = scripts_dir / script.name
        shutil.copy(script, copy)
        copy.chmod(0o755)
        r = subprocess.run([*drop, "bash", str(copy), *args], capture_output=True, text=True,
                           timeout=60, cwd="/")
        assert r.returncode == 1, r.stderr
        # The exact command to run instead, arguments included.
        assert f"sudo {copy} {args[0]}" in r.stderr, r.stderr


def test_default_config_is_valid_and_shows_the_defaults(tmp_path: Path) -> None:
    text = install_output("--print-config")
    path = tmp_path / "appliance.toml"
    path.write_text(text)
    # As written (everything commented out) it changes nothing.
    cfg, sources = config_mod.load(config_file=str(path), environ={})
    assert cfg == config_mod.Config()
    assert set(sources.values()) == {"default"}

    # Uncommented, every "#key = value" line must be a real key whose value is the default,
    # so the file documents the loader truthfully.
    examples = re.findall(r"^#([a-z_]+ = .*)$", text, flags=re.M)
    keys = [e.split(" = ")[0] for e in examples]
    assert {"host", "port", "slots", "ctx_per_slot", "threads", "cpus", "kv_tokens"} <= set(keys)
    assert len(keys) == len(set(keys))
    path.write_text(re.sub(r"^#([a-z_]+ = )", r"\1", text, flags=re.M))
    cfg, sources = config_mod.load(config_file=str(path), environ={})
    assert cfg == config_mod.Config()
    assert {k for k, v in sources.items() if v.startswith("file ")} == set(keys)
    # models_dir would be overridden by the unit's APPLIANCE_MODELS_DIR: not offered here.
    assert "models_dir" not in keys


def test_raspberry_pi_suggestion_is_a_valid_config(tmp_path: Path) -> None:
    text = install_output("--print-config")
    assert "slots to 4 and kv_tokens to 8192" in text
    path = tmp_path / "pi.toml"
    path.write_text("slots = 4\nkv_tokens = 8192\n")
    cfg, _ = config_mod.load(config_file=str(path), environ={})
    assert cfg.kv_tokens >= cfg.ctx_per_slot


# What systemd 252 (Debian 12) installs for MemoryDenyWriteExecute=yes, as seccomp rules:
# mmap with PROT_WRITE|PROT_EXEC and mprotect/pkey_mprotect adding PROT_EXEC fail with EPERM.
MDWE_CHILD = textwrap.dedent("""
    import ctypes, mmap, platform, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    # (mmap or mmap2, mprotect, pkey_mprotect) per architecture (Raspberry Pi OS: arm*).
    NR = {"x86_64": (9, 10, 329), "aarch64": (222, 226, 288),
          "armv7l": (192, 125, 394), "armv6l": (192, 125, 394)}[platform.machine()]
    LD, JEQ, AND, RET = 0x20, 0x15, 0x54, 0x06
    ALLOW, EPERM = 0x7FFF0000, 0x00050001
    ins = lambda c, jt, jf, k: struct.pack("HBBI", c, jt, jf, k)
    arg2 = 16 + 2 * 8  # seccomp_data.args[2] (prot), low 32 bits on little-endian
    prog = [ins(LD, 0, 0, 0), ins(JEQ, 3, 0, NR[0]), ins(JEQ, 7, 0, NR[1]), ins(JEQ, 6, 0, NR[2]),
            ins(RET, 0, 0, ALLOW),
            ins(LD, 0, 0, arg2), ins(AND, 0, 0, 6), ins(JEQ, 0, 1, 6), ins(RET, 0, 0, EPERM),
            ins(RET, 0, 0, ALLOW),
            ins(LD, 0, 0, arg2), ins(AND, 0, 0, 4), ins(JEQ, 0, 1, 4), ins(RET, 0, 0, EPERM),
            ins(RET, 0, 0, ALLOW)]
    buf = ctypes.create_string_buffer(b"".join(prog))
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    assert libc.prctl(38, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS"
    assert libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) == 0, "PR_SET_SECCOMP"
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        sys.exit("the W^X rule is not in force")
    except PermissionError:
        pass
    # A Python callback called from C, as llama.cpp calls our log callback.
    CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
    arr = (ctypes.c_int * 5)(5, 1, 4, 2, 3)
    libc.qsort(arr, 5, ctypes.sizeof(ctypes.c_int), CMP(lambda a, b: a[0] - b[0]))
    assert list(arr) == [1, 2, 3, 4, 5], list(arr)
    # The real thing: importing it registers llama_cpp's and our callbacks with llama.cpp;
    # calling ours through its C function pointer runs the libffi closure trampoline.
    import logging
    from appliance.model import llm
    seen = []
    h = logging.Handler(); h.emit = seen.append
    log = logging.getLogger("llama.cpp"); log.addHandler(h); log.setLevel(logging.DEBUG)
    llm._log_callback(3, b"through the trampoline", None)
    assert [r.getMessage() for r in seen] == ["through the trampoline"], seen
    print("ok")
""")


def test_ctypes_callbacks_survive_memory_deny_write_execute() -> None:
    """Evidence for MemoryDenyWriteExecute=yes in the unit: libffi (Debian 12: 3.4.4, no
    static trampolines) is refused its RWX closure page and falls back to a memfd mapped
    twice (RW + RX), which the rule allows. If this fails, the unit must say "no"."""
    r = subprocess.run([sys.executable, "-c", MDWE_CHILD], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_reload_sends_sighup_which_reloads_the_keys(unit: Unit) -> None:
    # appliance/serve.py handles SIGHUP by re-reading api_keys_file (tests/http/test_security_live.py
    # sends it to a real server); without this line `systemctl reload` would fail.
    assert one(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
