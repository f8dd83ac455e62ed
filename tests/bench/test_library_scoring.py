"""How bench/library/eval.py scores an answer (bench/library/scoring.py): the citation from the
server's attribution when it sends one, else from the [n] the model wrote; "the library does
not say" from the grounding verdict or the answer's words, in either language; the figures by
kind and language."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_path = Path(__file__).resolve().parents[2] / "bench" / "library" / "scoring.py"
_spec = importlib.util.spec_from_file_location("library_scoring", _path)
assert _spec is not None and _spec.loader is not None
scoring = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scoring)

IDS = {"lib_a": "handbook-en", "lib_b": "travel-en"}
GIVEN = [{"n": 1, "document": "lib_b", "page": 3}, {"n": 2, "document": "lib_a", "page": 4}]


def answer(text: str, **extra: Any) -> dict[str, Any]:
    return {"text": text, "sources": GIVEN, "final_sources": GIVEN, "grounding": None, **extra}


def test_kinds() -> None:
    assert scoring.kind({"unanswerable": True, "lang": "en"}) == "unanswerable"
    assert scoring.kind({"kind": "table", "doc": "x"}) == "table"
    assert scoring.kind({"cross": True, "doc": "x"}) == "cross"
    assert scoring.kind({"doc": "x"}) == "same"


def test_the_servers_attribution_wins_over_the_models_brackets() -> None:
    final = [{**GIVEN[0], "used": False, "support": ""}, {**GIVEN[1], "used": True, "support": "27 days"}]
    got = answer("27 days [1]", final_sources=final)
    assert scoring.cited(got, IDS) == ({"handbook-en"}, "server")
    # Flags that say nothing was used: the server stands behind no document, whatever [n] says.
    none_used = [{**s, "used": False} for s in GIVEN]
    assert scoring.cited(answer("27 days [2]", final_sources=none_used), IDS) == (set(), "server")


def test_without_attribution_the_models_brackets_name_the_documents() -> None:
    assert scoring.cited(answer("See [2]."), IDS) == ({"handbook-en"}, "model")
    assert scoring.cited(answer("见【1】和[1, 2]"), IDS) == ({"travel-en", "handbook-en"}, "model")
    # A number beyond the sources given, or no bracket at all, names nothing.
    assert scoring.cited(answer("[3] and [0]"), IDS) == (set(), "model")
    assert scoring.cited(answer("27 days"), IDS) == (set(), "model")


def test_refusal_by_verdict_or_words_in_either_language() -> None:
    assert scoring.refused(answer("14 parking spaces", grounding={"verdict": "unsupported"}))
    assert scoring.refused(answer("", grounding={"verdict": "not_in_library"}))
    assert not scoring.refused(answer("27 days", grounding={"verdict": "supported"}))
    assert not scoring.refused(answer("27 days", grounding={"verdict": "partly"}))
    assert scoring.refused(answer("The library does not say how many spaces there are."))
    assert scoring.refused(answer("资料中没有提到班车的时间。"))
    assert not scoring.refused(answer("班车早上8点发车。"))


def test_summary_by_kind_and_language() -> None:
    rows = [{"id": "a", "lang": "en", "kind": "same", "has_fact": True, "refused": False, "ttft": 1.0},
            {"id": "b", "lang": "zh", "kind": "cross", "has_fact": False, "refused": False, "ttft": 3.0},
            {"id": "c", "lang": "zh", "kind": "unanswerable", "refused": True, "ttft": 2.0}]
    got = scoring.summarize(rows, ["has_fact", "refused"], ["ttft"])
    assert got["answerable/all"]["has_fact"] == {"rate": 0.5, "of": 2, "yes": 1}
    assert got["unanswerable/zh"]["refused"] == {"rate": 1.0, "of": 1, "yes": 1}
    assert got["unanswerable/zh"]["has_fact"] is None and "table/all" not in got
    assert got["all/all"]["ttft"] == {"median": 2.0, "p95": 2.9, "of": 3}
    table = scoring.markdown(got)
    assert "| cross/zh | 1 | 0.00 (0/1) |" in table and "| all/all | 3 |" in table


def test_the_model_words_are_the_answer_without_the_servers_notes() -> None:
    answer_ = "The library does not say."
    note = "\n\n(The library does not say this: 14 is in none of its sources.)"
    quote = "\n\n(The closest the sources come is [2] IT Policy, page 5: “Report it within one hour.”)"
    assert scoring.model_words(answer_ + note + quote) == answer_
    assert scoring.model_words(answer_ + quote) == answer_ and scoring.quoted(answer_ + quote)
    zh = "根据[2]，要提前多久？\n\n（来源中最接近的是 [1] 《员工手册》第3页：“转正后员工须提前30天以书面形式提出。”）"
    assert scoring.model_words(zh) == "根据[2]，要提前多久？" and scoring.quoted(zh)
    assert scoring.model_words("30 days (see [1]).") == "30 days (see [1])." and not scoring.quoted("30 days.")
    # The model's own paragraph that happens to start as a note does is its own, when its words follow.
    own = "\n\n(The library does not say this: it is not stated.)\nBut see the handbook."
    assert scoring.model_words("No." + own) == "No." + own
    q = {"answer_contains": ["30天"]}
    assert scoring.holds(q, zh) and not scoring.holds(q, scoring.model_words(zh))


def test_a_quoted_source_is_the_servers_citation_and_not_the_answers() -> None:
    final = [{**GIVEN[0], "used": False, "quoted": True}, {**GIVEN[1], "used": False, "quoted": False}]
    got = answer("The library does not say.", final_sources=final)
    assert scoring.cited(got, IDS) == ({"travel-en"}, "server")
    assert scoring.cited(got, IDS, quotes=False) == (set(), "server")
