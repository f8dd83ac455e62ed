"""When the server certificate is made again, and the thread that checks: at start and once a
day. A new certificate is due when there is none, when it ends within RENEW_BEFORE (a third
of its life: a box switched off for weeks still renews at its next start), when the CA is not
its issuer (the CA was replaced), or when the names and addresses the CA may sign are no longer
all on it (a router gave the box a new address)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from appliance.tls import authority
from appliance.tls.authority import Files
from appliance.tls.names import Names
from appliance.workers import Worker

log = logging.getLogger(__name__)
RENEW_BEFORE = dt.timedelta(days=30)
CHECK_EVERY_S = 86400.0


def _load(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def due(files: Files, wanted: Names, now: dt.datetime) -> str | None:
    """Why the server certificate must be made again, or None."""
    cert, ca = _load(files.cert), _load(files.ca_cert)
    if cert is None or ca is None:
        return "no server certificate yet"
    if cert.issuer != ca.subject or cert.signature_hash_algorithm is None:
        return "the CA is not its issuer"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the CA is not its issuer"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"it ends on {cert.not_valid_after_utc:%Y-%m-%d}"
    missing = authority.permitted(wanted, ca)
    have = authority.names_of(cert)
    if not have.covers(missing):
        new = sorted(missing.dns - have.dns) + sorted(str(ip) for ip in missing.ips - have.ips)
        return "new names or addresses: " + ", ".join(new)
    return None


class Renewer(Worker[None]):
    """Checks once a day (and once at start, from `check`); after a new certificate calls
    `renewed` (the listener then hands new connections a context with it)."""

    def __init__(self, files: Files, wanted: Callable[[], Names], renewed: Callable[[], None],
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        super().__init__("tls-renewal", every=CHECK_EVERY_S)
        self.files = files
        self.wanted = wanted
        self.renewed = renewed
        self.clock = clock

    def check(self) -> bool:
        """Renew if due; True when a new certificate was made."""
        now = self.clock()
        why = due(self.files, self.wanted(), now)
        if why is None:
            return False
        signed = self.files.issue(self.wanted(), now)
        log.info("new server certificate (%s) for %s", why,
                 ", ".join(sorted(signed.dns) + sorted(str(ip) for ip in signed.ips)))
        return True

    def tick(self) -> bool:
        try:
            if self.check():
                self.renewed()
        except (OSError, ValueError) as e:
            log.error("renewing the server certificate failed (the current one still serves): %s", e)
        return True
