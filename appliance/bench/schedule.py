"""The office workload's schedule: per user, a seeded endless series of conversations (a
question or a pasted document to summarise, then follow-ups) with exponential think times.
Pure: the same seed and user give the same conversations, whichever server they are sent to."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from appliance.bench.prompts import DOC_ASKS, DOC_FOLLOW_UPS, FOLLOW_UPS, PROMPTS, long_document


@dataclass(frozen=True, slots=True)
class Office:
    """The knobs of the office mix (--seed, --doc-share, --doc-tokens, --follow-ups, --think-s)."""

    seed: int = 0
    doc_share: float = 1 / 9  # share of conversations that open with a pasted document
    doc_tokens: int = 700  # ~size of that document
    follow_ups: int = 3  # a conversation has 1..follow_ups follow-ups (uniform)
    think_s: float = 6.0  # mean of the exponential pause before each turn


@dataclass(frozen=True, slots=True)
class Turn:
    think_s: float  # pause before sending: after the previous answer, or at the user's start
    text: str  # the user message


@dataclass(frozen=True, slots=True)
class Conversation:
    index: int  # the user's 0-based conversation number
    doc_tokens: int  # 0 = opened with a question, else ~tokens of the pasted document
    turns: tuple[Turn, ...]


def _think(rng: random.Random, mean_s: float) -> float:
    return rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0


def conversations(office: Office, user: int, salt: str = "") -> Iterator[Conversation]:
    """User `user`'s conversations, endlessly. `salt` (the round) changes only the documents'
    nonces, so a round cannot find the previous round's documents cached; within a round every
    server gets the same texts and pauses."""
    # String seeds are hashed with SHA-512: stable across runs and Python versions.
    rng = random.Random(f"office:{office.seed}:{user}")
    k = 0
    while True:
        doc = rng.random() < office.doc_share
        if doc:
            nonce = f"{salt}{rng.getrandbits(64):016x}"
            first = f"{long_document(office.doc_tokens, nonce)}\n\n{rng.choice(DOC_ASKS)}"
            pool = DOC_FOLLOW_UPS
        else:
            first, pool = rng.choice(PROMPTS), FOLLOW_UPS
        n = rng.randint(1, office.follow_ups) if office.follow_ups > 0 else 0
        texts = [first, *rng.sample(pool, min(n, len(pool)))]
        turns = tuple(Turn(_think(rng, office.think_s), text) for text in texts)
        yield Conversation(k, office.doc_tokens if doc else 0, turns)
        k += 1
