"""The box's own certificate authority and the server certificate it signs, kept in
`state_dir/tls/`: ca.key and server.key are 0600, the certificates 0644.

ECDSA P-256 (every browser and phone since 2014; a key in microseconds, where RSA-2048 takes
~0.1 s). The CA lives 10 years: people trust it once and should not have to again. Its
`nameConstraints` let it sign only names and addresses a LAN uses (.local, localhost, the host
name it was made on, private and loopback ranges): a person who installs it gives whoever might
one day copy the box's disk no power over their bank's or mail's certificates. The server
certificate lives 90 days (Apple refuses more than 825) and renewal.py replaces it well before.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from appliance.tls.names import Names

CA_DAYS = 3650
SERVER_DAYS = 90
LAN_SUFFIXES = ("local", "localhost", "home.arpa", "internal", "lan")
LAN_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "100.64.0.0/10", "::1/128", "fc00::/7"))
_EARLY = dt.timedelta(hours=1)  # not-before a little in the past: a phone whose clock runs behind


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(hosts: frozenset[str], now: dt.datetime, title: str = "appliance") -> tuple[bytes, bytes]:
    """A new CA's key and certificate (PEM), allowed to sign the LAN's names plus `hosts`."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{title} local CA"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, title)])
    permitted: list[x509.GeneralName] = [x509.DNSName(n) for n in sorted(set(LAN_SUFFIXES) | hosts)]
    permitted += [x509.IPAddress(net) for net in LAN_NETWORKS]
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _EARLY).not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def permitted(names: Names, ca: x509.Certificate) -> Names:
    """The names the CA may sign (a certificate naming one outside its constraints fails whole)."""
    try:
        constraints = ca.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return names
    trees = constraints.permitted_subtrees or []
    suffixes = [t.value.lower() for t in trees if isinstance(t, x509.DNSName)]
    nets = [t.value for t in trees if isinstance(t, x509.IPAddress)
            and isinstance(t.value, ipaddress.IPv4Network | ipaddress.IPv6Network)]
    dns = frozenset(n for n in names.dns if any(n == s or n.endswith("." + s) for s in suffixes))
    ips = frozenset(ip for ip in names.ips if any(ip.version == net.version and ip in net for net in nets))
    return Names(dns, ips)


def issue(ca_key_pem: bytes, ca_pem: bytes, names: Names, now: dt.datetime) -> tuple[bytes, bytes]:
    """A server key and certificate (PEM) for `names`, signed by the CA."""
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in sorted(names.dns)]
    sans += [x509.IPAddress(ip) for ip in sorted(names.ips, key=lambda ip: (ip.version, ip))]
    first = sorted(names.dns)[0] if names.dns else "appliance"
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _EARLY).not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def names_of(cert: x509.Certificate) -> Names:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return Names(frozenset(n.lower() for n in san.get_values_for_type(x509.DNSName)),
                 frozenset(ip for ip in san.get_values_for_type(x509.IPAddress)
                           if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)))


def write(path: Path, data: bytes, mode: int) -> None:
    """Whole or not at all (a crash mid-write leaves the old file), with its mode from the start."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)  # O_CREAT's mode passes through the umask; an existing tmp keeps its own
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class Files:
    """Where the CA and the server certificate live."""
    folder: Path

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def key(self) -> Path:
        return self.folder / "server.key"

    @property
    def cert(self) -> Path:
        return self.folder / "server.crt"

    def ensure_ca(self, hosts: frozenset[str], now: dt.datetime) -> bool:
        """Make the CA unless it exists; True when it was made now."""
        if self.ca_key.is_file() and self.ca_cert.is_file():
            return False
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        key, cert = make_ca(hosts, now)
        write(self.ca_key, key, 0o600)
        write(self.ca_cert, cert, 0o644)
        return True

    def issue(self, names: Names, now: dt.datetime) -> Names:
        """A new server certificate for what of `names` the CA may sign; those names."""
        ca_pem = self.ca_cert.read_bytes()
        signed = permitted(names, x509.load_pem_x509_certificate(ca_pem))
        key, cert = issue(self.ca_key.read_bytes(), ca_pem, signed, now)
        write(self.key, key, 0o600)  # the key first: a cert without its key would not load
        write(self.cert, cert, 0o644)
        return signed
