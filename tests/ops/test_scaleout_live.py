"""Two real appliances behind Debian's nginx, run with the shipped systemd/nginx-appliance.conf:
every turn of a conversation lands on one box, and when that box dies its conversations
continue, recomputed, on the other (docs/SCALE-OUT.md)."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.live import Live
from helpers.nginx import NGINX, Nginx, two_boxes

from appliance.bench import user_address

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")]

N_CONVERSATIONS = 10
# finished-request log line: "request 7 session 1a2b3c4d client 127.0.0.2: stop, prompt 40 (reused 31), ..."
LOG_LINE = re.compile(r"request \d+ session ([0-9a-f]{8}) client (\S+): (\w+).*?prompt (\d+) \(reused (\d+)\)")


def log_digest(sid: str) -> str:
    """How a box names a session in its log: server.session_key (no API keys: namespace "")
    hashed again by core._log_finished."""
    key = hashlib.sha256(f"\0{sid}".encode()).hexdigest()[:32]
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def turns_on(box: Live) -> dict[str, list[tuple[str, str, int, int]]]:
    """Each session digest's finished requests in the box's log: (client, reason, prompt, reused)."""
    seen: dict[str, list[tuple[str, str, int, int]]] = {}
    for m in LOG_LINE.finditer(box.log()):
        seen.setdefault(m[1], []).append((m[2], m[3], int(m[4]), int(m[5])))
    return seen


@pytest.fixture
def cluster(bundled_model: Path, tmp_path: Path) -> Iterator[tuple[list[Live], Nginx]]:
    with two_boxes(bundled_model, tmp_path) as boxes:
        yield boxes


class Conversation:
    """One person's chat through nginx, from their own address, naming it by X-Session-Id."""

    def __init__(self, i: int, url: str) -> None:
        self.i, self.sid, self.code = i, secrets.token_hex(16), str(4170 + 37 * i)
        self.address = user_address(i)
        self.http = httpx.Client(base_url=url, timeout=120, trust_env=False,
                                 transport=httpx.HTTPTransport(local_address=self.address))
        self.messages: list[dict[str, str]] = [{"role": "system", "content": "You are a terse assistant."}]

    def say(self, text: str, max_tokens: int = 16) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": text})
        r = self.http.post("/v1/chat/completions", headers={"X-Session-Id": self.sid},
                           json={"messages": self.messages, "temperature": 0, "max_tokens": max_tokens})
        assert r.status_code == 200, (self.i, r.status_code, r.text)
        body: dict[str, Any] = r.json()
        self.messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        return body


def owner(boxes: list[Live], sid: str) -> int:
    """Which box holds the session, asked of each box directly (not through nginx)."""
    found = [i for i, b in enumerate(boxes) if b.client.get(f"/v1/sessions/{sid}").status_code == 200]
    assert len(found) == 1, f"session on boxes {found}"
    return found[0]


def test_sticky_sessions_and_failover(cluster: tuple[list[Live], Nginx], capsys: pytest.CaptureFixture[str]) -> None:
    boxes, ngx = cluster
    convs = [Conversation(i, ngx.url) for i in range(N_CONVERSATIONS)]
    try:
        # Behind nginx the boxes still see the page's own origin as same-origin and refuse others.
        front = httpx.Client(base_url=ngx.url, timeout=30, trust_env=False)
        assert front.get("/v1/models", headers={"Origin": ngx.url}).status_code == 200
        assert front.get("/v1/models", headers={"Origin": "http://evil.example"}).status_code == 403
        assert front.get("/v1/models", headers={"Host": "evil.example"}).status_code == 421
        front.close()

        # Two turns each, conversations side by side: the aggregate throughput of both boxes.
        with ThreadPoolExecutor(N_CONVERSATIONS) as pool:
            list(pool.map(lambda c: c.say(f"My code is {c.code}. Reply with just OK."), convs))
            t0 = time.monotonic()
            second = list(pool.map(lambda c: c.say("Write one sentence about the sea.", max_tokens=32), convs))
            wall = time.monotonic() - t0
        tokens = sum(b["usage"]["completion_tokens"] for b in second)
        home = {c.sid: owner(boxes, c.sid) for c in convs}
        per_box = [sum(1 for c in convs if home[c.sid] == i) for i in range(2)]
        with capsys.disabled():  # the figure shows in a normal run's output
            print(f"\nscale-out: {N_CONVERSATIONS} conversations on two boxes ({per_box[0]} + {per_box[1]}), "
                  f"{tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tokens/s aggregate "
                  f"(both boxes share this machine's cores: a correctness figure, not a capacity one)")

        # Every turn so far landed on its conversation's box: that box's log has both, the other none;
        # the second turn reused the first's KV cache; the box saw the person's address, not nginx's.
        logs = [turns_on(b) for b in boxes]
        for c in convs:
            mine, other = logs[home[c.sid]].get(log_digest(c.sid), []), logs[1 - home[c.sid]].get(log_digest(c.sid), [])
            assert len(mine) == 2 and not other, (c.i, mine, other)
            assert all(client == c.address for client, *_ in mine), mine
            assert mine[1][3] >= mine[0][2], f"turn 2 recomputed turn 1: {mine}"
            # GET /v1/sessions/{id} without the header is routed by the path to the same box.
            assert c.http.get(f"/v1/sessions/{c.sid}").status_code == 200

        # The box with more conversations dies (SIGKILL: no drain, no goodbye).
        dead = 0 if per_box[0] >= per_box[1] else 1
        live = 1 - dead
        boxes[dead].proc.kill()
        boxes[dead].proc.wait(10)
        with ThreadPoolExecutor(N_CONVERSATIONS) as pool:
            third = list(pool.map(lambda c: c.say("What is my code? Reply with just the number."), convs))
        for c, body in zip(convs, third, strict=True):
            # The survivor answers from the history the client sent: the code from the first turn.
            assert c.code in body["choices"][0]["message"]["content"], (c.i, c.code, body)
            assert owner([boxes[live]], c.sid) == 0
        logs_live = turns_on(boxes[live])
        for c in convs:
            mine = logs_live[log_digest(c.sid)]
            if home[c.sid] == live:
                assert len(mine) == 3 and mine[2][3] >= mine[1][2], mine  # undisturbed, cache reused
            else:
                assert len(mine) == 1 and mine[0][3] < mine[0][2] // 2, mine  # moved: recomputed

        # Moved conversations stay on their new box, with its cache.
        with ThreadPoolExecutor(N_CONVERSATIONS) as pool:
            list(pool.map(lambda c: c.say("Thanks. Reply with just OK."), convs))
        logs_live = turns_on(boxes[live])
        for c in convs:
            mine = logs_live[log_digest(c.sid)]
            assert mine[-1][3] >= mine[-2][2], mine
        assert "no live upstreams" not in ngx.error_log()
    finally:
        for c in convs:
            c.http.close()
