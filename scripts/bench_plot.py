#!/usr/bin/env python3
"""Plot for a `scripts/bench` run: throughput and proxy CPU per request, every target.

Reads the shared harness's results.jsonl (wrk cells) and sse.jsonl (SSE probe) from one results
folder and writes one PNG with three panels:

  1. requests (or streams) per second per cell, every target side by side (log scale: LiteLLM
     and nginx are two orders of magnitude apart);
  2. the proxy's CPU time per request (µs, log scale), the figure that decides throughput once
     wrk, the mock and the proxy share the machine's cores;
  3. median added latency versus the mock alone at each cell (ms, log scale).

usage: bench_plot.py RESULTS_DIR OUT.png [--title TEXT]

Needs matplotlib (scripts/bench installs it into the harness's venv). When a cell was repeated,
the median-throughput repetition is used, as bench_report.py does.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["direct", "nginx", "gateway", "litellm"]
COLOURS = {"direct": "#9e9e9e", "nginx": "#2e7d32", "gateway": "#1565c0", "litellm": "#c62828"}


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median_rep(rows):
    rows = sorted(rows, key=lambda r: r["rps"])
    return rows[len(rows) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default="LLM gateway overhead on a 2-core machine (wrk, loopback)")
    args = ap.parse_args()

    rows = [r for r in load(os.path.join(args.results, "results.jsonl")) if not r.get("rate")]
    cells = {}
    for r in rows:
        cells.setdefault((r["target"], r["mode"], r["conns"]), []).append(r)
    best = {k: median_rep(v) for k, v in cells.items()}
    if not best:
        # A run of open (rate) cells only: the plot draws the closed-loop cells.
        print("bench_plot: no closed-loop cells to plot", file=sys.stderr)
        return
    targets = [t for t in ORDER if any(k[0] == t for k in best)]
    targets += sorted({k[0] for k in best} - set(targets))
    columns = sorted({(k[1], k[2]) for k in best}, key=lambda c: (c[0] != "nonstream", c[1]))
    labels = [f"{'non-stream' if m == 'nonstream' else 'stream'}\nc{c}" for m, c in columns]

    fig, axes = plt.subplots(3, 1, figsize=(11, 12))
    width = 0.8 / max(len(targets), 1)
    panels = [
        ("requests per second (log)", lambda r: r["rps"]),
        ("proxy CPU per request, µs (log)", cpu_per_request),
        ("added median latency vs direct, ms (log)", None),
    ]
    for ax, (ylabel, value) in zip(axes, panels):
        for i, t in enumerate(targets):
            xs, ys = [], []
            for j, (mode, conns) in enumerate(columns):
                r = best.get((t, mode, conns))
                if r is None:
                    continue
                if value is None:
                    d = best.get(("direct", mode, conns))
                    if t == "direct" or d is None:
                        continue
                    y = max(r["lat_p50_ms"] - d["lat_p50_ms"], 0.001)
                else:
                    y = value(r)
                if y is None or y <= 0:
                    continue
                xs.append(j + (i - (len(targets) - 1) / 2) * width)
                ys.append(y)
            if not xs:
                continue
            bars = ax.bar(xs, ys, width, label=t, color=COLOURS.get(t))
            for b, y in zip(bars, ys):
                ax.annotate(fmt(y), (b.get_x() + b.get_width() / 2, y), ha="center",
                            va="bottom", fontsize=7, rotation=90, xytext=(0, 2),
                            textcoords="offset points")
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels(labels)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.margins(y=0.25)
    axes[0].legend(ncol=len(targets), loc="upper right", fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


def cpu_per_request(r):
    if r["target"] == "direct" or not r.get("proxy_cores") or not r.get("rps"):
        return None
    return r["proxy_cores"] * 1e6 / r["rps"]


def fmt(y):
    if y >= 1000:
        return f"{y:,.0f}"
    if y >= 10:
        return f"{y:.0f}"
    if y >= 1:
        return f"{y:.1f}"
    return f"{y:.2f}"


if __name__ == "__main__":
    main()
