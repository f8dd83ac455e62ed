"""A small fake model behind the engine's Model protocol, and a fake clock."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from appliance.errors import KVCacheFull
from appliance.sampling import SamplingParams

EOS = 0


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass
class Pauses:
    """Stands in for a module's `threading` where it pauses (`threading.Event().wait(s)`, as
    faults.py does): records each pause's seconds, so a test asserts which pauses were taken
    rather than timing them; `at_pause` looks at what a pause finds."""

    seconds: list[float | None] = field(default_factory=list)
    at_pause: Callable[[], None] | None = None  # called at each pause, in the pausing thread

    def Event(self) -> Pauses:  # noqa: N802 - threading's name
        return self

    def wait(self, timeout: float | None = None) -> bool:
        self.seconds.append(timeout)
        if self.at_pause is not None:
            self.at_pause()
        return False


class FakeTokenizer:
    """One token per character; token = ord(char). Token 0 ends the answer. Satisfies the
    engine's Tokenizer protocol (engine/core.py)."""

    chat_template: str | None = None  # the engine falls back to ChatML
    bos_text = ""
    eos_text = ""
    control_texts: frozenset[str] = frozenset()  # no control tokens: no client text refused

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def piece(self, token: int) -> bytes:
        return chr(token).encode() if token else b""

    def is_eog(self, token: int) -> bool:
        return token == EOS

    fim: tuple[int, int, int] | None = None  # no fill-in-the-middle tokens
    n_vocab = 0x110000  # every code point

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens if t)

    def grammar_parses(self, gbnf: str) -> bool:
        return True  # llama.cpp's own check needs a vocabulary; the fake's grammars all pass


@dataclass
class FakeSampler:
    n: int = 0
    freed: bool = False

    def free(self) -> None:
        self.freed = True


