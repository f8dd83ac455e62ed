"""Password hashes: scrypt (the standard library's, memory-hard), parameters stored in the
hash so they can be raised later without locking anyone out.

N = 2**15, r = 8, p = 1 takes 32 MiB and ~0.18 s on this VM's core (0.6 s expected on a Pi 4
core): a stolen database costs a guesser that per guess, and a sign-in flood is bounded by
the sign-in limiter and `Hasher`'s one-at-a-time gate before any hash is computed. OWASP's
2**17 (128 MiB) would be a quarter of a 1 GiB Pi per concurrent sign-in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading

N, R, P = 2**15, 8, 1
DKLEN = 32
MAXMEM = 64 * 1024 * 1024
MIN_LENGTH = 8
MAX_LENGTH = 1024  # characters: longer is refused before hashing (scrypt's cost does not grow, the copy does)
_PREFIX = "scrypt"


class PasswordRejected(ValueError):
    """A new password that may not be set; str() says why, for the person."""


def check_new(password: str, name: str) -> None:
    if len(password) < MIN_LENGTH:
        raise PasswordRejected(f"a password needs at least {MIN_LENGTH} characters")
    if len(password) > MAX_LENGTH:
        raise PasswordRejected(f"a password has at most {MAX_LENGTH} characters")
    if password.strip().lower() == name.strip().lower():
        raise PasswordRejected("a password may not be the name")


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8", "surrogatepass"), salt=salt, n=n, r=r, p=p,
                          maxmem=MAXMEM, dklen=DKLEN)


def hash_password(password: str, n: int = N) -> str:
    salt = secrets.token_bytes(16)
    return f"{_PREFIX}${n}${R}${P}${_b64(salt)}${_b64(_derive(password, salt, n, R, P))}"


def verify(password: str, stored: str | None) -> bool:
    """Whether `password` matches `stored`. With no stored hash (an unknown name, a person who
    has not set a password yet) the same work is done against a dummy, so the time does not
    say whether the name exists."""
    try:
        prefix, n, r, p, salt, digest = (stored or _DUMMY).split("$")
        if prefix != _PREFIX or len(password) > MAX_LENGTH:
            raise ValueError(prefix)
        got = _derive(password, base64.b64decode(salt), int(n), int(r), int(p))
    except ValueError:
        _derive(password[:MAX_LENGTH], b"\0" * 16, N, R, P)
        return False
    return hmac.compare_digest(got, base64.b64decode(digest)) and stored is not None


def needs_rehash(stored: str, n: int = N) -> bool:
    return not stored.startswith(f"{_PREFIX}${n}${R}${P}$")


_DUMMY = f"{_PREFIX}${N}${R}${P}${_b64(b'0' * 16)}${_b64(b'0' * DKLEN)}"


class Hasher:
    """At most `concurrency` hashes at once (each takes 32 MiB and a core for ~0.2 s): a burst of
    sign-ins queues here instead of taking every core from the chats."""

    def __init__(self, concurrency: int = 1, n: int = N) -> None:
        self._gate = threading.BoundedSemaphore(concurrency)
        self.n = n  # tests of the policies around it use a cheaper cost

    def hash(self, password: str) -> str:
        with self._gate:
            return hash_password(password, self.n)

    def needs_rehash(self, stored: str) -> bool:
        return needs_rehash(stored, self.n)

    def verify(self, password: str, stored: str | None) -> bool:
        with self._gate:
            return verify(password, stored)
