"""The Workload of a level (what every request sends) and the messages of conversation k."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from appliance.bench.prompts import DEFAULT_SYSTEM, FOLLOW_UPS, PROMPTS, long_document


@dataclass(frozen=True, slots=True)
class Workload:
    """What every request of a level sends; `model` is per server (see resolve_model)."""

    model: str = "default"
    system: str = DEFAULT_SYSTEM
    prompts: tuple[str, ...] = PROMPTS  # conversation k opens with prompts[k % len]
    # Conversation k's turn t+1 sends follow_ups[k % len][(k + t - 1) % len(...)]: one pool
    # for all (chat), or one per prompt (rewrite: prose and code are followed up differently).
    follow_ups: tuple[tuple[str, ...], ...] = (FOLLOW_UPS,)
    # Conversation k's first prompt gets a ~prompt_mix[k % len]-token document up front
    # (0 = none), so users arriving together send prompts of mixed lengths; () = off.
    prompt_mix: tuple[int, ...] = ()
    max_tokens: int = 64
    temperature: float = 0.0
    long_prompt_tokens: int = 0  # 0 = no extra long-paste client
    turns: int = 1  # > 1: each concurrent client is one user holding a conversation this long
    think_s: float = 1.0  # a user's pause between reading an answer and sending the next turn
    # Most OpenAI clients send no session id; the server must then tell users apart by
    # address and prompt prefix, so runs should measure both ways.
    session_ids: bool = True
    # All requests from one address (burst: one person's script); else one per simulated user.
    one_address: bool = False
    # office: after every answer, a chat front-end's title and tags requests (Open WebUI's
    # shape, bench/tasks.py): "" none; "lanes" as Open WebUI sends them (the appliance runs
    # them as background work); "people" the same with `X-Priority: people` (no lanes).
    tasks: str = ""


def fresh_system(system: str) -> str:
    """A random tag up front, so no server can have this system prompt cached already."""
    return f"[run {uuid.uuid4().hex[:8]}] {system}"


def opening(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def first_prompt(workload: Workload, k: int) -> tuple[str, int | None]:
    """Conversation k's opening user message and its --prompt-mix document size (tokens)."""
    prompt = workload.prompts[k % len(workload.prompts)]
    if not workload.prompt_mix:
        return prompt, None
    pad = workload.prompt_mix[k % len(workload.prompt_mix)]
    # The document goes before the question, as a pasted email or log does.
    return (f"{long_document(pad)}\n\n{prompt}" if pad else prompt), pad


def follow_up(workload: Workload, k: int, turn: int) -> str:
    """What conversation k sends after the answer to `turn` (1-based)."""
    pool = workload.follow_ups[k % len(workload.follow_ups)]
    return pool[(k + turn - 1) % len(pool)]
