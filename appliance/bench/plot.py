"""--plot: tokens/s and TTFT p50 against clients, or (office) the queue and each answer's TTFT
over time, drawn with matplotlib (imported only here, only when asked for)."""

from __future__ import annotations

import importlib
import math
from typing import Any


class PlotError(Exception):
    """--plot cannot draw: matplotlib is missing, or there is nothing to draw."""


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'appliance[plot]' "
                        "(.venv/bin/pip install -e '.[plot]')") from None
    matplotlib.use("Agg")  # files only: no display needed
    return importlib.import_module("matplotlib.pyplot")


def plot(records: list[dict[str, Any]], path: str) -> None:
    """tokens/s and TTFT p50 against clients: one colour per server, one line style per run
    (--tag, else workload); a later record of the same line and level replaces an earlier one."""
    pyplot = _pyplot()
    if not records:
        raise PlotError("nothing to plot")
    series: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in records:
        run = str(r.get("tag") or r.get("workload") or "")
        series.setdefault((str(r["label"]), run), {})[int(r["concurrency"])] = r
    labels = list(dict.fromkeys(lb for lb, _ in series))
    runs = list(dict.fromkeys(run for _, run in series))

    def values(points: dict[int, dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
        return [v * scale if isinstance(v := points[x].get(key), int | float) else math.nan
                for x in sorted(points)]

    fig, (tps, ttft) = pyplot.subplots(1, 2, figsize=(8.0, 3.4), dpi=100)
    for (label, run), points in series.items():
        xs = sorted(points)
        style = {"marker": "o", "color": f"C{labels.index(label) % 10}",
                 "linestyle": ("-", "--", ":", "-.")[runs.index(run) % 4],
                 "label": label + (f" ({run})" if len(runs) > 1 else "")}
        tps.plot(xs, values(points, "tokens_per_s"), **style)
        ttft.plot(xs, values(points, "ttft_ms_p50", 1e-3), **style)
    clients = sorted({x for points in series.values() for x in points})
    for ax, title, ylabel in ((tps, "Throughput", "tokens/s, all clients"),
                              (ttft, "Time to first token", "TTFT p50, s (log)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("clients")
        ax.set_ylabel(ylabel)
        ax.set_xticks(clients)
        ax.grid(alpha=0.3)
    tps.set_ylim(bottom=0)
    # A server that queues requests one by one is 10-100x slower to its first token at 8
    # clients than one that batches: on a linear axis the batching servers merge into one line.
    ttft.set_yscale("log")
    handles, names = tps.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * ((len(names) + 2) // 3) + 0.02, 1, 1))
    fig.savefig(path)
    pyplot.close(fig)


def plot_office(reports: list[dict[str, Any]], path: str) -> None:
    """An office run (the first --json report's first level): one panel per server, its first
    round over time: the server's /health queue (or, when it has none, the requests in flight
    as the client counts them) and each answer's TTFT as a point at the time it was sent."""
    pyplot = _pyplot()
    level = next((lv for r in reports for lv in r.get("levels", []) if lv.get("office_rounds")), None)
    if level is None:
        raise PlotError("nothing to plot")
    runs = {lb: rounds[0] for lb, rounds in level["office_rounds"].items() if rounds}
    fig, axes = pyplot.subplots(len(runs), 1, figsize=(8.0, 2.4 * len(runs) + 0.6), dpi=100,
                                sharex=True, squeeze=False)
    for ax, (label, run) in zip(axes[:, 0], runs.items(), strict=True):
        _office_panel(ax, label, run)
    axes[-1, 0].set_xlabel("seconds into the run")
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)


def _office_panel(ax: Any, label: str, run: dict[str, Any]) -> None:
    ts = [t for t, _, _ in run["timeline"]]
    queue = [q for _, _, q in run["timeline"]]
    in_flight = [n for _, n, _ in run["timeline"]]
    if any(q is not None for q in queue):
        ax.step(ts, [math.nan if q is None else q for q in queue], where="post", color="C0", label="queue (/health)")
        ax.step(ts, in_flight, where="post", color="C0", alpha=0.35, linestyle="--", label="in flight (client)")
    else:  # llama-server's /health has no queue: what the client sees is all there is
        ax.step(ts, in_flight, where="post", color="C0", label="in flight (client)")
    ax.set_ylabel("requests")
    ax.set_ylim(bottom=0)
    ax.set_title(label, fontsize=10)
    ax.grid(alpha=0.3)
    ttft = ax.twinx()
    for later, colour, name in ((False, "C1", "TTFT, first turn"), (True, "C2", "TTFT, later turn")):
        points = [(r["t_start"], r["ttft_ms"] / 1000.0) for r in run["requests"]
                  if r["ok"] and r["ttft_ms"] is not None and (r["turn"] > 1) == later]
        ttft.scatter([x for x, _ in points], [y for _, y in points], s=9, color=colour, label=name)
    ttft.set_ylabel("TTFT, s")
    ttft.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + ttft.get_legend_handles_labels()[0]
    ax.legend(handles, [str(h.get_label()) for h in handles], loc="upper left", fontsize=7, frameon=False)
