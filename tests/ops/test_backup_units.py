"""The daily backup's systemd units (systemd/appliance-backup.service and .timer): the same
program, user and directory as the service's unit, daily with Persistent=true, and the
installer's --no-backup."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "appliance.service"
BACKUP = ROOT / "systemd" / "appliance-backup.service"
TIMER = ROOT / "systemd" / "appliance-backup.timer"
INSTALL = ROOT / "scripts" / "install-service.sh"


def parse_unit(text: str) -> configparser.ConfigParser:
    # strict off: a key given twice (SystemCallFilter=) keeps its last value, enough here.
    unit = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    unit.read_string(text)
    return unit


def one(unit: configparser.ConfigParser, section: str, key: str) -> str:
    return unit[section][key]


def test_the_backup_runs_as_the_service_on_its_state() -> None:
    service, backup = parse_unit(UNIT.read_text()), parse_unit(BACKUP.read_text())
    assert one(backup, "Service", "Type") == "oneshot"
    assert one(backup, "Service", "ExecStart") == one(service, "Service", "ExecStart").replace(" serve", " backup")
    for key in ("User", "Group", "WorkingDirectory", "UMask", "ReadWritePaths", "ProtectSystem"):
        assert one(backup, "Service", key) == one(service, "Service", key), key


def test_the_timer_is_daily_and_catches_up() -> None:
    timer = parse_unit(TIMER.read_text())
    assert one(timer, "Timer", "OnCalendar") == "daily" and one(timer, "Timer", "Persistent") == "true"
    assert one(timer, "Install", "WantedBy") == "timers.target"


def test_systemd_accepts_the_units() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:  # no systemd tools here: the parse above is the check
        return
    r = subprocess.run([analyze, "verify", "--man=no", BACKUP, TIMER], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip() and "is not executable" not in ln]
    assert not problems, problems


def test_the_installer_offers_no_backup() -> None:
    r = subprocess.run(["bash", INSTALL, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--no-backup" in r.stdout
    r = subprocess.run(["bash", INSTALL, "--no-backup", "--prefix", "/srv/x", "--print-unit"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "/srv/x/.venv/bin/appliance serve" in r.stdout
