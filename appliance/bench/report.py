"""The report printed after a run: fixed-width or Markdown tables (per level, per turn, per
--prompt-mix size, a burst's answers back, a soak's RSS) with ratio rows."""

from __future__ import annotations

from typing import Any

from appliance.bench.results import LevelResult, level_ratios


def _ratio_row(b: str, labels: list[str]) -> str:
    return "ratio" if len(labels) == 2 else f"ratio {b}"


_COLUMNS = [("ok", "completed", 5), ("rej", "rejected", 5), ("fail", "failed", 5),
            ("tok/s", "tokens_per_s", 8), ("req/min", "requests_per_min", 8),
            ("ttft50", "ttft_ms_p50", 8), ("ttft95", "ttft_ms_p95", 8),
            ("e2e50", "e2e_ms_p50", 8), ("e2e95", "e2e_ms_p95", 8),
            ("itl50", "itl_ms_p50", 7), ("itl95", "itl_ms_p95", 7),
            ("itl95@long", "itl_ms_p95_during_long", 11), ("itlmax@long", "itl_ms_max_during_long", 12)]
# Shown as a second table when a run had multi-turn conversations.
_TURN_COLUMNS = [("ttft50@1", "turn1_ttft_ms_p50", 10), ("ttft95@1", "turn1_ttft_ms_p95", 10),
                 ("ttft50@2+", "later_ttft_ms_p50", 11), ("ttft95@2+", "later_ttft_ms_p95", 11)]
# Which _ratios entry the ratio row shows under which column.
_RATIO_OF = {"tokens_per_s": "tokens_per_s", "ttft_ms_p50": "ttft_p50",
             "later_ttft_ms_p50": "later_ttft_p50"}
# --workload office: what an office feels (docs/benchmarks/office.md defines every column).
_OFFICE_COLUMNS = [("ok", "completed", 5), ("rej", "rejected", 5), ("fail", "failed", 5),
                   ("tok/s", "tokens_per_s", 8), ("req/min", "requests_per_min", 8),
                   ("ttft50", "ttft_ms_p50", 8), ("ttft95", "ttft_ms_p95", 8), ("ttft99", "ttft_ms_p99", 8),
                   ("utok50", "user_tokens_per_s_p50", 8), ("utok10", "user_tokens_per_s_p10", 8),
                   ("fair", "fairness_ttft_p50", 7)]
_OFFICE_TURN_COLUMNS = [(f"ttft{q}@{h}", f"{k}_ttft_ms_p{q}", 11) for h, k in (("1", "turn1"), ("2+", "later"))
                        for q in (50, 95, 99)]
_OFFICE_RATIO_OF = {**_RATIO_OF, "ttft_ms_p95": "ttft_p95", "ttft_ms_p99": "ttft_p99",
                    "user_tokens_per_s_p10": "user_tokens_per_s_p10", "fairness_ttft_p50": "fairness_ttft_p50"}


# Small numbers (per-user tokens/s ~2-6, fairness ~1-10) shown to 0.01, the rest to 0.1.
_TWO_DECIMALS = {"user_tokens_per_s_p50", "user_tokens_per_s_p10", "fairness_ttft_p50"}


def _cell(v: Any, width: int = 0, digits: int = 1) -> str:
    if v is None:
        return "-".rjust(width)
    return (f"{v:.{digits}f}" if isinstance(v, float) else str(v)).rjust(width)


def _render(head: list[str], rows: list[list[str]], note: str, markdown: bool,
            widths: list[int] | None = None) -> list[str]:
    """Rows of cells as a fixed-width table (conc, server, then right-aligned columns) or as
    Markdown, where columns with nothing in them are left out."""
    if markdown:
        keep = [i for i in range(len(head)) if i < 2 or any(r[i] not in ("", "-") for r in rows)]
        line = lambda cells: "| " + " | ".join(cells[i] for i in keep) + " |"
        return ([line(head), "|" + "|".join(":---" if i == 1 else "---:" for i in keep) + "|"]
                + [line(r) for r in rows] + ["", f"({note})"])
    if widths is None:
        widths = [max(len(x) for x in col) + (2 if i > 1 else 0)
                  for i, col in enumerate(zip(head, *rows, strict=True))]
    fixed = lambda cells: (cells[0].rjust(widths[0]) + "  " + cells[1].ljust(widths[1])
                           + "".join(x.rjust(w) for x, w in zip(cells[2:], widths[2:], strict=True)))
    return [fixed(head) + f"   ({note})"] + [fixed(r).rstrip() for r in rows]


