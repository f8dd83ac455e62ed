"""API keys: an optional file of keys, checked in constant time, reloaded on SIGHUP.

File format, one key per line: `KEY [LABEL [QUOTA [LANE]]]`; blank lines and `#` comments
are skipped. A key is 16-256 printable ASCII characters without spaces; the label `admin`
marks an operator key (it may read /metrics, /debug/steps and /admin from anywhere). QUOTA is
the key's daily generated-token quota in place of quota_tokens_per_day (0 = none for this
key). LANE `background` makes every request of the key background work (a nightly batch job,
an indexing tool): it runs in the capacity people leave free (engine/scheduler.py).
Keys are held only as SHA-256 digests, and nothing here ever logs or prints one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ADMIN = "admin"
_KEY = re.compile(r"[\x21-\x7e]{16,256}")
_LABEL = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_QUOTA = re.compile(r"[0-9]{1,12}")
_FORMAT = ("expected `KEY [LABEL]`, `KEY LABEL QUOTA` or `KEY LABEL QUOTA background` "
           "(QUOTA: generated tokens a day, 0 = no quota)")
LANES = ("people", "background")


class KeysFileError(Exception):
    """The keys file cannot be used; str() names the file and line, never a key."""


@dataclass(frozen=True, slots=True)
class Key:
    digest: bytes  # SHA-256 of the key
    label: str
    quota: int | None = None  # generated tokens a day (0 = none); None = the configured default
    background: bool = False  # every request of this key is background work

    @property
    def identity(self) -> str:
        """The client identity of everyone holding this key: KV reuse, fairness, limits, sessions."""
        return "key:" + self.digest.hex()[:16]

    @property
    def admin(self) -> bool:
        return self.label == ADMIN


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def parse_keys(text: str, source: str = "keys file") -> tuple[Key, ...]:
    keys: list[Key] = []
    seen: set[bytes] = set()
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 4 or (len(fields) >= 3 and not _QUOTA.fullmatch(fields[2])) \
                or (len(fields) == 4 and fields[3] not in LANES):
            raise KeysFileError(f"{source} line {n}: {_FORMAT}")
        if not _KEY.fullmatch(fields[0]):
            raise KeysFileError(f"{source} line {n}: a key must be 16-256 printable ASCII characters")
        label = fields[1] if len(fields) >= 2 else ""
        if label and not _LABEL.fullmatch(label):
            raise KeysFileError(f"{source} line {n}: a label is 1-64 characters of A-Z a-z 0-9 _ . @ -")
        digest = _digest(fields[0])
        if digest in seen:
            raise KeysFileError(f"{source} line {n}: the same key appears twice")
        seen.add(digest)
        keys.append(Key(digest, label, int(fields[2]) if len(fields) >= 3 else None,
                        len(fields) == 4 and fields[3] == "background"))
    if not keys:
        raise KeysFileError(f"{source}: no keys (to turn keys off, unset api_keys_file)")
    return tuple(keys)


def read_keys(path: Path) -> tuple[Key, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise KeysFileError(f"keys file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise KeysFileError(f"keys file {path}: not UTF-8 text") from None
    return parse_keys(text, f"keys file {path}")


class KeyRing:
    """The keys in force. Empty path = keys off: every caller is identified by address."""

    def __init__(self, path: str = "") -> None:
        self.path = Path(path) if path else None
        self._keys: tuple[Key, ...] = read_keys(self.path) if self.path else ()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def __len__(self) -> int:
        return len(self._keys)

    def reload(self) -> bool:
        """Re-read the file (SIGHUP). A file that fails to parse keeps the old keys."""
        if self.path is None:
            return False
        try:
            keys = read_keys(self.path)
        except KeysFileError as e:
            log.error("%s; keeping the %d keys in force", e, len(self._keys))
            return False
        with self._lock:
            self._keys = keys
        log.info("keys file %s reloaded: %d keys", self.path, len(keys))
        return True

    def keys(self) -> tuple[Key, ...]:
        """The keys in force (digests, labels and quotas: never a key)."""
        return self._keys

    def find(self, presented: str) -> Key | None:
        """The key matching `presented`, comparing against every key in constant time."""
        digest = _digest(presented)
        found: Key | None = None
        for key in self._keys:
            if hmac.compare_digest(digest, key.digest):
                found = key  # no early exit: the time does not depend on which key matched
        return found


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
