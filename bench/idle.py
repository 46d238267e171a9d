"""Idle cost: CPU per node of a 3-node accord cluster hosting 1, 100, 1,000 and 10,000 shards.

For every shard count a fresh 3-node accord cluster is started with ``--shards N``;
once it serves and a write went through, the benchmark waits ``--settle`` seconds and
then reads each node's user+system CPU time (``/proc/PID/stat``) over ``--window``
seconds with no client traffic: the result is the percentage of one core each node
burns doing nothing but staying alive (heartbeats, ticks, lease and progress loops).
A real 3-member etcd (one Raft group) is measured the same way as a reference.
Goal: 10,000 idle shards under 5% of one core per node.

What "shards" means is up to the server: this benchmark only passes the flag and
reports what the processes cost. A server that refuses a shard count is reported with
its error instead of a figure.

Usage: ``python bench/idle.py [--shards 1,100,1000,10000] [--window 10] [--settle 3]``.
Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import AccordCluster, Cluster, EtcdCluster, Harness, cpu_seconds, machine  # noqa: E402

MIB = 1 << 20
GOAL_PERCENT = 5.0


def idle_cpu(c: Cluster, settle: float, window: float) -> dict[str, Any]:
    """Percent of one core per member over ``window`` seconds of no traffic, and RSS."""
    time.sleep(settle)
    pids = c.pids
    before = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    time.sleep(window)
    after = [cpu_seconds(p) for p in pids]
    elapsed = time.monotonic() - t0
    per_node = [100.0 * (a - b) / elapsed for a, b in zip(after, before, strict=True)]
    return {"cpu_percent_per_node": [round(x, 2) for x in per_node],
            "cpu_percent_mean": round(statistics.mean(per_node), 2),
            "rss_mib_mean": round(statistics.mean(c.rss()) / MIB, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the idle benchmark; print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default="1,100,1000,10000", help="shard counts (comma-separated)")
    p.add_argument("--window", type=float, default=10.0, help="seconds measured (default 10)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle before measuring")
    p.add_argument("--no-etcd", action="store_true", help="skip the etcd reference")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.shards.split(",") if x.strip()]
    except ValueError:
        p.error(f"--shards must be comma-separated integers, got {args.shards!r}")
    if not counts or min(counts) < 1 or args.window <= 0 or args.settle < 0:
        p.error("--shards must be positive, --window > 0, --settle >= 0")
    started = time.time()
    rows: dict[str, dict[str, Any]] = {}
    with Harness() as h:
        if not args.no_etcd:
            e = EtcdCluster(h.root)
            h.add(e)
            rows["etcd"] = {"shards": 1, **idle_cpu(e, args.settle, args.window)}
            e.stop()
            print(f"  etcd: {rows['etcd']}", file=sys.stderr, flush=True)
        for n in counts:
            a = AccordCluster(h.root / f"shards{n}", extra=("--shards", str(n)))
            try:
                h.add(a)
                rows[f"accord-{n}"] = {"shards": n, **idle_cpu(a, args.settle, args.window)}
            except RuntimeError as err:
                msg = str(err).strip().splitlines()
                rows[f"accord-{n}"] = {"shards": n, "error": " | ".join(msg[-3:])[-300:]}
            finally:
                a.stop()
            print(f"  accord --shards {n}: {rows[f'accord-{n}']}", file=sys.stderr, flush=True)
    print(f"\nidle cost per node, 3-node clusters, {args.window:g}s window after {args.settle:g}s settle")
    print(f"machine: {machine()}  ({time.time() - started:.0f}s)")
    print(f"{'system':<14}{'shards':>7}{'CPU % of a core per node':>27}{'mean':>7}{'RSS MiB':>9}")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<14}{r['shards']:>7}  refused: {r['error'][:120]}")
            continue
        per = " ".join(f"{x:.1f}" for x in r["cpu_percent_per_node"])
        print(f"{name:<14}{r['shards']:>7}{per:>27}{r['cpu_percent_mean']:>7.1f}{r['rss_mib_mean']:>9.0f}")
    top = rows.get(f"accord-{max(counts)}", {})
    goal = bool(max(counts) >= 10_000 and "cpu_percent_mean" in top
                and max(top["cpu_percent_per_node"]) < GOAL_PERCENT)
    print(f"goal (10,000 shards < {GOAL_PERCENT:g}% of a core per node): {'met' if goal else 'MISSED'}")
    print(json.dumps({"bench": "idle", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": machine(), "window_s": args.window, "rows": rows,
                      "goal_met": goal}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
