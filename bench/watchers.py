"""Writes under watch: what client-library watchers cost a write load, accord and etcd.

One run starts a real 3-member etcd and a 3-node accord (``--shards 8``, the default)
and runs the same write cell (``--cell``, default ``put:16``: the load generator's
puts, every key in one partition) on each twice per round: alone, and while
``--watchers`` watches of accord's own client library (``accord.client``, one client
and one stream each, spread over the members) watch the whole key space and consume
every event. The library is an etcd client as well, so both systems see the same
watchers doing the same work: a stream per watch, a progress request now and then
(``accord/client/watch.py``). The watchers run in a process of their own.

Reported per system and mode: ops/s, p99 and the CPU time of all members per write;
the ratio accord/etcd; and per system the slowdown the watchers cause (watched / alone).
On accord a watch over every shard is merged from eight shards' watchers and each
event on one shard floors the idle ones before it is delivered (``docs/txn.md``): that
is what this cell measures beside the fan-out.

Usage: ``python bench/watchers.py [--watchers 30] [--cell put:16] [--duration 5]
[--reps 3]``. Prints a table; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ab import cpu_of  # noqa: E402
from bench.harness import Cluster, Harness, machine  # noqa: E402
from bench.kv import ordered_endpoints, spec_for  # noqa: E402
from bench.loadgen import LoadGen  # noqa: E402

MODES = ("alone", "watched")


async def watch_everything(count: int, endpoints: list[str]) -> None:
    """The watchers' process: ``count`` clients, each watching every key from now;
    prints ``ready`` once every watch is created, then consumes events until a line
    arrives on stdin, and prints how many events and progress answers it saw."""
    from accord.client import AccordClient

    events = 0
    ready = 0
    watches = []

    async def one(i: int) -> None:
        nonlocal events, ready
        client = await AccordClient.connect(endpoints[i % len(endpoints)], discover=False)
        async with client, client.watch(b"\x00", range_end=b"\x00") as w:
            watches.append(w)
            await w.created()
            ready += 1
            async for _ in w:
                events += 1

    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    async with asyncio.timeout(60):
        while ready < count:
            for t in tasks:
                if t.done():
                    t.result()  # a watch that failed to start: say why
            await asyncio.sleep(0.05)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(json.dumps({"events": events}), flush=True)
    for t in tasks:
        t.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--watchers", type=int, default=30, help="client-library watches (default 30)")
    p.add_argument("--cell", default="put:16", help="the write cell (default put:16)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell (default 5)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--workers", type=int, default=2, help="load generator processes (default 2)")
    p.add_argument("--child", nargs=2, metavar=("COUNT", "ENDPOINTS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        asyncio.run(watch_everything(int(args.child[0]), args.child[1].split(",")))
        return 0
    args.leases = 0
    args.watch_rate = 0.0
    started = time.time()
    runs: dict[tuple[str, str], list[tuple[float, float, float, int]]] = {}
    with Harness() as h, LoadGen(args.workers) as lg:
        systems: dict[str, Cluster] = {"etcd": h.etcd(), "accord": h.accord()}
        combos = [(s, m) for s in systems for m in MODES]
        for rep in range(args.reps):
            for name, mode in (combos if rep % 2 == 0 else combos[::-1]):
                c = systems[name]
                eps = ordered_endpoints(c)
                child = None
                if mode == "watched":
                    child = subprocess.Popen(
                        [sys.executable, str(Path(__file__)), "--child", str(args.watchers),
                         ",".join(eps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    assert child.stdin is not None and child.stdout is not None
                    line = child.stdout.readline().strip()
                    if line != "ready":
                        child.kill()
                        raise RuntimeError(f"{name}: the watchers did not start ({line!r})")
                before = cpu_of(c)
                r = lg.run(spec_for(args.cell, eps, args, name, rep))
                used = cpu_of(c) - before
                events = 0
                if child is not None:
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write("\n")
                    child.stdin.flush()
                    events = int(json.loads(child.stdout.readline())["events"])
                    child.wait(30)
                cpu_us = used / r.ops * 1e6 if r.ops else float("nan")
                runs.setdefault((name, mode), []).append((r.ops_s, r.p99_ms, cpu_us, events))
                print(f"  round {rep + 1} {name:<7}{mode:<8}{r.ops_s:8.0f} ops/s p99 "
                      f"{r.p99_ms:7.2f} ms cpu {cpu_us:6.0f} us/op events {events}",
                      file=sys.stderr, flush=True)

    def med(name: str, mode: str, k: int) -> float:
        return statistics.median(x[k] for x in runs[(name, mode)])

    print(f"\n{args.cell} alone and under {args.watchers} client-library watchers of every "
          f"key; medians of {args.reps} interleaved rounds of {args.duration:g}s")
    print(f"machine: {machine()}  ({time.time() - started:.0f}s)")
    hdr = (f"{'system':<8}{'mode':<9}{'ops/s':>8}{'p99 ms':>9}{'cpu us/op':>11}"
           f"{'events/s':>10}{'watched/alone':>15}")
    print(hdr)
    print("-" * len(hdr))
    figures: dict[str, dict[str, float]] = {}
    for name in ("etcd", "accord"):
        for mode in MODES:
            row = {"ops_s": med(name, mode, 0), "p99_ms": med(name, mode, 1),
                   "cpu_us_per_op": med(name, mode, 2),
                   "events_s": med(name, mode, 3) / args.duration}
            figures[f"{name}_{mode}"] = row
            slow = (f"{row['ops_s'] / figures[f'{name}_alone']['ops_s']:.2f}"
                    if mode == "watched" else "")
            print(f"{name:<8}{mode:<9}{row['ops_s']:>8.0f}{row['p99_ms']:>9.2f}"
                  f"{row['cpu_us_per_op']:>11.0f}{row['events_s']:>10.0f}{slow:>15}")
    ratios = {m: figures[f"accord_{m}"]["ops_s"] / figures[f"etcd_{m}"]["ops_s"] for m in MODES}
    print("accord/etcd ops/s: " + ", ".join(f"{m} {v:.2f}" for m, v in ratios.items()))
    print(json.dumps({"cell": args.cell, "watchers": args.watchers, "reps": args.reps,
                      "figures": figures, "accord_over_etcd": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
