#!/usr/bin/env python3
"""Turns criterion's results (target/criterion) into BENCHMARKS tables and an SVG of the ratios.

Reads every <group>/<bench>/new/{benchmark.json,estimates.json}, takes the median (per element when the
bench declares a throughput), pairs each kvgate row with the competitor rows of its group, and writes
target/bench-report/summary.md and target/bench-report/ratios.svg.
"""
import json
import os
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
out = Path("target/bench-report")
out.mkdir(parents=True, exist_ok=True)

rows = {}
for bench in root.glob("*/*/new/benchmark.json"):
    meta = json.loads(bench.read_text())
    est = json.loads((bench.parent / "estimates.json").read_text())
    median = est["median"]["point_estimate"]
    throughput = meta.get("throughput") or {}
    per = throughput.get("Elements") or throughput.get("Bytes") or 1
    group = meta["group_id"]
    name = meta.get("function_id") or meta.get("value_str") or meta["title"]
    rows.setdefault(group, []).append((name, median / per))


def fmt(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


lines = ["| group | kvgate | median | competitor | median | ratio kvgate/competitor |", "|---|---|---:|---|---:|---:|"]
ratios = []
for group in sorted(rows):
    entries = sorted(rows[group])
    ours = [e for e in entries if e[0].startswith("kvgate")]
    theirs = [e for e in entries if not e[0].startswith("kvgate")]
    if not theirs:
        for name, ns in ours:
            lines.append(f"| {group} | {name} | {fmt(ns)} | — | — | — |")
        continue
    for name, ns in ours:
        # Pair "... existing ..." with "... existing ...", "... new ..." with "... new ...".
        for tname, tns in theirs:
            words = {"existing", "new"}
            if (words & set(name.replace(",", "").split())) != (words & set(tname.replace(",", "").split())):
                continue
            ratio = ns / tns
            ratios.append((f"{group}: {name} / {tname}", ratio))
            lines.append(f"| {group} | {name} | {fmt(ns)} | {tname} | {fmt(tns)} | {ratio:.2f}× |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# A horizontal bar chart of the ratios (1.0 = as fast as the competitor; shorter is faster).
bar_h, gap, left, width = 18, 6, 520, 360
height = 40 + len(ratios) * (bar_h + gap)
top = max([r for _, r in ratios] + [1.5])
svg = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 80}" height="{height}" font-family="sans-serif" font-size="12">',
    f'<text x="10" y="20" font-size="14">kvgate time / competitor time (median; left of the line = kvgate faster)</text>',
]
x1 = left + width * 1.0 / top
svg.append(f'<line x1="{x1:.1f}" y1="28" x2="{x1:.1f}" y2="{height - 4}" stroke="#444" stroke-dasharray="4 3"/>')
for i, (label, ratio) in enumerate(ratios):
    y = 34 + i * (bar_h + gap)
    w = width * ratio / top
    color = "#2a9d8f" if ratio <= 1.0 else "#e76f51"
    svg.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{label.replace("&", "&amp;").replace("<", "&lt;")}</text>')
    svg.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
    svg.append(f'<text x="{left + w + 6:.1f}" y="{y + 13}">{ratio:.2f}×</text>')
svg.append("</svg>")
(out / "ratios.svg").write_text("\n".join(svg) + "\n")
print(f"\nwrote {out / 'summary.md'} and {out / 'ratios.svg'}", file=sys.stderr)
