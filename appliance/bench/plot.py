"""--plot: tokens/s and TTFT p50 against clients, drawn with matplotlib (imported only here,
only when asked for)."""

from __future__ import annotations

import importlib
import math
from typing import Any


class PlotError(Exception):
    """--plot cannot draw: matplotlib is missing, or there is nothing to draw."""


def plot(records: list[dict[str, Any]], path: str) -> None:
    """tokens/s and TTFT p50 against clients: one colour per server, one line style per run
    (--tag, else workload); a later record of the same line and level replaces an earlier one."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'appliance[plot]' "
                        "(.venv/bin/pip install -e '.[plot]')") from None
    matplotlib.use("Agg")  # files only: no display needed
    pyplot = importlib.import_module("matplotlib.pyplot")
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
