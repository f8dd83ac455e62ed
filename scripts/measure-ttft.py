#!/usr/bin/env python3
"""Single-user time to first token: 12 sequential streamed requests (system prompt + a short
question, a new session each), median of the last 10. Usage: measure-ttft.py BASE_URL"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid

import httpx


def main() -> None:
    url = sys.argv[1].rstrip("/")
    ttfts = []
    with httpx.Client(trust_env=False, timeout=60) as c:
        for i in range(12):
            body = {"messages": [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                                 {"role": "user", "content": f"Name a colour number {i}."}],
                    "stream": True, "max_tokens": 4}
            t0 = time.perf_counter()
            with c.stream("POST", url + "/v1/chat/completions", json=body,
                          headers={"X-Session-Id": uuid.uuid4().hex}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        d = json.loads(line[6:])
                        if d.get("choices") and d["choices"][0]["delta"].get("content"):
                            ttfts.append(time.perf_counter() - t0)
                            break
            time.sleep(0.2)
    print(f"median time to first token: {statistics.median(ttfts[2:]) * 1000:.0f} ms "
          f"(all, ms: {[round(t * 1000) for t in ttfts]})")


if __name__ == "__main__":
    main()
