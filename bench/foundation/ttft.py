#!/usr/bin/env python3
"""Single-user time to first token: 12 sequential streamed requests (system prompt + a short
question, a new session each), median of the last 10. Usage: ttft.py BASE_URL"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

import httpx

from appliance.bench import is_loopback, sse, user_address


def main() -> None:
    url = sys.argv[1].rstrip("/")
    ttfts = []
    # The one user arrives from its own address, as in `appliance bench`.
    transport = httpx.HTTPTransport(local_address=user_address(0)) if is_loopback(url) else None
    with httpx.Client(trust_env=False, timeout=60, transport=transport) as c:
        for i in range(12):
            body = {"messages": [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                                 {"role": "user", "content": f"Name a colour number {i}."}],
                    "stream": True, "max_tokens": 4}
            t0 = time.perf_counter()
            with c.stream("POST", url + "/v1/chat/completions", json=body,
                          headers={"X-Session-Id": uuid.uuid4().hex}) as r:
                for ev in sse.iter_events(sse.lines(r.iter_text())):
                    if sse.content(ev):
                        ttfts.append(time.perf_counter() - t0)
                        break
            time.sleep(0.2)
    print(f"median time to first token: {statistics.median(ttfts[2:]) * 1000:.0f} ms "
          f"(all, ms: {[round(t * 1000) for t in ttfts]})")


if __name__ == "__main__":
    main()