def _table(done: dict[int, dict[str, LevelResult]], labels: list[str],
           columns: list[tuple[str, str, int]], lw: int, note: str, markdown: bool = False,
           ratio_of: dict[str, str] = _RATIO_OF) -> list[str]:
    rows = []
    for c, level in done.items():
        for lb in labels:
            if lb in level:
                s = level[lb].summary()
                rows.append([str(c), lb] + [_cell(s[k], digits=2 if k in _TWO_DECIMALS else 1) for _, k, _ in columns])
        for b, r in level_ratios(level, labels).items():
            rows.append([str(c), _ratio_row(b, labels)]
                        + [f"{v:.2f}x" if (v := r.get(ratio_of.get(k, ""))) is not None else ""
                           for _, k, _ in columns])
    head = ["conc", "server"] + [h for h, _, _ in columns]
    return _render(head, rows, note, markdown, [4, lw] + [w for *_, w in columns])


def _pad_table(done: dict[int, dict[str, LevelResult]], labels: list[str], lw: int,
               markdown: bool = False, what: str = "--prompt-mix document") -> list[str]:
    columns = [("ok", "completed", 5), ("prompt", "prompt_tokens", 8),
               ("ttft50", "ttft_ms_p50", 8), ("ttft95", "ttft_ms_p95", 8)]
    rows = [[str(c), lb, pad] + [_cell(s[k]) for _, k, _ in columns]
            for c, level in done.items() for lb in labels
            for pad, s in (level[lb].by_pad() if lb in level else {}).items()]
    return _render(["conc", "server", "pad"] + [h for h, _, _ in columns], rows,
                   f"turn 1 by {what}, tokens; times in ms", markdown,
                   [4, lw, 6] + [w for *_, w in columns])


def _burst_table(done: dict[int, dict[str, LevelResult]], labels: list[str], markdown: bool) -> list[str]:
    rows = []
    for c, level in done.items():
        for lb in labels:
            if lb in level:
                s = level[lb].summary()
                rows.append([str(c), lb, f"{s['completed']}/{s['requests']}", _cell(s["last_answer_s"]),
                             _cell(s["ttft_ms_p50"]), _cell(s["ttft_ms_p95"]), _cell(s["tokens_per_s"])])
    return _render(["burst", "server", "back", "last s", "ttft50", "ttft95", "tok/s"], rows,
                   "answers back of those sent at once; seconds until the last one; TTFT in ms",
                   markdown)


def _soak_table(done: dict[int, dict[str, LevelResult]], labels: list[str], markdown: bool) -> list[str]:
    rows = []
    for c, level in done.items():
        for lb in labels:
            if lb in level:
                lv = level[lb]
                rss = lv.rss_points()
                growth = (f"{(rss['end'] - rss['warm']) / rss['warm'] * 100:+.1f}%"
                          if rss["end"] is not None and rss["warm"] else "-")
                rows.append([str(c), lb, str(len(lv.results)), str(len(lv.completed)),
                             str(lv.num_rejected), str(lv.num_failed), _cell(round(lv.wall_s, 1)),
                             *(_cell(rss[k]) for k in ("start", "warm", "end", "max")), growth])
    warm = next((lv.warmup_s for level in done.values() for lv in level.values()), 0.0)
    return _render(["conc", "server", "tried", "answered", "refused", "failed", "s",
                    "rss0", "rss@warm", "rss end", "rss max", "end/warm"], rows,
                   f"refused = 429/503; RSS in MiB before the load, {warm:g} s into it, after it, "
                   "highest", markdown)


def format_report(done: dict[int, dict[str, LevelResult]], labels: list[str], *,
                  workload: str = "chat", markdown: bool = False) -> str:
    """Fixed-width (or Markdown) tables: per turn if multi-turn, per document size if
    --prompt-mix, a burst's answers back, a soak's RSS; ratio rows are >1 when the first is better."""
    lw = max(len(lb) for lb in labels + [_ratio_row(b, labels) for b in labels[1:]] + ["ratio"])
    if workload == "office":
        return "\n".join(_office(done, labels, lw, markdown))
    lines = _table(done, labels, _COLUMNS, lw, "times in ms", markdown)
    multi_turn = any(r.turn > 1 for level in done.values() for lv in level.values()
                     for r in lv.results)
    if multi_turn:
        lines += [""] + _table(done, labels, _TURN_COLUMNS, lw, "TTFT of turn 1 / turns 2+, ms", markdown)
    if any(lv.by_pad() for level in done.values() for lv in level.values()):
        lines += [""] + _pad_table(done, labels, lw, markdown)
    if workload == "burst" and done:
        lines += [""] + _burst_table(done, labels, markdown)
    if workload == "soak" and done:
        lines += [""] + _soak_table(done, labels, markdown)
    lines += _ratio_legend(labels, ", ttft50@2+ = {b}/{a}" if multi_turn else "") + _failures(done, labels)
    return "\n".join(lines)


