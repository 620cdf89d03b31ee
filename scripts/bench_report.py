#!/usr/bin/env python3
"""Ratio table for a `scripts/bench` run (stdlib only).

Reads the shared harness's results.jsonl (wrk cells) and sse.jsonl (SSE TTFB probe) from one
results folder and prints markdown:

  1. every target and cell: req/s, p50, p99, proxy CPU per request, and for every proxy its
     throughput ratio versus direct and versus nginx and its added p50/p99 latency versus direct;
  2. the SSE probe: time to first byte per target, and its difference from direct;
  3. the performance targets, each marked met or missed;
  4. optionally (--redis-before/--redis-after) the Redis script calls per gateway request.

usage: bench_report.py RESULTS_DIR [--target gateway] [--requests N]
                       [--redis-before FILE --redis-after FILE]

When a cell was repeated (REPEAT>1) the median-throughput repetition is used, as the harness's
own summary.md does.
"""
import argparse
import json
import os
import sys

ORDER = {"direct": 0, "nginx": 1, "litellm": 2}

# The performance targets: throughput against nginx, added latency, first streamed byte.
MIN_RATIO_VS_NGINX = 0.70
MAX_ADDED_P50_MS = 0.5
MAX_ADDED_P99_MS = 2.0
TARGET_CONNS = 16
MAX_TTFB_ADDED_MS = 1.0
MAX_REDIS_ROUND_TRIPS = 2.0
MAX_REDIS_CPU_US = 5.0


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median_cells(rows):
    """(target, mode, conns, rate) -> the median-rps repetition."""
    cells = {}
    for r in rows:
        cells.setdefault((r["target"], r["mode"], r["conns"], r.get("rate", 0)), []).append(r)
    out = {}
    for k, reps in cells.items():
        reps = sorted(reps, key=lambda r: r["rps"])
        out[k] = reps[len(reps) // 2]
    return out


def fmt_ratio(a, b):
    return f"{a / b:.2f}" if b else "–"


def cpu_us(r):
    if r.get("proxy_cores", 0) > 0 and r["rps"] > 0:
        return f'{r["proxy_cores"] / r["rps"] * 1e6:,.0f}'
    return "–"


def errors(r):
    return sum(r.get(k, 0) for k in ("err_status", "err_timeout", "err_read", "err_connect", "err_write"))


def wrk_table(cells, gw):
    print("| mode | conns | target | req/s | p50 ms | p99 ms | errors | CPU µs/req | "
          "× direct | × nginx | Δp50 vs direct ms | Δp99 vs direct ms |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = sorted(cells, key=lambda k: (k[1] != "nonstream", k[1], k[3], k[2],
                                        ORDER.get(k[0], 5 if k[0] == gw else 9), k[0]))
    for k in keys:
        r = cells[k]
        t, mode, conns, rate = k
        d = cells.get(("direct", mode, conns, rate))
        n = cells.get(("nginx", mode, conns, rate))
        vs_d = fmt_ratio(r["rps"], d["rps"]) if d and t != "direct" else "–"
        vs_n = fmt_ratio(r["rps"], n["rps"]) if n and t not in ("direct", "nginx") else "–"
        d50 = f'{r["lat_p50_ms"] - d["lat_p50_ms"]:+.3f}' if d and t != "direct" else "–"
        d99 = f'{r["lat_p99_ms"] - d["lat_p99_ms"]:+.3f}' if d and t != "direct" else "–"
        name = f"**{t}**" if t == gw else t
        cell = f"{conns}" + (f" @{rate}/s" if rate else "")
        print(f'| {mode} | {cell} | {name} | {r["rps"]:,.0f} | {r["lat_p50_ms"]:.3f} | '
              f'{r["lat_p99_ms"]:.3f} | {errors(r)} | {cpu_us(r)} | {vs_d} | {vs_n} | {d50} | {d99} |')


def sse_split(label):
    """'gateway chunk_delay=5ms' -> ('gateway', 'chunk_delay=5ms')."""
    parts = label.split(" ", 1)
    return parts[0], (parts[1] if len(parts) > 1 else "")


