#!/usr/bin/env python3
"""The table of bench/documents-admin/admin.sh: every run's tokens/s and TTFT p50/p95 (16 clients), the
median of each condition and the ratios with /admin open against without, beside the spread of
the runs without (the noise a difference has to beat).

    .venv/bin/python bench/documents-admin/admin-summary.py OUT
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

KEYS = ("tokens_per_s", "ttft_ms_p50", "ttft_ms_p95", "itl_ms_p95")


def runs(out: Path, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(out.glob(f"{prefix}-*.json")):
        if path.name.endswith(".page.json"):
            continue
        level = json.loads(path.read_text())["levels"][0]
        found.append((path.stem, next(iter(level["results"].values()))))
    return found


def row(name: str, s: dict[str, Any], page: str = "") -> str:
    cells = [f"{s[k]:,.1f}" if s.get(k) is not None else "-" for k in KEYS]
    return f"| {name} | {s.get('completed', '-')}/{s.get('requests', '-')} | " + " | ".join(cells) + f" | {page} |"


def main(out: Path) -> int:
    plain, admin = runs(out, "plain"), runs(out, "admin")
    if not plain or not admin:
        print(f"no runs in {out}")
        return 1
    print("\n| run | ok | tok/s | TTFT p50 ms | TTFT p95 ms | ITL p95 ms | the page |\n|---|---:|---:|---:|---:|---:|---|")
    for name, s in sorted(plain + admin, key=lambda r: int(r[0].split("-")[1]) * 2 + r[0].startswith("admin")):
        page = ""
        if name.startswith("admin"):
            p = json.loads((out / f"{name}.page.json").read_text())
            page = f"{p['polls']} polls in {p['held_s']} s, {len(p['errors'])} errors, chromium {p['browser_cpu_s']} CPU s"
        print(row(name, s, page))
    med = {label: {k: statistics.median(s[k] for _, s in rs) for k in KEYS} for label, rs in
           (("without", plain), ("with /admin", admin))}
    for label, m in med.items():
        print(row(f"median {label}", {**m, "completed": "", "requests": ""}))
    tps = [s["tokens_per_s"] for _, s in plain]
    w, a = med["without"], med["with /admin"]
    print(f"\nwith/without: tokens/s {a['tokens_per_s'] / w['tokens_per_s']:.3f}x; TTFT p50 "
          f"{a['ttft_ms_p50'] / w['ttft_ms_p50']:.3f}x, p95 {a['ttft_ms_p95'] / w['ttft_ms_p95']:.3f}x "
          f"(above 1: longer with the page). Spread of the runs without: tokens/s {min(tps):.1f}-{max(tps):.1f} "
          f"({(max(tps) - min(tps)) / statistics.median(tps):.1%} of their median)")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
