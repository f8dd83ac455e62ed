"""Sign-in attempts, limited before any password is hashed: failures per (address, name) and
per address, each a leaky bucket on an injected clock.

There is deliberately no limit per name alone: that would let anyone lock a colleague out by
guessing wrong under their name. A guesser on one address gets `PAIR_BURST` tries a name,
then one every `PAIR_EVERY_S`; spread over names, `ADDRESS_BURST`, then one every
`ADDRESS_EVERY_S`. Guessing from many addresses at once is the limit of this scheme
(docs/SECURITY.md): the hash's cost (passwords.py) is what is left then.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from appliance.people.accounts import name_key

PAIR_BURST, PAIR_EVERY_S = 5, 60.0
ADDRESS_BURST, ADDRESS_EVERY_S = 30, 10.0
MAX_ENTRIES = 10_000  # buckets kept (~1 MiB); the least recently touched go first


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float


class _Buckets:
    def __init__(self, burst: int, every_s: float) -> None:
        self.burst, self.every_s = burst, every_s
        self._b: OrderedDict[tuple[str, ...], _Bucket] = OrderedDict()

    def _level(self, key: tuple[str, ...], now: float) -> float:
        b = self._b.get(key)
        return 0.0 if b is None else max(0.0, b.level - (now - b.at) / self.every_s)

    def wait(self, key: tuple[str, ...], now: float) -> float | None:
        """Seconds until one more failure is allowed, or None if it is allowed now."""
        over = self._level(key, now) - (self.burst - 1)
        return over * self.every_s if over > 0 else None

    def add(self, key: tuple[str, ...], now: float) -> None:
        self._b[key] = _Bucket(self._level(key, now) + 1, now)
        self._b.move_to_end(key)
        while len(self._b) > MAX_ENTRIES:
            self._b.popitem(last=False)

    def clear(self, key: tuple[str, ...]) -> None:
        self._b.pop(key, None)

    def take_back(self, key: tuple[str, ...], now: float) -> None:
        if key in self._b:
            self._b[key] = _Bucket(max(0.0, self._level(key, now) - 1), now)


class SignInLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic, *, pair: tuple[int, float] = (PAIR_BURST, PAIR_EVERY_S),
                 address: tuple[int, float] = (ADDRESS_BURST, ADDRESS_EVERY_S)) -> None:
        self._clock = clock
        self._pair = _Buckets(*pair)
        self._address = _Buckets(*address)

    def check(self, address: str, name: str) -> int | None:
        """Whole seconds to wait before this attempt may be made, or None: it may."""
        now, a, n = self._clock(), _network(address), name_key(name)
        waits = [w for w in (self._pair.wait((a, n), now), self._address.wait((a,), now)) if w is not None]
        return max(1, math.ceil(max(waits))) if waits else None

    def failed(self, address: str, name: str) -> None:
        now, a = self._clock(), _network(address)
        self._pair.add((a, name_key(name)), now)
        self._address.add((a,), now)

    def succeeded(self, address: str, name: str) -> None:
        """The attempt was right: it counts against neither (failed() counted it beforehand,
        so parallel tries are counted; a right one is taken back)."""
        a = _network(address)
        self._pair.clear((a, name_key(name)))
        self._address.take_back((a,), self._clock())


def _network(address: str) -> str:
    """An IPv6 address's /64 (one home or office network hands out a whole /64): one guesser."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else address
