"""Saved session files of the real server (bundled model), under umask 022: private, named
by digest, holding no session id. (Restoring across a restart: test_scheduling_live.py.)"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.live import Live

from appliance.library.store import FILE_NAME as LIBRARY_FILE
from appliance.usage.store import FILE_NAME as USAGE_FILE

pytestmark = pytest.mark.integration


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_saved_session_files_are_0600_in_0700_and_hold_no_session_id(start_server: Callable[..., Live], tmp_path: Path) -> None:
    sid = "persist-live-" + secrets.token_hex(16)
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)  # as an older version (or a careless operator) left it
    old = os.umask(0o022)
    try:
        live = start_server(state_dir=state)
    finally:
        os.umask(old)
    try:
        live.wait_ready()
        r = live.client.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                             json={"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4,
                                   "temperature": 0})
        assert r.status_code == 200, r.text
    finally:
        assert live.stop() == 0
    assert mode(state) == 0o700
    # Nothing else but the usage counts (issue 26) and the library (issue 38), also 0600: no
    # temporary file left behind.
    (f,) = [p for p in state.iterdir() if p.name not in (USAGE_FILE, LIBRARY_FILE)]
    assert mode(state / USAGE_FILE) == 0o600 and mode(state / LIBRARY_FILE) == 0o600
    assert re.fullmatch(r"[0-9a-f]{32}\.kv", f.name) and mode(f) == 0o600
    assert os.lstat(f).st_uid == os.geteuid()
    assert sid.encode() not in f.read_bytes()
    log = live.log()
    assert f"state_dir {state} had mode 0755: set to 0700" in log
    assert "saved 1 of 1 sessions" in log
    assert sid not in log
