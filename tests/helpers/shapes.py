"""OpenAI chat bodies for one plain choice, built by hand: the shapes tests expect (the
server builds its own from choices.Choice)."""

from __future__ import annotations

from typing import Any


def chunk(cid: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
          **extra: Any) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        **extra,
    }


def completion(cid: str, created: int, model: str, text: str, finish_reason: str,
               use: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": use,
        **extra,
    }