def _ratio_legend(labels: list[str], later: str, more: str = "") -> list[str]:
    if len(labels) < 2:
        return []
    a, b, x = labels[0], labels[1], ("" if len(labels) == 2 else " X")
    b = b if len(labels) == 2 else "X"
    return [f"ratio{x}: tok/s = {a}/{b}, ttft50 = {b}/{a}{(later + more).format(a=a, b=b)} (>1 = {a} is better)"]


def _failures(done: dict[int, dict[str, LevelResult]], labels: list[str]) -> list[str]:
    notes = [f"  c={c} {lb}: " + ", ".join(f"{r} x{n}" for r, n in why.items())
             for c, level in done.items() for lb in labels
             if lb in level and (why := level[lb].failure_reasons)]
    return ["failures:"] + notes if notes else []


def _office(done: dict[int, dict[str, LevelResult]], labels: list[str], lw: int, markdown: bool) -> list[str]:
    """The office tables: the run, TTFT of first and later turns, turn 1 with a document or not."""
    lines = _table(done, labels, _OFFICE_COLUMNS, lw,
                   "conc = users; rej = refused 429/503; times in ms; utok = per-user tokens/s while "
                   "streaming; fair = worst user's median TTFT / best user's", markdown, _OFFICE_RATIO_OF)
    lines += [""] + _table(done, labels, _OFFICE_TURN_COLUMNS, lw, "TTFT of turn 1 / turns 2+, ms",
                           markdown, _OFFICE_RATIO_OF)
    if any(lv.by_pad() for level in done.values() for lv in level.values()):
        lines += [""] + _pad_table(done, labels, lw, markdown, "pasted document (0 = a question)")
    lines += _engine_table(done, labels, markdown) + _estimates(done, labels) + _tasks(done, labels)
    more = ", ttft95/99 = {b}/{a}, utok10 = {a}/{b}, fair = {b}/{a}"
    return lines + _ratio_legend(labels, ", ttft50@2+ = {b}/{a}", more) + _failures(done, labels)


def _tasks(done: dict[int, dict[str, LevelResult]], labels: list[str]) -> list[str]:
    """--front-end-tasks: the title and tags requests beside the people's turns."""
    out = [f"{c} {lb}: {t['tasks']} front-end tasks, {t['tasks_failed']} failed; end-to-end p50 "
           f"{t['tasks_e2e_ms_p50']} ms, p95 {t['tasks_e2e_ms_p95']} ms"
           for c, level in done.items() for lb in labels if lb in level and (t := level[lb].task_summary())["tasks"]]
    return ([""] + out) if out else []


def _estimates(done: dict[int, dict[str, LevelResult]], labels: list[str]) -> list[str]:
    """How the queue notes' wait estimates came true, where a server sent them."""
    out = []
    for c, level in done.items():
        for lb in labels:
            e = level[lb].estimates() if lb in level else None
            if e and e["eta_checked"]:
                out.append(f"{c} {lb}: {e['eta_checked']} waits of 2 s or more after a queue note; actual/estimated "
                           f"p10 {e['eta_ratio_p10']}, p50 {e['eta_ratio_p50']}, p90 {e['eta_ratio_p90']}; "
                           f"within 30 %: {e['eta_within_30pct']:.0%}")
    return ([""] + out) if out else []


_ENGINE_COLUMNS = [("decode", "decode_share"), ("sample", "sample_share"), ("admit", "admit_share"),
                   ("other", "other_share"), ("idle", "idle_share"), ("steps", "steps"),
                   ("rows/step", "rows_per_step"), ("dec/step", "decode_rows_per_step"),
                   ("prefill", "prefill_rows"), ("gen", "generated"), ("rows/s", "decode_rows_per_s"),
                   ("restored", "restored"), ("recomp", "recomputed"), ("slotwait", "slot_wait_ms_mean")]


def _engine_table(done: dict[int, dict[str, LevelResult]], labels: list[str], markdown: bool) -> list[str]:
    """Where the engine's wall time went (servers that publish it: the appliance's /metrics)."""
    rows = []
    for c, level in done.items():
        for lb in labels:
            e = level[lb].summary()["engine"] if lb in level else None
            if e:
                rows.append([str(c), lb] + [_cell(e[k], 0, 3 if k.endswith("_share") else 1 if isinstance(e[k], float)
                                                   and k.endswith(("step", "_s", "mean")) else 0)
                                            for _, k in _ENGINE_COLUMNS])
    if not rows:
        return []
    head = ["conc", "server"] + [h for h, _ in _ENGINE_COLUMNS]
    return [""] + _render(head, rows, "engine wall time by phase (share of the run's wall time), batch rows; "
                                      "rows/s = rows per second inside llama_decode; slotwait = mean ms to a slot",
                          markdown)