def sse_table(sse):
    if not sse:
        return {}
    by = {sse_split(s["label"]): s for s in sse}
    print("| SSE probe (1 keep-alive conn, sequential) | TTFB p50 ms | TTFB p99 ms | "
          "Δ TTFB p50 vs direct ms | Δ TTFB p99 vs direct ms | last byte p50 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in sse:
        t, cond = sse_split(s["label"])
        d = by.get(("direct", cond))
        dp50 = f'{s["ttfb_p50_ms"] - d["ttfb_p50_ms"]:+.3f}' if d and t != "direct" else "–"
        dp99 = f'{s["ttfb_p99_ms"] - d["ttfb_p99_ms"]:+.3f}' if d and t != "direct" else "–"
        print(f'| {s["label"]} | {s["ttfb_p50_ms"]:.3f} | {s["ttfb_p99_ms"]:.3f} | {dp50} | {dp99} | '
              f'{s["total_p50_ms"]:.3f} | {s["errors"]} |')
    return by


def mark(ok):
    return "met" if ok else "**MISSED**"


def targets(cells, sse_by, gw):
    lines = []
    for k in sorted((k for k in cells if k[0] == gw), key=lambda k: (k[1], k[3], k[2])):
        r = cells[k]
        if errors(r):
            lines.append(f"- **errors** in {gw} {k[1]} c{k[2]}: {r.get('err_status', 0):,} non-2xx "
                         f"answers, {r.get('err_read', 0):,} read / {r.get('err_connect', 0):,} "
                         f"connect / {r.get('err_timeout', 0):,} timeout socket errors "
                         f"({r['requests']:,} requests)")
    for (t, cond), s in sorted(sse_by.items()):
        if t == gw and s.get("errors"):
            lines.append(f"- **errors** in the SSE probe, {cond}: {s['errors']} of {s['n']} not 200")
    gw_probes = {c for (t, c) in sse_by if t == gw}
    for (t, cond) in sorted(sse_by):
        if t == "direct" and cond not in gw_probes:
            lines.append(f"- **no SSE probe result** for {gw}, {cond} (the probe failed; see the run log)")
    gw_cells = sorted((k for k in cells if k[0] == gw and not k[3]), key=lambda k: (k[1], k[2]))
    for k in gw_cells:
        _, mode, conns, _ = k
        n = cells.get(("nginx", mode, conns, 0))
        if n:
            ratio = cells[k]["rps"] / n["rps"] if n["rps"] else 0
            lines.append(f"- throughput ≥ {MIN_RATIO_VS_NGINX:.0%} of nginx, {mode} c{conns}: "
                         f"{ratio:.0%} ({cells[k]['rps']:,.0f} vs {n['rps']:,.0f} req/s) — "
                         f"{mark(ratio >= MIN_RATIO_VS_NGINX)}")
    def added_latency(g, d, where):
        a50 = g["lat_p50_ms"] - d["lat_p50_ms"]
        a99 = g["lat_p99_ms"] - d["lat_p99_ms"]
        lines.append(f"- added p50 < {MAX_ADDED_P50_MS} ms vs direct, {where}: "
                     f"{a50:+.3f} ms — {mark(a50 < MAX_ADDED_P50_MS)}")
        lines.append(f"- added p99 < {MAX_ADDED_P99_MS} ms vs direct, {where}: "
                     f"{a99:+.3f} ms — {mark(a99 < MAX_ADDED_P99_MS)}")

    for mode in ("nonstream", "stream"):
        g = cells.get((gw, mode, TARGET_CONNS, 0))
        d = cells.get(("direct", mode, TARGET_CONNS, 0))
        if g and d:
            added_latency(g, d, f"{mode} c{TARGET_CONNS}")
    # The same targets below saturation: open cells at the target's connection count. A target
    # that cannot keep up serves less than offered, and the cell is then a queue again: the
    # line says what was served.
    for k in sorted((k for k in cells if k[0] == gw and k[3] and k[2] == TARGET_CONNS),
                    key=lambda k: (k[1], k[3])):
        _, mode, conns, rate = k
        d = cells.get(("direct", mode, conns, rate))
        if d:
            added_latency(cells[k], d,
                          f"{mode} c{conns} @{rate}/s (open; served {cells[k]['rps']:,.0f} req/s)")
    for (t, cond), s in sorted(sse_by.items()):
        d = sse_by.get(("direct", cond))
        if t == gw and d:
            a = s["ttfb_p50_ms"] - d["ttfb_p50_ms"]
            verdict = "not valid (errors)" if s.get("errors") else mark(a <= MAX_TTFB_ADDED_MS)
            lines.append(f"- TTFB within {MAX_TTFB_ADDED_MS} ms of direct (p50), {cond}: "
                         f"{a:+.3f} ms — {verdict}")
    return lines


def commandstats(path):
    """cmdstat_NAME -> {calls, usec} from `redis-cli info commandstats` output."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("cmdstat_"):
                continue
            name, _, rest = line.partition(":")
            kv = dict(p.split("=", 1) for p in rest.split(",") if "=" in p)
            out[name[len("cmdstat_"):]] = {"calls": int(kv.get("calls", 0)),
                                           "usec": int(kv.get("usec", 0))}
    return out


def redis_cpu(path):
    """Seconds of CPU the Redis server used (used_cpu_sys + used_cpu_user, `info cpu`)."""
    total = 0.0
    with open(path) as f:
        for line in f:
            name, _, value = line.strip().partition(":")
            if name in ("used_cpu_sys", "used_cpu_user"):
                total += float(value)
    return total


def redis_section(before, after, requests):
    b, a = commandstats(before), commandstats(after)
    cpu_s = redis_cpu(after) - redis_cpu(before)
    lines = ["| Redis command | calls (delta) | per gateway request | server µs per call |",
             "|---|---:|---:|---:|"]
    script_calls = 0
    for name in sorted(set(a) | set(b)):
        calls = a.get(name, {}).get("calls", 0) - b.get(name, {}).get("calls", 0)
        usec = a.get(name, {}).get("usec", 0) - b.get(name, {}).get("usec", 0)
        if calls <= 0:
            continue
        if name in ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "script|load", "script"):
            script_calls += calls if not name.startswith("script") else 0
        per = f"{calls / requests:.3f}" if requests else "–"
        lines.append(f"| {name} | {calls:,} | {per} | {usec / calls:.1f} |")
    summary = []
    if requests:
        rt = script_calls / requests
        summary.append(f"- Redis script round trips per request (eval + evalsha): {rt:.2f} "
                       f"over {requests:,} gateway requests — "
                       f"{mark(round(rt, 2) <= MAX_REDIS_ROUND_TRIPS)} (target ≤ {MAX_REDIS_ROUND_TRIPS:.0f}); "
                       "the delta counts every client of this Redis, so concurrent test runs "
                       "inflate it")
        if cpu_s > 0:
            us = cpu_s * 1e6 / requests
            summary.append(f"- Redis CPU per request (used_cpu_sys + used_cpu_user delta ÷ "
                           f"requests): {us:.1f} µs — {mark(us <= MAX_REDIS_CPU_US)} "
                           f"(target ≤ {MAX_REDIS_CPU_US:.0f} µs)")
    return lines, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--target", default="gateway", help="name of the gateway target")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests the gateway served (for per-request Redis figures)")
    ap.add_argument("--redis-before")
    ap.add_argument("--redis-after")
    a = ap.parse_args()

    rows = load_jsonl(os.path.join(a.results_dir, "results.jsonl"))
    if not rows:
        sys.exit(f"no results in {a.results_dir}/results.jsonl")
    sse = load_jsonl(os.path.join(a.results_dir, "sse.jsonl"))
    cells = median_cells(rows)

    print("### Throughput and latency (wrk)")
    print()
    wrk_table(cells, a.target)
    print()
    print("× direct / × nginx: throughput ratio; Δ: added latency versus the mock alone at the "
          "same cell. A cell of N connections is a closed loop: each connection sends its next "
          "request as soon as the last is answered, so at 16 and 64 connections wrk, the mock "
          "and the proxy share the 2 cores, throughput reflects CPU per request (column 'CPU "
          "µs/req', the proxy's process tree), and the median latency is about N ÷ throughput. "
          "A cell 'N @R/s' is open: N connections offer R requests a second between them "
          "(exponential think time). Where a target serves about R, it kept up, and its Δ is "
          "the latency the proxy adds to a request rather than the queue a saturated machine "
          "builds; where it serves clearly less, it was at its limit.")
    print()
    sse_by = {}
    if sse:
        print("### Time to first streamed byte")
        print()
        sse_by = sse_table(sse)
        print()
    redis_lines, redis_summary = [], []
    if a.redis_before and a.redis_after:
        redis_lines, redis_summary = redis_section(a.redis_before, a.redis_after, a.requests)
    print("### Targets")
    print()
    for line in targets(cells, sse_by, a.target) + redis_summary:
        print(line)
    if redis_lines:
        print()
        print("### Redis commands during the run")
        print()
        for line in redis_lines:
            print(line)


if __name__ == "__main__":
    main()
