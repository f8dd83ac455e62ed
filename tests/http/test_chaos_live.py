"""A bounded random mix of real clients against the real server: streamed and not, clients
that vanish mid-answer, returning and edited conversations, deletes, bad requests. The
server must answer every one sensibly and end with nothing stuck."""

from __future__ import annotations

import concurrent.futures as cf
import random
from collections.abc import Callable

import httpx
import pytest
from helpers.live import Live
from helpers.sse import events_of

from appliance.bench import sse

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}
QUESTIONS = ["Name a colour.", "Name a city.", "What is 3+4?", "Say hello in French.", "用中文说谢谢。",
             "Name a tree.", "What day follows Monday?", "Name a metal."]


def test_random_clients_leave_the_server_healthy(start_server: Callable[..., Live]) -> None:
    live = start_server(slots=3, cached_sessions=2, kv_tokens=8192, ctx_per_slot=2048, park_ram_mb=64, max_queue=6)
    statuses: list[int] = []
    try:
        live.wait_ready()
        histories: dict[str, list[dict[str, str]]] = {}

        def client(i: int) -> None:
            rng = random.Random(i)
            with httpx.Client(base_url=live.url, timeout=60, trust_env=False) as c:
                for _ in range(5):
                    sid = f"chaos-session-{rng.randint(0, 5):04d}"
                    msgs = histories.get(sid, [SYSTEM])[:]
                    if len(msgs) > 2 and rng.random() < 0.2:
                        msgs = msgs[: rng.randrange(1, len(msgs))]  # edit: go back in the history
                    msgs = msgs + [{"role": "user", "content": rng.choice(QUESTIONS)}]
                    body = {"messages": msgs, "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.8])}
                    action = rng.random()
                    if action < 0.1:
                        r = c.post("/v1/chat/completions", content=b'{"messages": 7}')
                        statuses.append(r.status_code)
                    elif action < 0.2:
                        statuses.append(c.delete(f"/v1/sessions/{sid}").status_code)
                        histories.pop(sid, None)
                    elif action < 0.55:
                        body["stream"] = True
                        leave_after = rng.choice([None, 1, 3])
                        with c.stream("POST", "/v1/chat/completions", json=body,
                                      headers={"X-Session-Id": sid}) as r:
                            statuses.append(r.status_code)
                            text, n = [], 0
                            for ev in events_of(r):
                                if isinstance(ev, dict):
                                    assert "error" not in ev or ev["error"]["type"] != "server_error", ev
                                    if ev.get("choices"):
                                        text.append(sse.content(ev))
                                        n += 1
                                        if leave_after and n >= leave_after:
                                            break  # the client vanishes mid-answer
                            if not leave_after and r.status_code == 200:
                                histories[sid] = msgs + [{"role": "assistant", "content": "".join(text)}]
                    else:
                        r = c.post("/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
                        statuses.append(r.status_code)
                        if r.status_code == 200:
                            histories[sid] = msgs + [r.json()["choices"][0]["message"]]

        with cf.ThreadPoolExecutor(6) as pool:
            list(pool.map(client, range(6)))
        health = live.wait_idle(timeout=60)
        assert health["status"] == "ok"
        assert set(statuses) <= {200, 204, 400, 404, 429}, statuses
        assert statuses.count(200) >= 10
        assert "error" not in health["engine"]["finished"], health["engine"]
        assert live.chat([SYSTEM, {"role": "user", "content": "Say ok."}], max_tokens=3).status_code == 200
        assert "Traceback" not in live.log()
    finally:
        assert live.stop() == 0
