"""Throughput per core count: the same clusters with every member limited to 1, 2, ... cores.

One run starts a 3-node accord (``--shards``, default the daemon's 8) and, as the
reference, a real 3-member etcd (fsync on), both as ``bench/harness.py`` starts them, once
each. Then, for every core count ``k`` of ``--cores`` (default 1, 2, 4, ... up to this
machine's ``os.cpu_count()``, and that count itself), it pins every thread of every member
(``os.sched_setaffinity`` on each task in ``/proc/PID/task``; threads started later inherit
it) to a window of ``k`` cores and runs ``put:256`` (256-byte values, 256 concurrent clients
spread over the members, leader first) on both systems, in ``--reps`` interleaved rounds
(every round visits every core count, alternating the order of the systems and of the core
counts). Pinning running processes instead of restarting them keeps one cluster per system
for the whole run, so the core counts compare on the same data, leaders and links.

Member ``i`` gets cores ``i*k .. i*k+k-1`` (mod the machine's count): the three windows are
disjoint while ``3k`` fits the machine, as on three real hosts of ``k`` cores each; beyond
that they overlap (the table says so, in the ``disjoint`` column). The load generator's
processes run on the cores no member uses, when there are any, so it does not steal the
members' cores; otherwise on all of them.

For every cell: ops/s, p99, and the CPU the three members used per operation (``/proc``,
user + system): CPU per op is the figure that survives a busy machine; throughput per core
count is what the issue's goal ("a node scales with cores") is read from, so take it on a
machine with more cores than this benchmark has members times ``k``.

``--node-workers 1,2,4`` adds the workers axis (docs/workers.md): one accord cluster per
value, its members started with ``--workers W`` (each member's supervisor and workers
pinned to the member's ``k`` cores together), shown as ``accord-wW``; ``W`` must not
exceed ``--shards``. With ``k`` cores per member, ``W = k`` is the configuration the
design sizes; on a machine with fewer than ``3 k`` cores the members share cores and the
figure cannot scale.

Usage: ``python bench/cores.py [--cores 1,2,4,8,16] [--duration 3] [--reps 2]
[--workers 3] [--concurrency 256] [--accord-args "--shards 8"] [--node-workers 1,2]
[--workload put|sput] [--no-etcd]``. The workers axis wants ``--workload sput``: ``put``'s
keys share one partition, so one shard, so one worker of each node. Prints a table; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ab import cpu_of  # noqa: E402
from bench.harness import Cluster, Harness, children, machine  # noqa: E402
from bench.kv import clean, fmt, median, ordered_endpoints  # noqa: E402
from bench.loadgen import LoadGen, Spec  # noqa: E402


def default_counts(total: int) -> list[int]:
    """1, 2, 4, ... below ``total``, then ``total`` itself."""
    out, k = [], 1
    while k < total:
        out.append(k)
        k *= 2
    return [*out, total]


def parse_counts(text: str, total: int) -> list[int]:
    """``--cores`` as a list of core counts, each 1..``total``; ValueError says what is wrong."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--cores must be comma-separated integers, got {text!r}") from None
    if not counts:
        raise ValueError("--cores names no core count")
    bad = [k for k in counts if not 1 <= k <= total]
    if bad:
        raise ValueError(f"--cores {bad} outside 1..{total} (this machine has {total} cores)")
    return counts


def windows(k: int, members: int, cores: list[int]) -> list[set[int]]:
    """Member ``i``'s ``k`` cores: ``cores[i*k .. i*k+k-1]``, wrapping around the machine."""
    n = len(cores)
    return [{cores[(i * k + j) % n] for j in range(k)} for i in range(members)]


def pin(pid: int, cpus: set[int]) -> int:
    """Every thread of ``pid`` onto ``cpus``; returns how many threads were pinned."""
    pinned = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)
            pinned += 1
    if pinned == 0:
        raise RuntimeError(f"pid {pid} has no threads to pin")
    return pinned


def pin_cluster(c: Cluster, wins: list[set[int]]) -> None:
    """Each member onto its window: its process and its children (a node's workers)."""
    for m, cpus in zip(c.members, wins, strict=True):
        for pid in [m.pid, *children(m.pid)]:
            pin(pid, cpus)


def check_pinned(c: Cluster, wins: list[set[int]]) -> None:
    """Raise unless every member's main threads (its workers' too) run where pinned."""
    for m, cpus in zip(c.members, wins, strict=True):
        for pid in [m.pid, *children(m.pid)]:
            got = os.sched_getaffinity(pid)
            if got != cpus:
                raise RuntimeError(f"{m.name} (pid {pid}) runs on {sorted(got)}, pinned to "
                                   f"{sorted(cpus)}")


