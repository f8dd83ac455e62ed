"""What people need to trust the box once: its CA certificate and that certificate's SHA-256
fingerprint, which the terminal, /admin and the sign-in page show so that a download can be
checked against what the operator sees on the box itself."""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass

DOWNLOAD = "/trust/ca.crt"


def fingerprint(pem: bytes) -> str:
    """SHA-256 of the certificate's DER bytes, as browsers and `openssl x509 -fingerprint
    -sha256` print it: AB:CD:..."""
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.decode("ascii"))).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


@dataclass(frozen=True, slots=True)
class Trust:
    pem: bytes  # the CA certificate (never its key)
    url: str  # the download as people on the LAN reach it (https://<box_name>.local:port/trust/ca.crt)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.pem)
