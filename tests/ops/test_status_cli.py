"""`appliance status` against the app on a real socket (the fake model): the now view and
today's usage per person; a refused or unreachable server is one sentence and exit code 1."""

from __future__ import annotations

import socket

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import REPLY, USER, Served, is_idle

from appliance import cli
from appliance.ops import status


def test_status_shows_now_and_todays_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with Served(lambda: FakeModel(reply=REPLY)) as s:
        r = s.user(0).post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 200
        s.health(is_idle)
        assert cli.main(["status", "--url", s.url]) == 0
        out = capsys.readouterr().out
        assert "fake-model: ok, up 0 min" in out
        assert "0 busy, 2 idle of 2; queue 0" in out and "watchdog ok" in out
        row = next(line for line in out.splitlines() if line.startswith("127.0.0.2"))
        u = r.json()["usage"]
        assert row.split()[1:6] == ["1", str(u["prompt_tokens"]), str(u["prompt_tokens_details"]["cached_tokens"]),
                                    str(u["completion_tokens"]), "0"]
        assert cli.main(["status", "--url", s.url, "--json"]) == 0
        assert '"people"' in capsys.readouterr().out


def test_an_unreachable_server_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    assert cli.main(["status", "--url", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("appliance status: ") and "is it running?" in err and "Traceback" not in err


def test_the_default_url_follows_the_config() -> None:
    from appliance.config import Config

    assert status.status_url(Config(port=9000)) == "http://127.0.0.1:9000/admin/status"
    assert status.status_url(Config(host="10.0.0.5", tls_cert="c.pem")) == "https://10.0.0.5:8080/admin/status"
    assert status.status_url(Config(), "http://box:8080/") == "http://box:8080/admin/status"


def test_status_shows_the_box_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with Served(lambda: FakeModel(reply=REPLY)) as s:
        assert cli.main(["status", "--url", s.url]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "box        http://appliance.local:8080/ (mDNS: off)"  # the app's defaults, nothing announced
