"""`appliance bench`: its arguments, and run() measuring every level of every server, then
printing and writing what was measured."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from appliance.bench.load import measure, soak
from appliance.bench.office import run_office
from appliance.bench.plot import PlotError, plot, plot_office
from appliance.bench.progress import Progress
from appliance.bench.prompts import (
    BURST_SIZE,
    DEFAULT_LEVELS,
    DEFAULT_SYSTEM,
    OFFICE_SYSTEM,
    PROMPT_SETS,
    PROMPTS,
    REWRITE_PROMPTS,
)
from appliance.bench.records import json_report, jsonl_records, read_jsonl
from appliance.bench.report import format_report
from appliance.bench.results import LevelResult
from appliance.bench.schedule import Office
from appliance.bench.target import resolve_model
from appliance.bench.workload import Workload, fresh_system

# Flags whose default depends on --workload (None on the command line = not given).
_DEFAULTS: dict[str, Any] = {"max_tokens": 64, "think_s": 1.0, "duration_s": 180.0, "system": DEFAULT_SYSTEM}
_WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    "office": {"max_tokens": 96, "think_s": 6.0, "duration_s": 150.0, "system": OFFICE_SYSTEM}}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") \
            from None
    if not values:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    return values


def _concurrency_list(text: str) -> list[int]:
    levels = _int_list(text)
    if min(levels) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return levels


def _prompt_mix(text: str) -> tuple[int, ...]:
    sizes = _int_list(text)
    if min(sizes) < 0:
        raise argparse.ArgumentTypeError("prompt-mix sizes must be token counts >= 0")
    return tuple(sizes)


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def _positive_float(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return x


def _non_negative_float(text: str) -> float:
    x = float(text)
    if not x >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return x


def _share(text: str) -> float:
    """A share as 0.11 or 1/9, in [0, 1]."""
    num, sep, den = text.partition("/")
    try:
        x = float(num) / float(den) if sep else float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a share such as 0.11 or 1/9: {text!r}") from None
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError("a share is between 0 and 1")
    return x


def _compare(text: str) -> tuple[str | None, str]:
    """--compare URL, or LABEL=URL (a label holds no ':' or '/', so a URL's query is no label)."""
    label, sep, url = text.partition("=")
    if sep and label and url and not any(ch in label for ch in ":/"):
        return label, url
    return None, text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_servers(parser)
    _add_workload(parser)
    _add_requests(parser)
    _add_soak(parser)
    _add_office(parser)
    _add_output(parser)


def _add_servers(parser: argparse.ArgumentParser) -> None:
    """The servers measured and their names in the report."""
    a = parser.add_argument
    a("--url", default="http://127.0.0.1:8080", help="server base URL (…/v1 also accepted)")
    a("--compare", metavar="[LABEL=]URL", type=_compare, action="append", default=[],
      help="another server measured in the same run, level by level; repeat for more "
           "(LABEL=URL names it, else --compare-label)")
    a("--label", default="appliance", help="name of --url in the report")
    a("--compare-label", default="peer", help="name of an unlabelled --compare in the report")


def _add_workload(parser: argparse.ArgumentParser) -> None:
    """How many clients, how many requests, and what they ask."""
    a = parser.add_argument
    a("--concurrency", type=_concurrency_list, default=None,
      help="comma-separated concurrency levels (default 1,4,8,16; burst: its size, "
           f"{BURST_SIZE}; soak: 8; office: 20 users)")
    a("--requests", type=_positive_int, default=None,
      help="requests per level per server per round (default max(2*concurrency, 8); "
           "ignored by burst, soak and --turns > 1)")
    a("--workload", choices=tuple(PROMPT_SETS), default="chat",
      help="chat (default): office users asking short questions; with --turns T each client "
           "is one user holding a T-turn conversation that resends its growing history, "
           "pausing --think-s between turns. "
           "rewrite: paste a paragraph with typos or a code "
           "snippet with a bug and ask for it back fixed, so answers mostly copy the prompt "
           "(what n-gram speculative decoding speeds up); later --turns ask for the whole text "
           "again with another small edit. Use --max-tokens 160 --temperature 0 with it. "
           f"Both pick texts round-robin ({len(PROMPTS)} chat, {len(REWRITE_PROMPTS)} rewrite), "
           "so two runs send the same requests. "
           "burst: N requests for a 2-sentence product description let go at once from one "
           "address (one person's list of N products), N = each --concurrency level: reports "
           "how many came back and when the last did, and exits 1 unless all did. "
           "soak: chat at a steady --concurrency (default 8) for --duration-s per server, "
           "sampling the server's RSS (VmRSS of the process listening on a loopback port, or "
           "--pid) every --rss-every-s. "
           "office: --concurrency users (default 20), each on its own address, in seeded "
           "multi-turn conversations for --duration-s (default 150); see docs/benchmarks/office.md")
    a("--prompt-mix", type=_prompt_mix, default=None, metavar="N1,N2,...",
      help="put a ~N-token document before the first prompt of conversation i (request i; "
           "user i with --turns), N = N[i %% len] (0 = none), e.g. 20,60,150,300,600: with --arrival together and "
           "--concurrency 8 this measures TTFT for users arriving at once with prompts of mixed "
           "lengths (reported per size too). Default off")


def _add_requests(parser: argparse.ArgumentParser) -> None:
    """What each request and conversation is like, and how levels are run."""
    a = parser.add_argument
    a("--max-tokens", type=_positive_int, default=None, help="default 64; office: 96")
    a("--temperature", type=float, default=0.0)
    a("--system", default=None, help="shared system prompt (default: an office assistant's; "
                                   "office: a longer office tool's, prompts.OFFICE_SYSTEM)")
    a("--model", default=None, help="model name (default: first id of GET /v1/models)")
    a("--timeout", type=_positive_float, default=300.0, help="seconds per request")
    a("--rounds", type=_positive_int, default=1,
      help="repeat each level, alternating server order per round (A B, B A, ...)")
    a("--arrival", choices=("together", "staggered"), default="together")
    a("--long-prompt-tokens", type=_positive_int, default=0, metavar="N",
      help="one extra client pastes a ~N-token document during each level")
    a("--fresh-system", action="store_true",
      help="tag the system prompt afresh per level, server and round: measures it uncached")
    a("--turns", type=_positive_int, default=1,
      help="> 1: each concurrent client is one user sending T turns of one growing "
           "conversation (--requests is then ignored; a failed turn ends that conversation)")
    a("--think-s", type=_non_negative_float, default=None,
      help="seconds a user pauses between an answer and its next turn (default 1.0); office: "
           "the mean of exponentially distributed pauses, before each turn (default 6)")
    a("--no-session-id", dest="session_ids", action="store_false",
      help="send no X-Session-Id, as most OpenAI clients do (users are then told apart "
           "by source address: on loopback each simulated user has its own 127.0.0.N)")


def _add_soak(parser: argparse.ArgumentParser) -> None:
    """The soak workload's duration and RSS sampling."""
    a = parser.add_argument
    a("--duration-s", type=_positive_float, default=None,
      help="soak, office: seconds of load per server, level and round (default 180; office 150); "
           "no turn starts after it, turns in flight finish")
    a("--warmup-s", type=_non_negative_float, default=30.0,
      help="soak: the 'warm' RSS is the first sample this many seconds into the load (default 30)")
    a("--rss-every-s", type=_positive_float, default=5.0,
      help="soak: seconds between RSS samples (default 5)")
    a("--pid", type=_positive_int, default=None,
      help="soak: pid of the --url server (default: the process listening on its loopback port)")


def _add_office(parser: argparse.ArgumentParser) -> None:
    """The office workload's mix."""
    a = parser.add_argument
    a("--seed", type=int, default=0,
      help="office: seed of every user's questions, documents and think times (default 0): "
           "every server and round gets the same schedule (documents get a fresh nonce per round)")
    a("--doc-share", type=_share, default=1 / 9, metavar="SHARE",
      help="office: share of conversations opening with a pasted document to summarise, "
           "e.g. 1/9 (default) or 0.2; the others open with a short question")
    a("--doc-tokens", type=_positive_int, default=700, help="office: ~tokens of that document (default 700)")
    a("--follow-ups", type=int, choices=range(0, 5), default=3, metavar="N",
      help="office: each conversation has 1..N follow-ups, uniformly (default 3, at most 4), "
           "then the user starts a new one. A refused (429/503) or failed turn is counted and "
           "not retried: it ends its conversation, and the next starts after its think time")
    a("--front-end-tasks", dest="tasks", choices=("lanes", "people"), default="",
      help="office: after every answer, a chat front-end's title and tags requests in Open WebUI's "
           "shape (appliance/bench/tasks.py), counted apart from the people's turns: `lanes` as Open "
           "WebUI sends them (the appliance runs them as background work), `people` the same with "
           "X-Priority: people (what they cost without lanes)")


def _add_output(parser: argparse.ArgumentParser) -> None:
    """Where the results go besides the printed report."""
    a = parser.add_argument
    a("--json", metavar="PATH", help="also write the results as JSON")
    a("--jsonl", metavar="PATH",
      help="append one JSON line per level per server, so several runs can share a file "
           "(what --plot --from reads)")
    a("--tag", default="",
      help="name of this run in --jsonl lines and plot legends; with --from, the runs to draw "
           "(comma-separated; default all)")
    a("--markdown", action="store_true", help="print the report as Markdown tables")
    a("--quiet", action="store_true",
      help="no progress bar on stderr (there is none when stderr is not a terminal)")
    a("--plot", metavar="FILE.png",
      help="draw tokens/s and TTFT p50 against clients, one line per server and --tag: of "
           "this run, or with --from of JSONL files only (nothing is measured then); office: "
           "the server's queue (else the requests in flight) and each answer's TTFT over time, "
           "one panel per server (its first round). Needs matplotlib: pip install 'appliance[plot]'")
    a("--from", dest="plot_from", metavar="PATH", action="append", default=[],
      help="with --plot: a --jsonl file to draw (repeatable)")


def _targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    targets = [(args.label, args.url)]
    unnamed = 0
    for label, url in args.compare:
        if label is None:
            unnamed += 1
            label = args.compare_label if unnamed == 1 else f"{args.compare_label}{unnamed}"
        targets.append((label, url))
    return targets


def run(args: argparse.Namespace) -> int:
    """Entry point of `appliance bench`.

    Exit codes: 0 every server completed requests (burst: all of them), 1 one did not (down,
    always rejecting, or a burst answer missing), 2 bad arguments or no plot, 130 interrupted
    (what was measured is still printed).
    """
    if args.plot_from:
        return _plot_from(args)
    for key, value in {**_DEFAULTS, **_WORKLOAD_DEFAULTS.get(args.workload, {})}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    targets = _targets(args)
    labels = [lb for lb, _ in targets]
    if len(set(labels)) < len(labels):
        print("bench: server labels must differ (--label, --compare-label, LABEL=URL)", file=sys.stderr)
        return 2
    progress = Progress(enabled=False if args.quiet else None)
    # Filled in as levels finish, so Ctrl-C still reports everything measured so far.
    done: dict[int, dict[str, LevelResult]] = {}
    rounds: dict[int, dict[str, list[LevelResult]]] = {}  # the same, round by round
    models: dict[str, str] = {}
    interrupted = False
    try:
        asyncio.run(_run(args, targets, models, done, rounds, progress))
    except KeyboardInterrupt:
        interrupted = True
        progress.end()
        print("\ninterrupted; results so far:")
    print(format_report(done, labels, workload=args.workload, markdown=args.markdown))
    records = _write_results(args, targets, models, done, rounds)
    if args.plot and args.workload == "office":
        # The office plot is a timeline, drawn from what --json holds.
        records = [json_report(args, targets, models, done, rounds)]
    if args.plot and (code := _plot(records, args.plot, plot_office if args.workload == "office" else plot)):
        return code
    if interrupted:
        return 130
    return _exit_code(args, labels, done)


def _plot_from(args: argparse.Namespace) -> int:
    """--plot --from: draw JSONL files of earlier runs, measuring nothing."""
    if not args.plot:
        print("bench: --from goes with --plot", file=sys.stderr)
        return 2
    try:
        records = read_jsonl(args.plot_from)
    except (OSError, ValueError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if args.tag:
        tags = set(args.tag.split(","))
        records = [r for r in records if r.get("tag") in tags]
    return _plot(records, args.plot)


def _write_results(args: argparse.Namespace, targets: list[tuple[str, str]], models: dict[str, str],
                   done: dict[int, dict[str, LevelResult]],
                   rounds: dict[int, dict[str, list[LevelResult]]]) -> list[dict[str, Any]]:
    """--json and --jsonl written; the JSONL records returned (what --plot draws)."""
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(json_report(args, targets, models, done, rounds), f, indent=2)
            f.write("\n")
    records = jsonl_records(args, targets, models, done)
    if args.jsonl:
        with open(args.jsonl, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return records


def _exit_code(args: argparse.Namespace, labels: list[str], done: dict[int, dict[str, LevelResult]]) -> int:
    levels = [lv[lb] for lv in done.values() for lb in labels if lb in lv]
    if args.workload == "burst" and any(len(lv.completed) < len(lv.results) for lv in levels):
        return 1  # every answer of a burst must come back
    completed = [sum(len(lv[lb].completed) for lv in done.values() if lb in lv) for lb in labels]
    return 0 if all(completed) else 1


async def _run(args: argparse.Namespace, targets: list[tuple[str, str]], models: dict[str, str],
               done: dict[int, dict[str, LevelResult]], rounds: dict[int, dict[str, list[LevelResult]]],
               progress: Progress | None = None) -> None:
    for lb, url in targets:
        models[lb] = args.model or await resolve_model(url)
    prompts, follow_ups = PROMPT_SETS[args.workload]
    base = Workload(prompts=prompts, follow_ups=follow_ups, prompt_mix=args.prompt_mix or (),
                    max_tokens=args.max_tokens, temperature=args.temperature,
                    long_prompt_tokens=args.long_prompt_tokens, turns=args.turns,
                    think_s=args.think_s, session_ids=args.session_ids,
                    one_address=args.workload == "burst", tasks=args.tasks)
    for c in args.concurrency or DEFAULT_LEVELS[args.workload]:
        parts: dict[str, list[LevelResult]] = {lb: [] for lb, _ in targets}
        rounds[c] = parts
        for rnd in range(args.rounds):
            # Alternate who goes first so neither server always gets the cooler machine.
            order = targets if rnd % 2 == 0 else targets[::-1]
            for lb, url in order:
                system = fresh_system(args.system) if args.fresh_system else args.system
                wl = replace(base, model=models[lb], system=system)
                parts[lb].append(await _level(args, lb, url, c, wl, rnd, progress))
                done[c] = {k: LevelResult.merge(v) for k, v in parts.items() if v}


async def _level(args: argparse.Namespace, lb: str, url: str, c: int, wl: Workload, rnd: int,
                 progress: Progress | None) -> LevelResult:
    """One server at one level in one round, as --workload asks."""
    if args.workload == "soak":
        return await soak(url, c, wl, args.duration_s, label=lb, timeout=args.timeout,
                          arrival=args.arrival, pid=args.pid if lb == args.label else None,
                          every_s=args.rss_every_s, warmup_s=args.warmup_s, progress=progress)
    if args.workload == "office":
        plan = Office(seed=args.seed, doc_share=args.doc_share, doc_tokens=args.doc_tokens,
                      follow_ups=args.follow_ups, think_s=args.think_s)
        return await run_office(url, c, wl, plan, args.duration_s, label=lb, timeout=args.timeout,
                                salt=f"r{rnd}-", progress=progress)
    n = c if args.workload == "burst" else args.requests or max(2 * c, 8)
    return await measure(url, c, n, wl, label=lb, timeout=args.timeout, arrival=args.arrival,
                         progress=progress)


def _plot(data: Any, path: str, draw: Callable[[Any, str], None] = plot) -> int:
    try:
        draw(data, path)
    except PlotError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    print(f"plot: {path}", file=sys.stderr)
    return 0
