"""The results as data: the --json report, the --jsonl lines (one per level per server), and
reading --jsonl files back for --plot --from."""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from typing import Any

from appliance.bench.results import LevelResult, level_ratios

_MEDIAN_KEYS = ("tokens_per_s", "ttft_ms_p50", "later_ttft_ms_p50")
# The office's figures (issue 25 compares servers by the median of two rounds of these).
_OFFICE_MEDIAN_KEYS = ("completed", "rejected", "failed", "requests_per_min", "ttft_ms_p95", "ttft_ms_p99",
                       "turn1_ttft_ms_p50", "turn1_ttft_ms_p95", "turn1_ttft_ms_p99",
                       "later_ttft_ms_p95", "later_ttft_ms_p99",
                       "user_tokens_per_s_p50", "user_tokens_per_s_p10", "fairness_ttft_p50")


def _median_of_rounds(parts: list[LevelResult], office: bool = False) -> dict[str, float | None]:
    """Each round measured on its own, then the median across rounds: robust to one noisy round."""
    summaries = [p.summary() for p in parts]

    def med(key: str) -> float | None:
        vals = [v for s in summaries if (v := s[key]) is not None]
        return round(statistics.median(vals), 2) if vals else None

    return {key: med(key) for key in _MEDIAN_KEYS + (_OFFICE_MEDIAN_KEYS if office else ())}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    soak, office = args.workload == "soak", args.workload == "office"
    return {"workload": args.workload,
            "prompt_mix": list(args.prompt_mix) if args.prompt_mix else None,
            "max_tokens": args.max_tokens, "temperature": args.temperature,
            "rounds": args.rounds, "arrival": args.arrival,
            "long_prompt_tokens": args.long_prompt_tokens,
            "fresh_system": args.fresh_system, "turns": args.turns,
            "think_s": args.think_s, "session_ids": args.session_ids,
            "requests": args.requests, "timeout": args.timeout,
            "duration_s": args.duration_s if soak or office else None,
            "warmup_s": args.warmup_s if soak else None,
            "rss_every_s": args.rss_every_s if soak else None,
            "office": {"seed": args.seed, "doc_share": args.doc_share, "doc_tokens": args.doc_tokens,
                       "follow_ups": args.follow_ups} if office else None}


def json_report(args: argparse.Namespace, targets: list[tuple[str, str]],
                 models: dict[str, str], done: dict[int, dict[str, LevelResult]],
                 rounds: dict[int, dict[str, list[LevelResult]]] | None = None) -> dict[str, Any]:
    labels = [lb for lb, _ in targets]
    levels = []
    for c, level in done.items():
        entry: dict[str, Any] = {"concurrency": c,
                                 "results": {lb: lv.summary() for lb, lv in level.items()}}
        ratios = level_ratios(level, labels)
        if len(labels) == 2 and ratios:
            entry["ratio"] = ratios[labels[1]]
        if ratios:
            entry["ratios"] = ratios  # {other server: first vs it}
        office = args.workload == "office"
        if rounds and args.rounds > 1:
            entry["median_of_rounds"] = {lb: _median_of_rounds(parts, office) for lb, parts in rounds[c].items()}
        if rounds and office:  # every request and the timeline, round by round (what --plot draws)
            entry["office_rounds"] = {lb: [p.detail() for p in parts] for lb, parts in rounds[c].items()}
        levels.append(entry)
    return {
        "servers": [{"label": lb, "url": url, "model": models.get(lb)} for lb, url in targets],
        "settings": _settings(args),
        "percentiles": "linear interpolation between closest ranks",
        "levels": levels,
    }


def jsonl_records(args: argparse.Namespace, targets: list[tuple[str, str]],
                  models: dict[str, str], done: dict[int, dict[str, LevelResult]]) -> list[dict[str, Any]]:
    """One record per level per server: the summary, what was run, and (for every server but
    the first) the first one's ratios against it."""
    labels = [lb for lb, _ in targets]
    urls = dict(targets)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = []
    for level in done.values():
        ratios = level_ratios(level, labels)
        for lb in labels:
            if lb in level:
                rec = {"time": when, "tag": args.tag, "workload": args.workload, "url": urls[lb],
                       "model": models.get(lb), **level[lb].summary(), "settings": _settings(args)}
                if lb in ratios:
                    rec["ratio"] = {"of": labels[0], **ratios[lb]}
                records.append(rec)
    return records


def read_jsonl(paths: list[str]) -> list[dict[str, Any]]:
    """Every record of the given --jsonl files, in order; blank lines are skipped."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise ValueError(f"{path}:{n}: not a JSON line") from None
                if not isinstance(rec, dict) or not {"label", "concurrency"} <= rec.keys():
                    raise ValueError(f"{path}:{n}: not an `appliance bench --jsonl` record")
                records.append(rec)
    return records
