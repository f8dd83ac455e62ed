"""`appliance person` against a state directory (ops/person.py): the first admin from the
terminal, a new link, the list, and the refusals that keep a person out of a store nobody
serves. tests/ops/test_person_live.py signs in with the link beside a running server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.config import Config
from appliance.ops import person
from appliance.people.accounts import Role
from appliance.people.db import FILE_NAME

ROOT = Path(__file__).resolve().parents[2]


def cfg(state: Path, **kw: object) -> Config:
    return Config(state_dir=str(state), auth="people", **kw)  # type: ignore[arg-type]


def token_of(text: str) -> str:
    return text.strip().splitlines()[-1].rsplit("#invite=", 1)[1]


def test_add_prints_the_link_by_name_a_qr_code_and_a_line_to_copy(tmp_path: Path) -> None:
    code, text = person.run(cfg(tmp_path, box_name="office", port=8080), "add", "Ann", admin=True)
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0] == "added Ann (admin)"
    url = lines[-1]
    # Never 127.0.0.1 (a phone scans it), and https: people mode at the defaults serves it (tls/mode.py).
    assert url.startswith("https://office.local:8080/#invite=")
    assert sum("█" in line for line in lines) >= 10  # the QR code, drawn in blocks
    accounts = person._open(cfg(tmp_path)).accounts
    assert accounts is not None
    ann = accounts.invited(token_of(text))
    assert ann is not None and ann.name == "Ann" and ann.role is Role.ADMIN


def test_the_scheme_is_https_where_the_box_serves_tls(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    code, text = person.run(cfg(tmp_path, port=443, tls_cert=str(cert), tls_key=str(cert)), "add", "Ann")
    assert code == 0 and text.splitlines()[-1].startswith("https://appliance.local/#invite=")


def test_invite_list_and_the_refusals(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    assert person.run(c, "add", "Ben")[0] == 0
    code, text = person.run(c, "add", "ben")
    assert code == 1 and "already a person named" in text
    code, first = person.run(c, "invite", "Ben")
    code2, second = person.run(c, "invite", "ben")
    assert code == code2 == 0 and token_of(first) != token_of(second)
    accounts = person._open(c).accounts
    assert accounts is not None
    assert accounts.invited(token_of(first)) is None  # a new link ends the earlier one
    assert accounts.invited(token_of(second)) is not None
    code, text = person.run(c, "list", "")
    assert code == 0 and text.splitlines()[1].split() == ["Ben", "user", "invited", "(not", "signed", "in", "yet)"]
    assert person.run(c, "invite", "Nobody")[0] == 1
    assert person.run(c, "add", "")[0] == 1
    code, text = person.run(cfg(tmp_path / "elsewhere"), "add", "Ann")
    assert code == 2 and "no state directory at" in text and not (tmp_path / "elsewhere").exists()
    assert person.run(Config(state_dir=""), "list")[0] == 2


def test_open_mode_adds_with_a_note(tmp_path: Path) -> None:
    code, text = person.run(Config(state_dir=str(tmp_path)), "add", "Ann")
    assert code == 0 and 'auth is "open"' in text


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["person", "add", "Ann", "--admin", "--state-dir", str(tmp_path), "--box-name", "office"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("http://office.local:8080/#invite=")
    assert main(["person", "list", "--state-dir", str(tmp_path)]) == 0
    assert "Ann" in capsys.readouterr().out


def test_as_root_it_writes_as_the_state_directorys_owner() -> None:
    # The operator's `sudo appliance person add` on a box whose service runs as its own user:
    # a store file made by root would lock the service out. (The tests run as root.)
    top = Path(tempfile.mkdtemp(prefix="person-owner-"))  # pytest's tmp_path is root's only (0700)
    try:
        top.chmod(0o755)
        state = top / "state"
        state.mkdir()
        os.chown(state, 65534, 65534)  # the service's user (nobody here)
        out = subprocess.run([sys.executable, "-m", "appliance", "person", "add", "Ann", "--state-dir", str(state)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=top)
        assert out.returncode == 0, out.stderr
        made = [p for p in state.iterdir() if p.name.startswith(FILE_NAME)]
        assert made and all(p.stat().st_uid == 65534 for p in made), [(p.name, p.stat().st_uid) for p in made]
    finally:
        shutil.rmtree(top)
