"""Fenced locks: acquire+release latency and throughput, accord beside a real etcd.

One run starts a real 3-member etcd (fsync on, etcd's defaults) and a 3-node accord on
this machine with the same heartbeat/election settings, then measures on each:

* ``client``: the accord client library's fenced recipe (``accord.locks.recipe`` over
  KV/Lease/Watch: enqueue, Raft-committed grant with the lease re-check, release). It
  runs unchanged against etcd, so this row compares the stores under one recipe.
* ``v3lock``: the ``v3lockpb.Lock/Unlock`` RPCs: on etcd, etcd's own recipe
  (``concurrency.Mutex``, run inside the etcd server); on accord, the same fenced
  recipe run inside the accord server (``accord/locks/servicer.py``).

Each in two shapes: *uncontended* (one client, ``--ops`` acquire+release cycles in a
row on one session; latency per cycle) and *contended* (``--clients`` clients, each with
its own session, all contending for one lock, ``--rounds`` cycles each; throughput in
acquisitions per second and the wait from asking to holding). Clients are spread over
the members round-robin. The 2 cores are shared by clients and both clusters: figures are
noisy, ratios less so.

Usage: ``python bench/locks.py [--ops 200] [--clients 64] [--rounds 3] [--reps 1]``.
Prints a table; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.client import AccordClient  # noqa: E402
from accord.locks import recipe  # noqa: E402
from accord.proto import rpc_pb2, v3lock_pb2  # noqa: E402
from accord.proto import rpc_pb2_grpc as _rpc  # noqa: E402
from accord.proto import v3lock_pb2_grpc as _v3lock  # noqa: E402
from bench.harness import Cluster, Harness, machine  # noqa: E402

rpc_grpc: Any = _rpc
v3lock_grpc: Any = _v3lock


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` in milliseconds (nearest rank)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return 1000.0 * s[min(len(s) - 1, int(q * len(s)))]


def rotate(eps: list[str], i: int) -> list[str]:
    return eps[i % len(eps):] + eps[: i % len(eps)]


# --- the accord client recipe --------------------------------------------------------------
async def client_uncontended(eps: list[str], ops: int, name: str) -> dict[str, float]:
    lat: list[float] = []
    async with AccordClient(eps) as c, c.lease(30) as session:
        t_all = time.perf_counter()
        for _ in range(ops):
            t0 = time.perf_counter()
            held = await recipe.acquire(c.lock_store, name, session.id)
            await recipe.release(c.lock_store, held)
            lat.append(time.perf_counter() - t0)
        wall = time.perf_counter() - t_all
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "ops_s": ops / wall}


async def client_contended(eps: list[str], clients: int, rounds: int, name: str) -> dict[str, float]:
    waits: list[float] = []
    start = asyncio.Event()
    tokens: list[int] = []

    async def one(i: int) -> None:
        async with AccordClient(rotate(eps, i), retry_budget_s=120) as c, c.lease(60) as s:
            await start.wait()
            for _ in range(rounds):
                t0 = time.perf_counter()
                held = await recipe.acquire(c.lock_store, name, s.id)
                waits.append(time.perf_counter() - t0)
                tokens.append(held.token)
                await recipe.release(c.lock_store, held)

    tasks = [asyncio.create_task(one(i)) for i in range(clients)]
    await asyncio.sleep(1.0)  # sessions granted
    t_all = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t_all
    assert len(set(tokens)) == len(tokens), "a token was granted twice"
    return {"acq_s": len(waits) / wall, "wait_p50_ms": pct(waits, 0.5), "wait_p99_ms": pct(waits, 0.99)}


# --- v3lock RPCs ----------------------------------------------------------------------------
async def _grant(ch: grpc.aio.Channel, ttl: int) -> int:
    return int((await rpc_grpc.LeaseStub(ch).LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=ttl))).ID)


async def v3lock_uncontended(eps: list[str], ops: int, name: str) -> dict[str, float] | None:
    lat: list[float] = []
    async with grpc.aio.insecure_channel(eps[0]) as ch:
        stub = v3lock_grpc.LockStub(ch)
        lease = await _grant(ch, 60)
        t_all = time.perf_counter()
        for _ in range(ops):
            t0 = time.perf_counter()
            try:
                got = await stub.Lock(v3lock_pb2.LockRequest(name=name.encode(), lease=lease), timeout=30)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return None
                raise
            await stub.Unlock(v3lock_pb2.UnlockRequest(key=got.key), timeout=30)
            lat.append(time.perf_counter() - t0)
        wall = time.perf_counter() - t_all
    return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "ops_s": ops / wall}


async def v3lock_contended(eps: list[str], clients: int, rounds: int, name: str) -> dict[str, float] | None:
    waits: list[float] = []
    start = asyncio.Event()
    channels = [grpc.aio.insecure_channel(eps[i % len(eps)]) for i in range(clients)]
    try:
        leases = [await _grant(ch, 120) for ch in channels]

        async def one(i: int) -> None:
            stub = v3lock_grpc.LockStub(channels[i])
            await start.wait()
            for _ in range(rounds):
                t0 = time.perf_counter()
                got = await stub.Lock(v3lock_pb2.LockRequest(name=name.encode(), lease=leases[i]), timeout=120)
                waits.append(time.perf_counter() - t0)
                await stub.Unlock(v3lock_pb2.UnlockRequest(key=got.key), timeout=30)

        tasks = [asyncio.create_task(one(i)) for i in range(clients)]
        t_all = time.perf_counter()
        start.set()
        try:
            await asyncio.gather(*tasks)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                for t in tasks:
                    t.cancel()
                return None
            raise
        wall = time.perf_counter() - t_all
    finally:
        for ch in channels:
            await ch.close()
    return {"acq_s": len(waits) / wall, "wait_p50_ms": pct(waits, 0.5), "wait_p99_ms": pct(waits, 0.99)}


async def measure(cluster: Cluster, args: argparse.Namespace, rep: int) -> dict[str, Any]:
    eps = cluster.endpoints
    leader = cluster.leader().endpoint
    eps = [leader] + [e for e in eps if e != leader]
    tag = f"{cluster.kind}-{rep}"
    return {
        "client_uncontended": await client_uncontended(eps, args.ops, f"bench/u-{tag}"),
        "v3lock_uncontended": await v3lock_uncontended(eps, args.ops, f"bench/v-{tag}"),
        "client_contended": await client_contended(eps, args.clients, args.rounds, f"bench/c-{tag}"),
        "v3lock_contended": await v3lock_contended(eps, args.clients, args.rounds, f"bench/vc-{tag}"),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cell in runs[0]:
        vals = [r[cell] for r in runs if r[cell] is not None]
        out[cell] = None if not vals else {k: statistics.median(v[k] for v in vals) for k in vals[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200, help="uncontended acquire+release cycles")
    ap.add_argument("--clients", type=int, default=64, help="contending clients")
    ap.add_argument("--rounds", type=int, default=3, help="cycles per contending client")
    ap.add_argument("--reps", type=int, default=1, help="interleaved repetitions (medians)")
    ap.add_argument("--heartbeat", type=int, default=100)
    ap.add_argument("--election", type=int, default=1000)
    args = ap.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"etcd": [], "accord": []}
    with Harness() as h:
        etcd = h.etcd(heartbeat_ms=args.heartbeat, election_ms=args.election)
        acc = h.accord(heartbeat_ms=args.heartbeat, election_ms=args.election)
        for rep in range(args.reps):
            order = [etcd, acc] if rep % 2 == 0 else [acc, etcd]
            for cluster in order:
                results[cluster.kind].append(asyncio.run(measure(cluster, args, rep)))
    med = {k: median_of(v) for k, v in results.items()}
    print(f"# locks: {machine()}; uncontended {args.ops} ops; contended {args.clients} clients x {args.rounds}")
    print(f"{'cell':<22}{'system':<8}{'p50 ms':>10}{'p99 ms':>10}{'per s':>10}")
    for cell in med["etcd"]:
        for system in ("etcd", "accord"):
            r = med[system][cell]
            if r is None:
                print(f"{cell:<22}{system:<8}{'(not served)':>30}")
                continue
            p50 = r.get("p50_ms", r.get("wait_p50_ms"))
            p99 = r.get("p99_ms", r.get("wait_p99_ms"))
            rate = r.get("ops_s", r.get("acq_s"))
            print(f"{cell:<22}{system:<8}{p50:>10.2f}{p99:>10.2f}{rate:>10.1f}")
    ratios: dict[str, float | None] = {}
    for cell in med["etcd"]:
        e, a = med["etcd"][cell], med["accord"][cell]
        key = "ops_s" if "ops_s" in (e or a or {}) else "acq_s"
        ratios[f"{cell}_rate_accord_over_etcd"] = (
            round(a[key] / e[key], 3) if e and a and e[key] else None
        )
    for k, v in ratios.items():
        print(f"{k}: {v}")
    out = {"bench": "locks", "machine": machine(), "ops": args.ops, "clients": args.clients,
           "rounds": args.rounds, "reps": args.reps, "etcd": med["etcd"], "accord": med["accord"],
           "ratios": ratios}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
