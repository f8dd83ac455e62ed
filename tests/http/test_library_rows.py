"""A table passage reaches the model a cell a line, each cell named by its row and column
(library/rows.py), over HTTP on the real reader and store: the client is sent the passage
as stored, and the sources' budget counts what the model is shown."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, serving
from helpers.library import FakeEmbedService, ready, upload

from appliance.documents.reader import DocumentReader
from appliance.library.cite import block
from appliance.library.library import Library, LibraryLimits
from appliance.library.store import Found, LibraryStore

TABLE = "\n".join(["Daily allowance abroad by city and grade.",
                   "City | Grades E1–E3 | Grades E4–E5", "Paris | €58 | €66", "Berlin | €52 | €61"])
PROSE = "The daily allowance abroad in Berlin is paid for each night away, by grade."
QUESTION = "What daily allowance does grade E4 get in Berlin abroad?"


def cost(title: str, text: str) -> int:
    """A source's cost in the fake's tokens (a character each), as http/retrieval.py counts it."""
    return len(block(1, Found(0, "", title, None, text), QUESTION) + "\n\n")


def asked(tmp_path: Path, budget: int) -> tuple[list[dict[str, object]], str]:
    """The sources sent and what the model read, for QUESTION over the two documents."""
    service = FakeEmbedService()
    limits = dataclasses.replace(LibraryLimits(), budget_tokens=budget)
    library = Library(LibraryStore(tmp_path), DocumentReader(), service.embed, service.embed_sync, limits)
    model = FakeModel(reply="€61 [1].")
    with serving(lambda: model, embedder=service, ctx=2048, library=library) as client:
        for name, text in (("rates", TABLE), ("rule", PROSE)):
            assert upload(client, "/admin/library", f"{name}.txt", text.encode()).status_code == 202
        ready(client, "/admin/library")
        since = len(model.calls)
        r = client.post(CHAT, json={"messages": [{"role": "user", "content": QUESTION}], "library": True})
        assert r.status_code == 200, r.text
        # The fake's token is a character: what it was given, read back.
        return r.json()["sources"], "".join(map(chr, (t for tokens, *_ in model.calls[since:] for t in tokens if t)))


def test_the_model_reads_the_table_a_cell_a_line_and_the_client_gets_it_as_stored(tmp_path: Path) -> None:
    sources, read = asked(tmp_path, 10_000)
    assert {s["title"] for s in sources} == {"rates", "rule"}
    # The cell the question names first (its row and column), then those naming one of them.
    table = "Berlin, Grades E4–E5: €61\nParis, Grades E4–E5: €66\nBerlin, Grades E1–E3: €52\nParis, Grades E1–E3: €58"
    assert f"Daily allowance abroad by city and grade.\n{table}\n" in read
    assert "Berlin | €52 | €61" not in read
    assert [s["text"] for s in sources if s["title"] == "rates"] == [TABLE]


@pytest.mark.parametrize("short, given", [(0, 2), (1, 1)])
def test_the_budget_counts_the_table_as_shown(tmp_path: Path, short: int, given: int) -> None:
    """Room for both as stored but one token short of both as shown: one is given (the best,
    even past the budget); room for both as shown: both."""
    shown = cost("rates", TABLE) + cost("rule", PROSE)
    assert len(f"[1] rates:\n{TABLE}\n\n") + cost("rule", PROSE) < shown - 1
    sources, _ = asked(tmp_path, shown - short)
    assert len(sources) == given
