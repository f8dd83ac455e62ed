"""The `tls` setting's matrix (appliance/tls/mode.py) and what ops/https.prepare makes of it:
the box's CA only where secrets travel and nothing fronts the box, the operator's certificate
always winning, plain HTTP for the README's open box."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509

from appliance.config import Config, ConfigError, load
from appliance.ops.https import prepare
from appliance.tls.authority import Files, names_of
from appliance.tls.mode import Mode, mode_of

PEOPLE, KEYS, PROXY, CERT = {"auth": "people"}, {"api_keys_file": "keys"}, {"trusted_proxies": ("127.0.0.1",)}, {
    "tls_cert": "c.pem", "tls_key": "k.pem"}


@pytest.mark.parametrize(("settings", "mode"), [
    ({}, Mode.PLAIN),  # the README's first command: open, plain http on 8080 as before
    (PEOPLE, Mode.BOX),
    (KEYS, Mode.BOX),
    ({**PEOPLE, **PROXY}, Mode.PLAIN),  # nginx in front is the front door
    ({**PEOPLE, "tls": "off"}, Mode.PLAIN),
    ({**KEYS, "tls": "off"}, Mode.PLAIN),
    ({"tls": "on"}, Mode.BOX),
    ({**PROXY, "tls": "on"}, Mode.BOX),
    (CERT, Mode.OWN),
    ({**CERT, **PEOPLE}, Mode.OWN),
    ({**CERT, "tls": "off"}, Mode.OWN),  # the operator's own certificate wins
    ({**CERT, "tls": "on"}, Mode.OWN),
])
def test_the_matrix(settings: dict[str, object], mode: Mode) -> None:
    assert mode_of(Config(**settings)) is mode  # type: ignore[arg-type]


def test_the_defaults() -> None:
    cfg, _ = load(environ={}, cli={})
    assert (cfg.tls, cfg.http_port, cfg.port, mode_of(cfg)) == ("auto", 0, 8080, Mode.PLAIN)
    with pytest.raises(ConfigError, match="tls"):
        load(environ={"APPLIANCE_TLS": "maybe"}, cli={})


def test_plain_makes_nothing(tmp_path: Path) -> None:
    assert prepare(Config(state_dir=str(tmp_path))) is None
    assert not (tmp_path / "tls").exists()


def test_people_mode_makes_the_ca_once_and_keeps_it(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    first = prepare(Config(auth="people", state_dir=str(tmp_path)), lambda: now)
    assert first is not None and first.trust is not None and first.mode is Mode.BOX
    files = Files(tmp_path / "tls")
    assert stat.S_IMODE(files.ca_key.stat().st_mode) == 0o600
    assert first.trust.url == "https://appliance.local:8080/trust/ca.crt"
    again = prepare(Config(auth="people", state_dir=str(tmp_path), box_name="desk", port=443), lambda: now)
    assert again is not None and again.trust is not None
    assert again.trust.fingerprint == first.trust.fingerprint  # people trusted it once: it stays
    assert again.trust.url == "https://desk.local/trust/ca.crt"
    leaf = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert "desk.local" in names_of(leaf).dns  # re-issued for the new name at once
    assert again.context() is not first.context()


def test_the_box_ca_needs_a_state_dir() -> None:
    with pytest.raises(ConfigError, match="state_dir"):
        prepare(Config(auth="people", state_dir=""))


def test_the_operators_certificate_is_served_as_given(tmp_path: Path) -> None:
    box = prepare(Config(tls="on", state_dir=str(tmp_path / "made")))
    assert box is not None
    own = prepare(Config(auth="people", tls_cert=str(box.cert), tls_key=str(box.key), state_dir=str(tmp_path)))
    assert own is not None and own.mode is Mode.OWN and own.trust is None and own.renewer is None
    assert not (tmp_path / "tls").exists()
