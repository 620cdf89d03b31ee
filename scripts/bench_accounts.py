#!/usr/bin/env python3
"""Open-loop traffic over many accounts, for `scripts/bench --redis --accounts N --rate R`.

Two steps, each run by scripts/bench:

  seed    DB N          clones the template account and key scripts/bench created (the first
                        user and key in the SQLite database DB) into N accounts with a key each,
                        hashed with GATEWAY_KEY_PEPPER as the gateway hashes keys; prints the
                        N secrets to stdout, one a line.
  drive   KEYS_FILE     sends RATE requests a second in all, each on a key drawn at random,
                        for WARMUP then DUR seconds (open loop: each request is sent at its
                        scheduled time whether or not earlier ones have answered; latency is
                        counted from that time). Over the DUR seconds only it reads Redis INFO
                        (commands, script calls, CPU) and the gateways' CPU (/proc), and prints
                        one JSON object with the per-request figures.

Needs aiohttp (the project's .venv has it: GATEWAY_TEST_PYTHON or .venv/bin/python).
"""

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import random
import secrets
import sqlite3
import string
import subprocess
import sys
import time

ALPHABET = string.ascii_letters + string.digits


def seed(db_path, n):
    pepper = os.environ["GATEWAY_KEY_PEPPER"].encode()
    con = sqlite3.connect(db_path)
    con.row_factory = sqlite3.Row
    user = dict(con.execute("SELECT * FROM users ORDER BY created_at LIMIT 1").fetchone())
    key = dict(con.execute("SELECT * FROM api_keys WHERE user_id = ?", (user["id"],)).fetchone())
    out = []
    for i in range(n):
        u = dict(user)
        u["id"] = f"usr_bench{i:06d}"
        u["email"] = f"bench{i}@example.com"
        u["payment_code"] = None
        k = dict(key)
        secret = "sk-" + "".join(secrets.choice(ALPHABET) for _ in range(40))
        k["id"] = f"key_bench{i:06d}"
        k["user_id"] = u["id"]
        k["key_hash"] = hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()
        k["key_prefix"] = secret[:7]
        k["key_suffix"] = secret[-4:]
        for table, row in (("users", u), ("api_keys", k)):
            cols = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            con.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", list(row.values()))
        out.append(secret)
    con.commit()
    print("\n".join(out))


