"""How bench/library/eval.py scores an answer of the evaluation set (no server, no model here:
bench/library/eval.py asks, this module judges, tests/bench/test_library_scoring.py checks it).

A question is of one kind: `unanswerable` (the set does not answer it), `table` (read one row
and one column of a table document), `cross` (asked in the other language than its
document's), or `same` (the rest: asked in its document's language). An answer holds the fact
when it contains every answer_contains string; it cites the right document when the document
is among those the server says the answer used (the `used` flags of the `sources` it sends at
the end of the answer), or, when the server sends no such flags, among those of the [n] the
model wrote; it says "the library does not say" when the server's grounding verdict is
not_in_library or unsupported, or when its text says so in either language.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from typing import Any

KINDS = ("same", "cross", "table", "unanswerable")
LANGS = ("en", "zh", "all")
REFUSING_VERDICTS = ("not_in_library", "unsupported")
# What a refusal says, in the model's words or the server's (the prompt asks for "the library
# does not say"; the 0.5B model words it many ways). Lower case; matched anywhere in the answer.
REFUSALS = (
    "does not say", "doesn't say", "do not say", "not in the library", "no information", "not mentioned",
    "does not mention", "doesn't mention", "do not mention", "not specified", "does not specify",
    "doesn't specify", "not provided", "cannot find", "can't find", "could not find", "unable to find",
    "don't have information", "do not have information", "does not contain", "doesn't contain",
    "do not contain", "no mention", "not stated", "does not state", "doesn't state", "not available",
    "没有说", "未说明", "没有说明", "没有提到", "未提到", "没有提及", "未提及", "没有相关", "没有找到",
    "未找到", "找不到", "无法找到", "无法回答", "无法确定", "没有提供", "未提供", "不包含", "没有包含",
    "没有明确", "未明确", "没有具体", "未给出", "没有给出", "没有记载", "未记载",
)
# The server's notes at an answer's end (library/grounding.py): that the library does not say
# it, and the sentence of the sources closest to the question (library/closest.py), each a
# paragraph of its own. What is before them is the model's own words.
NOTES = re.compile(r"(?:\n\n[(（](?:The library does not say this|The closest the sources come|资料库中没有这一说法|"
                   r"来源中最接近的是)[^\n]*)+\Z")
QUOTED = ("The closest the sources come", "来源中最接近的是")
BRACKETS = re.compile(r"[\[【]\s*(\d+(?:\s*[,，、]\s*\d+)*)\s*[\]】]")


def kind(q: dict[str, Any]) -> str:
    if q.get("unanswerable"):
        return "unanswerable"
    if q.get("kind") == "table":
        return "table"
    return "cross" if q.get("cross") else "same"


def holds(q: dict[str, Any], text: str) -> bool:
    """The answer holds the fact: every answer_contains string, case aside."""
    return all(a.lower() in text.lower() for a in q["answer_contains"])


def model_words(text: str) -> str:
    """The answer without the server's notes at its end."""
    return NOTES.sub("", text)


def quoted(text: str) -> bool:
    """The server quoted the sentence of the sources closest to the question."""
    return any(q in text for q in QUOTED)


def hit(found: list[tuple[str, int | None]], q: dict[str, Any], k: int) -> bool:
    """A passage of the question's page among the first k found (a DOCX has no pages: any
    passage of its document counts)."""
    return any(title == q.get("doc") and (page == q.get("page") or page is None) for title, page in found[:k])


def brackets(text: str) -> list[int]:
    """The source numbers the model wrote: [1], [1, 2], [1][3], 【2】."""
    return [int(n) for group in BRACKETS.findall(text) for n in re.split(r"\D+", group) if n]


def cited(answer: dict[str, Any], ids: dict[str, str], quotes: bool = True) -> tuple[set[str], str]:
    """The set's documents the answer is attributed to, and by whom: "server" when the final
    `sources` carry `used` flags (the appliance's attribution, and with `quotes` the source
    it quoted after an answer that does not stand), else "model" (its [n])."""
    final = answer.get("final_sources") or []
    if any("used" in s for s in final):
        return {ids.get(s.get("document", ""), "") for s in final
                if s.get("used") or (quotes and s.get("quoted"))} - {""}, "server"
    given = answer.get("sources") or []
    docs = {ids.get(given[n - 1].get("document", ""), "") for n in brackets(answer["text"]) if 0 < n <= len(given)}
    return docs - {""}, "model"


def refused(answer: dict[str, Any]) -> bool:
    """The answer says the library does not say: by the server's verdict or in its words."""
    verdict = (answer.get("grounding") or {}).get("verdict")
    text = answer["text"].lower()
    return verdict in REFUSING_VERDICTS or any(r in text for r in REFUSALS)


def rate(values: Iterable[bool | None]) -> dict[str, Any] | None:
    got = [v for v in values if v is not None]
    return {"rate": round(sum(got) / len(got), 3), "of": len(got), "yes": sum(got)} if got else None


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Median and 95th percentile (seconds)."""
    got = sorted(v for v in values if v is not None)
    if not got:
        return None
    p95 = statistics.quantiles(got, n=20, method="inclusive")[18] if len(got) > 1 else got[0]
    return {"median": round(statistics.median(got), 2), "p95": round(p95, 2), "of": len(got)}


def groups(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rows by kind and language ("same/en", ..., "answerable/all", "all/all")."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in (*KINDS, "answerable", "all"):
        for lang in LANGS:
            sel = [r for r in rows if (name == "all" or r["kind"] == name or (name == "answerable" and r["kind"] !=
                   "unanswerable")) and (lang == "all" or r["lang"] == lang)]
            if sel:
                out[f"{name}/{lang}"] = sel
    return out


def summarize(rows: list[dict[str, Any]], rates: Iterable[str], times: Iterable[str] = ()) -> dict[str, Any]:
    """For each group of `groups`: the rate of each boolean key and the spread of each time."""
    measures: list[tuple[str, Callable[[Any], Any]]] = [(k, rate) for k in rates]
    measures += [(k, spread) for k in times]
    return {name: {"n": len(sel), **{k: f([r.get(k) for r in sel]) for k, f in measures}}
            for name, sel in groups(rows).items()}


COLUMNS = (("has_fact", "holds the fact"), ("model_has_fact", "in the model's words"),
           ("attached_has_fact", "whole document attached"),
           ("cite_right", "cites the right document"), ("answer_cite_right", "... by the answer alone"),
           ("refused", "says the library does not say"),
           ("hit@3", "hit@3"), ("ttft", "first token (s)"), ("attached_ttft_cold", "attached, cold (s)"))


def cell(value: dict[str, Any] | None) -> str:
    if value is None:
        return ""
    if "rate" in value:
        return f"{value['rate']:.2f} ({value['yes']}/{value['of']})"
    return f"{value['median']:.1f} / {value['p95']:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table, a row a group (rates as "0.50 (4/8)", times as
    "median / p95")."""
    head = "| group | n | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(COLUMNS)]
    for name, got in summary.items():
        lines.append(f"| {name} | {got['n']} | " + " | ".join(cell(got.get(k)) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)
