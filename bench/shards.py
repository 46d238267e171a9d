"""Write throughput of a 3-node accord cluster with 1, 8 and 64 shards, 256 concurrent writers.

One run starts a 3-node accord cluster per shard count (``--shards N``) and a real
3-member etcd (fsync on) as the reference, all at once, and drives each with the load
generator's ``put`` workload (256-byte values, ``--concurrency`` clients spread over
the members, leader first) in ``--reps`` interleaved rounds; it reports the medians
and each shard count relative to etcd and to one shard.

What the shard count changes is up to the server: this benchmark passes the flag and
measures what comes out. Usage: ``python bench/shards.py [--shards 1,8,64]
[--concurrency 256] [--duration 5] [--reps 3] [--workers 3]``. Prints a table; the
last line is one JSON object.
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

from bench.harness import AccordCluster, Cluster, Harness, machine  # noqa: E402
from bench.kv import ordered_endpoints  # noqa: E402
from bench.loadgen import LoadGen, Result, Spec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the shard-count benchmark; print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default="1,8,64", help="shard counts (comma-separated)")
    p.add_argument("--concurrency", type=int, default=256, help="concurrent writers (default 256)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell (default 5)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--workers", type=int, default=3, help="load generator processes (default 3)")
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.shards.split(",") if x.strip()]
    except ValueError:
        p.error(f"--shards must be comma-separated integers, got {args.shards!r}")
    if not counts or min(counts) < 1 or args.reps < 1 or args.duration <= 0 or args.concurrency < 1:
        p.error("--shards >= 1, --reps >= 1, --duration > 0, --concurrency >= 1")
    started = time.time()
    results: dict[str, list[Result]] = {}
    with Harness() as h, LoadGen(args.workers) as lg:
        systems: dict[str, Cluster] = {"etcd": h.etcd()}
        for n in counts:
            a = AccordCluster(h.root / f"shards{n}", extra=("--shards", str(n)))
            systems[f"accord-{n}"] = h.add(a)
        names = list(systems)
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                spec = Spec("put", ordered_endpoints(systems[name]), args.concurrency,
                            args.duration, tag=f"s{rep}")
                r = lg.run(spec)
                results.setdefault(name, []).append(r)
                print(f"  round {rep + 1} {name:<11} {r.ops_s:8.0f} ops/s p99 {r.p99_ms:.1f} ms "
                      f"errors {r.errors}", file=sys.stderr, flush=True)
    rows: dict[str, dict[str, Any]] = {}
    for name, runs in results.items():
        rows[name] = {"ops_s": statistics.median(x.ops_s for x in runs),
                      "p50_ms": statistics.median(x.p50_ms for x in runs),
                      "p99_ms": statistics.median(x.p99_ms for x in runs),
                      "errors": sum(x.errors for x in runs)}
    etcd_ops = rows["etcd"]["ops_s"]
    one = rows.get(f"accord-{counts[0]}", {}).get("ops_s", 0.0)
    ratios: dict[str, float] = {}
    print(f"\nwrite throughput, put 256 B at {args.concurrency} concurrent; medians of {args.reps} "
          f"interleaved rounds of {args.duration:g}s")
    print(f"machine: {machine()}  ({time.time() - started:.0f}s)")
    print(f"{'system':<12}{'ops/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'vs etcd':>9}{f'vs {counts[0]}':>7}")
    for name, row in rows.items():
        ve = row["ops_s"] / etcd_ops if etcd_ops else float("nan")
        vo = row["ops_s"] / one if one and name != "etcd" else float("nan")
        if name != "etcd":
            ratios[f"{name}/etcd"] = round(ve, 3)
            ratios[f"{name}/accord-{counts[0]}"] = round(vo, 3)
        print(f"{name:<12}{row['ops_s']:>9.0f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}{ve:>9.2f}"
              f"{'' if vo != vo else f'{vo:.2f}':>7}")
    print(json.dumps({"bench": "shards", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": machine(), "concurrency": args.concurrency, "rows": rows,
                      "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
