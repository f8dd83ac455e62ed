"""A ~3,000-token document on the real appliance: its stream hears `: prompt N/M` notes
while the prompt is read (rising, ending at the prompt's length, all before the first
token), and a follow-up question about it takes the document from the KV cache and reads
only what is new (no notes). The times are printed, never asserted (benchmarks measure)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.live import Live, live_server
from helpers.sse import events_of

from appliance.bench import sse

pytestmark = pytest.mark.integration

FACT = "The project code word is PERIWINKLE-42."
NOTE = re.compile(r"prompt (\d+)/(\d+)")
QUESTION = "What is the project code word? Answer with the word only."


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    # The defaults but for fewer slots (ctx_per_slot 4,096, batch_tokens 512, prefill_chunk 64).
    with live_server(tmp_path_factory.mktemp("progress"), model=bundled_model, slots=4) as server:
        yield server


def document() -> str:
    lines = [f"Item {i}: the committee reviewed budget line {i * 7} and agreed to revisit it in week {i % 52}."
             for i in range(120)]
    lines.insert(60, FACT)
    return "Minutes of the planning committee.\n" + "\n".join(lines)


def streamed(live: Live, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed answer: its prompt notes with their times (s after the request), the
    first token's time, the text and the usage."""
    body = {"messages": messages, "stream": True, "max_tokens": 24, "temperature": 0,
            "stream_options": {"include_usage": True}}
    notes: list[tuple[int, int, float]] = []
    out: dict[str, Any] = {"notes": notes, "first": 0.0, "text": "", "usage": {}, "after_text": 0}
    t0 = time.monotonic()
    with live.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for ev in events_of(r, comments=True):
            if isinstance(ev, sse.Comment):
                m = NOTE.fullmatch(ev.text)
                if m:
                    notes.append((int(m[1]), int(m[2]), time.monotonic() - t0))
                    out["after_text"] += bool(out["first"])
            elif isinstance(ev, dict):
                if sse.content(ev) and not out["first"]:
                    out["first"] = time.monotonic() - t0
                out["text"] += sse.content(ev)
                out["usage"] = ev.get("usage") or out["usage"]
    return out


def test_a_long_document_reports_progress_and_a_follow_up_reads_it_from_the_cache(live: Live) -> None:
    doc = document()
    n_doc = len(live.client.post("/tokenize", json={"content": doc, "parse_special": False}).json()["tokens"])
    assert 2500 < n_doc < 3600, n_doc
    messages = [{"role": "user", "content": f"Attached file: minutes.txt\n```\n{doc}\n```\n\n{QUESTION}"}]
    first = streamed(live, messages)
    notes, prompt = first["notes"], first["usage"]["prompt_tokens"]
    # One note per step that read some of it, the last one again each quiet second.
    assert len({done for done, _, _ in notes}) >= 3, notes
    assert all(total == prompt for _, total, _ in notes) and notes[-1][0] == prompt, (notes, prompt)
    assert all(a[0] <= b[0] for a, b in zip(notes, notes[1:])), notes
    assert first["first"] and first["after_text"] == 0 and notes[-1][2] <= first["first"], first
    print(f"\n{prompt}-token prompt ({n_doc} in the document): first progress note {notes[0][2]:.2f} s "
          f"({notes[0][0]} tokens), first token {first['first']:.2f} s, "
          f"{len({d for d, _, _ in notes})} steps' notes; answer {first['text']!r}")

    follow = messages + [{"role": "assistant", "content": first["text"]},
                         {"role": "user", "content": "And who reviewed the budget lines?"}]
    second = streamed(live, follow)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= prompt > n_doc, (cached, prompt, n_doc)  # the whole first turn, document included
    assert second["notes"] == [], second["notes"]  # only the new question was read: one short step
    print(f"follow-up: {second['usage']['prompt_tokens']} prompt tokens, {cached} cached, "
          f"first token {second['first']:.2f} s")