@dataclass
class FakeModel:
    """Answers each sequence with the letters of `reply`, then EOS.

    Records every decode call so tests can check what the scheduler put in a step. `gate`
    (when set) makes decode wait, so a test can act while a step is in flight.
    """

    reply: str = "abcdefghij"
    fingerprint: str = "fake-model|kv f16"
    build: str = "0.0.1"
    fail_on_call: int = -1  # decode call index that raises
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    calls: list[tuple[list[int], list[int], list[int], list[bool]]] = field(default_factory=list)
    kv: dict[int, list[int]] = field(default_factory=dict)  # seq -> positions held
    gate: threading.Event | None = None
    gated: int = 0  # decode calls that have waited at a gate (counted as they start waiting)
    delay: float = 0.0  # seconds per decode call, like a real (slow) model
    copies: list[tuple[int, int, int]] = field(default_factory=list)
    capacity: int = 0  # KV cells (distinct positions over all sequences); 0 = unlimited
    fail_restore: bool = False
    closed: bool = False
    threads: list[int] = field(default_factory=list)  # every set_threads call

    def decode(self, tokens: list[int], pos: list[int], seq_ids: list[int], logits: list[bool]) -> None:
        if (gate := self.gate) is not None:
            self.gated += 1
            gate.wait(5)
        if self.delay:
            time.sleep(self.delay)
        self.calls.append((list(tokens), list(pos), list(seq_ids), list(logits)))
        if len(self.calls) - 1 == self.fail_on_call:
            raise RuntimeError("injected decode failure")
        if self.capacity and self.used() + len(tokens) > self.capacity:
            raise KVCacheFull("fake cache full")
        for p, s in zip(pos, seq_ids):
            held = self.kv.setdefault(s, [])
            assert p == len(held), f"seq {s}: position {p} after {len(held)} cached"
            held.append(p)
        self._last = (pos, seq_ids)

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        return FakeSampler()

    def sample_all(self, picks: list[tuple[FakeSampler, int]]) -> list[int | Exception]:
        return [self.sample(smp, row) for smp, row in picks]

    def logprobs(self, row: int, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
        """The sampled token always has p = 0.9, then token+1 .. with 0.05, 0.025, ..."""
        top = [(token, math.log(0.9))] + [(token + i, math.log(0.1 / 2 ** i)) for i in range(1, k)]
        return math.log(0.9), top[:k]

    def sample(self, sampler: FakeSampler, row: int) -> int:
        n = sampler.n
        sampler.n += 1
        return ord(self.reply[n]) if n < len(self.reply) else EOS

    def set_threads(self, n: int) -> None:
        self.threads.append(n)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        if p0 <= 0 and p1 < 0:
            self.kv.pop(seq, None)
        else:
            held = self.kv.get(seq, [])
            self.kv[seq] = [p for p in held if not (p >= max(p0, 0) and (p1 < 0 or p < p1))]

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        held = self.kv.get(src, [])
        end = len(held) if p1 < 0 else p1
        assert self.kv.get(dst, []) == [], f"copy into non-empty seq {dst}"
        self.kv[dst] = [p for p in held if max(p0, 0) <= p < end]
        self.copies.append((src, dst, end))

    def seq_pos_max(self, seq: int) -> int:
        held = self.kv.get(seq, [])
        return max(held) if held else -1

    def seq_state(self, seq: int) -> bytes:
        return bytes(str(self.kv.get(seq, [])), "ascii")

    def set_seq_state(self, seq: int, data: bytes) -> bool:
        held = eval(data.decode())  # test data we wrote ourselves
        if self.fail_restore or (self.capacity and self.used() + len(held) > self.capacity):
            return False
        self.kv[seq] = held
        return True

    def used(self) -> int:
        # Copies share cells in a unified cache; counting each sequence's cells is an upper
        # bound, which is all these tests need.
        return sum(len(v) for v in self.kv.values())

    def close(self) -> None:
        self.closed = True


@dataclass
class RuleModel(FakeModel):
    """A fake with known logits: the model's next token after token t is always rule(t)
    (letters cycle a->b->...->z->a), in any batch. For speculative decoding tests: drafts
    copied from a prompt that follows the rule are accepted, others rejected."""

    vocab: int = 256

    @staticmethod
    def rule(t: int) -> int:
        return (t - 97 + 1) % 26 + 97 if 97 <= t <= 122 else 97

    def decode(self, tokens: list[int], pos: list[int], seq_ids: list[int], logits: list[bool]) -> None:
        super().decode(tokens, pos, seq_ids, logits)
        self._row_tokens = list(tokens)

    def sample_all(self, picks: list[tuple[FakeSampler, int]]) -> list[int | Exception]:
        return [self.rule(self._row_tokens[row]) for _, row in picks]

    def greedy_rows(self, first: int, n: int) -> list[int]:
        return [self.rule(self._row_tokens[first + i]) for i in range(n)]

    def logits_rows(self, first: int, n: int) -> np.ndarray:
        out = np.zeros((n, self.vocab), dtype=np.float32)
        for i in range(n):
            out[i, self.rule(self._row_tokens[first + i])] = 30.0  # p ~ 1 - 1e-11 at temperature 1
        return out


class FakeSystemd:
    """The receiving end of systemd's notify protocol: a datagram socket (a path, or a name
    in the abstract namespace) that records every message with its arrival time."""

    def __init__(self, abstract: bool = False) -> None:
        import socket
        import tempfile
        from pathlib import Path

        self._dir = Path(tempfile.mkdtemp(prefix="notify-"))  # short: a socket path is <= 107 bytes
        name = f"appliance-test-{id(self)}-{time.monotonic_ns()}"
        self.address = f"@{name}" if abstract else str(self._dir / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + name if abstract else self.address)
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, str]] = []  # (time.monotonic(), message)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.received.append((time.monotonic(), data.decode()))

    def env(self, watchdog_s: float) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.address, "WATCHDOG_USEC": str(int(watchdog_s * 1e6))}

    def messages(self) -> list[str]:
        return [m for _, m in list(self.received)]

    def pings(self) -> list[float]:
        return [t for t, m in list(self.received) if "WATCHDOG=1" in m.split("\n")]

    def wait_for(self, line: str, timeout: float) -> float:
        """Arrival time of the first message holding `line`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, m in list(self.received):
                if line in m.split("\n"):
                    return t
            time.sleep(0.01)
        raise AssertionError(f"no {line!r} within {timeout} s; got {self.messages()}")

    def close(self) -> None:
        import shutil

        self._stop.set()
        self._thread.join(1)
        self.sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)