def main(argv: list[str] | None = None) -> int:
    """Run the core-count benchmark; print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cores", default="", help="core counts per member, comma-separated "
                   "(default 1,2,4,... up to os.cpu_count())")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per cell (default 3)")
    p.add_argument("--reps", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--workers", type=int, default=3, help="load generator processes (default 3)")
    p.add_argument("--concurrency", type=int, default=256, help="concurrent writers (default 256)")
    p.add_argument("--accord-args", default="", help="extra `accord serve` flags, e.g. \"--shards 16\"")
    p.add_argument("--workload", default="put", choices=("put", "sput"),
                   help="put (one partition: one shard) or sput (each client's keys in a "
                   "partition of its own, spread over the shards; what workers need)")
    p.add_argument("--node-workers", default="1", help="accord's --workers per member, "
                   "comma-separated: one accord cluster each (default 1)")
    p.add_argument("--no-etcd", action="store_true", help="skip the etcd reference")
    args = p.parse_args(argv)
    try:
        node_workers = [int(x) for x in args.node_workers.split(",") if x.strip()]
    except ValueError:
        p.error(f"--node-workers must be comma-separated integers, got {args.node_workers!r}")
    if not node_workers or min(node_workers) < 1:
        p.error("--node-workers names no worker count >= 1")
    allowed = sorted(os.sched_getaffinity(0))
    try:
        counts = parse_counts(args.cores, len(allowed)) if args.cores else default_counts(len(allowed))
    except ValueError as err:
        p.error(str(err))
    if args.reps < 1 or args.duration <= 0 or args.concurrency < 1 or args.workers < 1:
        p.error("--reps >= 1, --duration > 0, --concurrency >= 1, --workers >= 1")

    started = time.time()
    runs: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with Harness() as h, LoadGen(args.workers) as lg:
        systems: dict[str, Cluster] = {}
        for w in node_workers:
            name = "accord" if w == 1 else f"accord-w{w}"
            systems[name] = h.accord(extra=tuple(args.accord_args.split()), workers=w)
        if not args.no_etcd:
            systems["etcd"] = h.etcd()
        names = list(systems)
        for rep in range(args.reps):
            order_k = counts if rep % 2 == 0 else counts[::-1]
            for j, k in enumerate(order_k):
                wins = windows(k, 3, allowed)
                used = set().union(*wins)
                rest = set(allowed) - used
                for pid in lg.pids:
                    pin(pid, rest or set(allowed))
                for name in names if (rep + j) % 2 == 0 else names[::-1]:
                    c = systems[name]
                    pin_cluster(c, wins)
                    check_pinned(c, wins)
                    before = cpu_of(c)
                    spec = Spec(args.workload, ordered_endpoints(c), args.concurrency, args.duration,
                                tag=f"c{rep}k{k}")
                    r = lg.run(spec)
                    ops = r.ops_s * args.duration
                    cpu_us = (cpu_of(c) - before) / ops * 1e6 if ops else float("nan")
                    runs.setdefault((name, k), []).append((r.ops_s, r.p99_ms, cpu_us))
                    print(f"  round {rep + 1} {k:>3} cores {name:<7} {r.ops_s:8.0f} ops/s "
                          f"p99 {fmt(r.p99_ms)} ms cpu {fmt(cpu_us, 0)} us/op errors {r.errors}",
                          file=sys.stderr, flush=True)

    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for (name, k), rs in runs.items():
        rows.setdefault(name, {})[str(k)] = {
            "ops_s": median([x[0] for x in rs]), "p99_ms": median([x[1] for x in rs]),
            "cpu_us_per_op": median([x[2] for x in rs]),
            "disjoint": 3 * k <= len(allowed)}
    print(f"\n{args.workload} {args.concurrency} concurrent, 256 B, each member pinned to k cores; medians of "
          f"{args.reps} interleaved rounds of {args.duration:g}s")
    print(f"machine: {machine()}  ({time.time() - started:.0f}s)")
    hdr = f"{'cores':>5}{'disjoint':>9}"
    width = {name: max(14, len(name) + 8) for name in names}
    for name in names:
        hdr += f"{name + ' ops/s':>{width[name]}}{'p99 ms':>8}{'us/op':>7}{'vs 1st':>7}"
    if "etcd" in names and "accord" in names:
        hdr += f"{'a/e':>6}"
    print(hdr + "   (us/op: CPU of all three members per put)")
    print("-" * len(hdr))
    scaling: dict[str, dict[str, float]] = {n: {} for n in names}
    for k in counts:
        line = f"{k:>5}{'yes' if 3 * k <= len(allowed) else 'no':>9}"
        for name in names:
            row, first = rows[name][str(k)], rows[name][str(counts[0])]
            s = row["ops_s"] / first["ops_s"] if first["ops_s"] else float("nan")
            scaling[name][str(k)] = round(s, 3)
            line += (f"{fmt(row['ops_s'], 0):>{width[name]}}{fmt(row['p99_ms'], 1):>8}"
                     f"{fmt(row['cpu_us_per_op'], 0):>7}{fmt(s):>7}")
        if "etcd" in names and "accord" in names:
            e = rows["etcd"][str(k)]["ops_s"]
            line += f"{fmt(rows['accord'][str(k)]['ops_s'] / e if e else float('nan')):>6}"
        print(line)
    print(json.dumps(clean({"bench": "cores", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": machine(), "cpus": len(allowed), "counts": counts,
                      "workload": args.workload, "concurrency": args.concurrency, "duration_s": args.duration,
                      "reps": args.reps, "node_workers": node_workers, "rows": rows,
                      "scaling_vs_first": scaling}),
                     allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