def redis_info(url):
    text = subprocess.run(
        ["redis-cli", "-u", url, "info", "all"], capture_output=True, text=True, check=True
    ).stdout
    info, calls, usec = {}, {}, {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        k, v = line.split(":", 1)
        info[k] = v.strip()
        if k.startswith("cmdstat_"):
            name = k[len("cmdstat_"):]
            calls[name] = int(v.split("calls=")[1].split(",")[0])
            usec[name] = int(v.split("usec=")[1].split(",")[0])
    script_names = ("evalsha", "eval", "fcall")
    return {
        "commands": int(info["total_commands_processed"]),
        "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        # Reads from clients' sockets: one per round trip (a pipeline's commands share one).
        "reads": int(info.get("total_reads_processed", 0)),
        "scripts": sum(calls.get(n, 0) for n in script_names),
        # Time inside script calls (the commands they run included), as Redis counts it.
        "script_usec": sum(usec.get(n, 0) for n in script_names),
        "calls": calls,
        "usec": usec,
    }


def proc_cpu(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def drive(args):
    import aiohttp

    keys = [k for k in open(args.keys_file).read().split() if k]
    apis = args.api.split(",")
    body = json.dumps(
        {
            "model": args.model,
            "messages": [{"role": "user", "content": "hello there, how are you today?"}],
            "max_tokens": 64,
        }
    ).encode()
    rng = random.Random(7)
    stats = {"sent": 0, "ok": 0, "other": 0, "errors": 0}
    latencies = []
    window = {"on": False}
    measured = {"ok": 0}
    conn = aiohttp.TCPConnector(limit=args.connections, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def one(at, key, api):
            counted = window["on"]
            try:
                async with session.post(
                    f"http://{api}/v1/chat/completions",
                    data=body,
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                ) as r:
                    await r.read()
                    if r.status == 200:
                        stats["ok"] += 1
                        if counted and window["on"]:
                            measured["ok"] += 1
                            latencies.append(time.perf_counter() - at)
                    else:
                        stats["other"] += 1
            except Exception:
                stats["errors"] += 1

        # Redis CPU a second with the gateways connected and idle (their polls included),
        # measured once their start-up (script loads, subscriptions) is over: read in the first
        # seconds after a start, it came out up to twice what an idle gateway costs later.
        await asyncio.sleep(args.settle)
        i0 = redis_info(args.redis_url)
        await asyncio.sleep(args.idle)
        i1 = redis_info(args.redis_url)
        idle = (i1["cpu"] - i0["cpu"]) / args.idle
        # The INFO calls themselves are one read each.
        idle_reads = (i1["reads"] - i0["reads"] - 1) / args.idle
        tasks = set()
        start = time.perf_counter()
        interval = 1.0 / args.rate
        total = args.warmup + args.dur
        before = None
        n = 0
        while True:
            at = start + n * interval
            elapsed = at - start
            if elapsed >= total:
                break
            if not window["on"] and elapsed >= args.warmup:
                before = (redis_info(args.redis_url), proc_cpu(args.pids), time.perf_counter())
                window["on"] = True
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            key = keys[rng.randrange(len(keys))]
            api = apis[n % len(apis)]
            t = asyncio.ensure_future(one(at, key, api))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            stats["sent"] += 1
            n += 1
        after = (redis_info(args.redis_url), proc_cpu(args.pids), time.perf_counter())
        window["on"] = False
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    answered = measured["ok"]
    latencies.sort()

    def pct(p):
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    r0, r1 = before[0], after[0]
    per = max(answered, 1)
    print(
        json.dumps(
            {
                "accounts": len(keys),
                "rate": args.rate,
                "seconds": round(after[2] - before[2], 1),
                "answered_in_window": answered,
                "redis_cpu_us": round((r1["cpu"] - r0["cpu"]) * 1e6 / per, 2),
                "redis_commands": round((r1["commands"] - r0["commands"]) / per, 2),
                "redis_round_trips": round((r1["reads"] - r0["reads"] - 1) / per, 3),
                "redis_idle_round_trips_per_s": round(idle_reads, 2),
                "redis_scripts": round((r1["scripts"] - r0["scripts"]) / per, 3),
                "redis_script_us": round((r1["script_usec"] - r0["script_usec"]) / per, 2),
                # Redis's own CPU with this traffic's clients connected and no request, per
                # request of this run: the floor under redis_cpu_us at this rate.
                "redis_idle_cpu_us": round(idle * 1e6 / (per / (after[2] - before[2])), 2),
                "redis_commands_by_name": {
                    name: round((n - r0["calls"].get(name, 0)) / per, 3)
                    for name, n in sorted(r1["calls"].items())
                    if n - r0["calls"].get(name, 0) > 0
                },
                # Time Redis counts inside each command, per request: what is left of
                # redis_cpu_us beyond their sum is its event loop, replies and timers.
                "redis_us_by_name": {
                    name: round((n - r0["usec"].get(name, 0)) / per, 3)
                    for name, n in sorted(r1["usec"].items())
                    if n - r0["usec"].get(name, 0) > 0
                },
                "gateway_cpu_us": round((after[1] - before[1]) * 1e6 / per, 1),
                "p50_ms": pct(0.50),
                "p99_ms": pct(0.99),
                "sent": stats["sent"],
                "answered": stats["ok"],
                "refused_or_failed": stats["other"] + stats["errors"],
            }
        )
    )


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("db")
    s.add_argument("n", type=int)
    d = sub.add_parser("drive")
    d.add_argument("keys_file")
    d.add_argument("--api", required=True, help="host:port[,host:port...] (requests alternate)")
    d.add_argument("--rate", type=float, required=True)
    d.add_argument("--dur", type=float, default=60)
    d.add_argument("--warmup", type=float, default=20)
    d.add_argument("--redis-url", required=True)
    d.add_argument("--pids", type=int, nargs="+", required=True)
    d.add_argument("--idle", type=float, default=15, help="seconds of idle Redis measured first")
    d.add_argument(
        "--settle", type=float, default=5, help="seconds waited before the idle measurement"
    )
    d.add_argument("--model", default="mock-gpt")
    d.add_argument("--connections", type=int, default=256)
    a = ap.parse_args()
    if a.cmd == "seed":
        seed(a.db, a.n)
    else:
        asyncio.run(drive(a))


if __name__ == "__main__":
    sys.exit(main())
