"""The box's own CA and server certificate (appliance/tls/authority.py) and when it is made
again (renewal.py), on an injected clock: SANs, validity, the CA's name constraints, key
permissions, and every reason to renew."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from appliance.tls import authority
from appliance.tls.authority import Files
from appliance.tls.names import Names
from appliance.tls.renewal import RENEW_BEFORE, Renewer, due
from appliance.tls.trust import Trust, fingerprint

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
BOX = Names(frozenset({"appliance.local", "localhost", "office-pc"}),
            frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("192.168.1.20"),
                       ipaddress.ip_address("::1")}))


def made(tmp_path: Path, names: Names = BOX) -> Files:
    files = Files(tmp_path / "tls")
    assert files.ensure_ca(frozenset({"office-pc"}), NOW)
    files.issue(names, NOW)
    return files


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_server_certificate_names_the_box_and_chains_to_its_ca(tmp_path: Path) -> None:
    files = made(tmp_path)
    leaf, ca = cert(files.cert), cert(files.ca_cert)
    assert authority.names_of(leaf) == BOX
    leaf.verify_directly_issued_by(ca)
    assert leaf.not_valid_after_utc - NOW == dt.timedelta(days=authority.SERVER_DAYS)
    assert leaf.not_valid_before_utc < NOW  # a phone whose clock is a little behind
    assert ca.not_valid_after_utc - NOW == dt.timedelta(days=authority.CA_DAYS)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)  # the key matches the certificate (else SSLError)


def test_keys_are_readable_by_the_owner_only(tmp_path: Path) -> None:
    files = made(tmp_path)
    assert stat.S_IMODE(files.ca_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(files.ca_cert.stat().st_mode) == 0o644


def test_the_ca_is_made_once(tmp_path: Path) -> None:
    files = made(tmp_path)
    before = files.ca_cert.read_bytes()
    assert not files.ensure_ca(frozenset(), NOW + dt.timedelta(days=1))
    assert files.ca_cert.read_bytes() == before


def test_the_ca_may_sign_lan_names_only(tmp_path: Path) -> None:
    # A public address and a public name are left off the certificate (the CA could not sign
    # them: a device that trusts it trusts it for the LAN only).
    wanted = Names(BOX.dns | {"mail.example.com"}, BOX.ips | {ipaddress.ip_address("8.8.8.8")})
    files = made(tmp_path, wanted)
    assert authority.names_of(cert(files.cert)) == BOX
    constraints = cert(files.ca_cert).extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    assert x509.DNSName("local") in (constraints.value.permitted_subtrees or [])


def test_a_fresh_certificate_is_not_due(tmp_path: Path) -> None:
    assert due(made(tmp_path), BOX, NOW + dt.timedelta(days=1)) is None


def test_due_near_its_end(tmp_path: Path) -> None:
    files = made(tmp_path)
    end = NOW + dt.timedelta(days=authority.SERVER_DAYS)
    assert due(files, BOX, end - RENEW_BEFORE - dt.timedelta(hours=1)) is None
    assert "ends on" in (due(files, BOX, end - RENEW_BEFORE + dt.timedelta(hours=1)) or "")


def test_due_when_an_address_changes(tmp_path: Path) -> None:
    files = made(tmp_path)
    moved = Names(BOX.dns, BOX.ips - {ipaddress.ip_address("192.168.1.20")} | {ipaddress.ip_address("192.168.1.57")})
    assert due(files, moved, NOW) == "new names or addresses: 192.168.1.57"
    # An address it may not sign changes nothing: renewing could not add it.
    assert due(files, Names(BOX.dns, BOX.ips | {ipaddress.ip_address("8.8.8.8")}), NOW) is None
    # One gone is no reason: the certificate still covers what is left.
    assert due(files, Names(BOX.dns, frozenset({ipaddress.ip_address("127.0.0.1")})), NOW) is None


def test_due_without_a_certificate_or_with_another_ca(tmp_path: Path) -> None:
    files = made(tmp_path)
    other = made(tmp_path / "other")
    files.cert.write_bytes(other.cert.read_bytes())
    assert due(files, BOX, NOW) == "the CA is not its issuer"
    files.cert.unlink()
    assert due(files, BOX, NOW) == "no server certificate yet"


def test_the_renewer_reissues_when_due_and_says_so(tmp_path: Path) -> None:
    files = made(tmp_path)
    clock = [NOW]
    renewed: list[bool] = []
    renewer = Renewer(files, lambda: BOX, lambda: renewed.append(True), lambda: clock[0])
    first = files.cert.read_bytes()
    assert renewer.tick() and not renewed and files.cert.read_bytes() == first
    clock[0] = NOW + dt.timedelta(days=authority.SERVER_DAYS - 1)
    assert renewer.tick() and renewed == [True]
    assert cert(files.cert).not_valid_after_utc == clock[0] + dt.timedelta(days=authority.SERVER_DAYS)


def test_the_fingerprint_is_the_sha256_of_the_der(tmp_path: Path) -> None:
    files = made(tmp_path)
    digest = cert(files.ca_cert).fingerprint(hashes.SHA256()).hex().upper()
    assert fingerprint(files.ca_cert.read_bytes()).replace(":", "") == digest
    assert Trust(files.ca_cert.read_bytes(), "https://x").fingerprint.count(":") == 31


@pytest.mark.parametrize("hosts", [frozenset(), frozenset({"office-pc"})])
def test_a_name_outside_the_constraints_is_left_out(tmp_path: Path, hosts: frozenset[str]) -> None:
    files = Files(tmp_path / "tls")
    files.ensure_ca(hosts, NOW)
    signed = files.issue(BOX, NOW)
    assert ("office-pc" in signed.dns) == bool(hosts)
