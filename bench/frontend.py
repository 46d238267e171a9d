"""CPU per call of a ``grpc.aio`` server, by how its services are registered.

The server answers ``KV/Put`` with an empty response and does nothing else; a client in
this process keeps ``--concurrency`` calls in flight over one channel. The figure is the
*server process's* CPU time (``/proc/<pid>/stat``) per call, so it is what the front end
costs, with no store behind it. Variants (each in a fresh server process, interleaved
over ``--reps`` rounds, alternating the order):

* ``kv-only``: the KV service alone, registered as the generated code does;
* ``every-service``: every service an accord node serves (etcd's, locks, elections,
  scheduler, checkpoints, membership: ~80 methods), registered as the generated code
  does, i.e. also as *registered methods*: ``grpc.aio`` then keeps one request task per
  method and waits on all of them for every call;
* ``every-service-table``: the same services through accord's
  ``accord.node.grpc_server.generic_only`` (one method table, no registered methods);
* ``table+interceptors``: the previous with accord's interceptor chain (metrics,
  etcd metadata, auth with auth off), as ``build_server`` assembles it;
* ``sync-kv``: the KV service alone on grpcio's *synchronous* server (a thread pool of
  ``SYNC_THREADS`` threads answering from C-core's completion queue), to weigh that
  engine against ``grpc.aio``;
* ``sync-hop``: the same, each call handed to an asyncio (uvloop) event loop in its own
  thread and awaited there (``run_coroutine_threadsafe``), as a node whose store lives
  on one loop would have to serve through a synchronous front end;
* ``sync-callback``: the leanest such hand-off: the loop is woken with
  ``call_soon_threadsafe`` and answers through a ``concurrent.futures.Future`` (no task).

Usage: ``python bench/frontend.py [--calls 6000] [--concurrency 64] [--reps 4]``. Prints a
table (medians over rounds) and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = ("kv-only", "every-service", "every-service-table", "table+interceptors",
            "sync-kv", "sync-hop", "sync-callback")
SYNC_THREADS = 16
"""Threads of the synchronous server's pool (grpcio's examples use 10)."""


def _serve_sync(hop: str, port_q: Any, stop: Any) -> None:
    """The ``sync-*`` server process: grpcio's thread-pool server, KV/Put only."""
    import threading
    from concurrent import futures

    import grpc
    import uvloop

    from accord.proto import rpc_pb2, rpc_pb2_grpc

    loop = uvloop.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def answer() -> Any:
        return rpc_pb2.PutResponse()

    class KV(rpc_pb2_grpc.KVServicer):
        def Put(self, request: Any, context: Any) -> Any:
            if hop == "hop":
                return asyncio.run_coroutine_threadsafe(answer(), loop).result()
            if hop == "callback":
                done: futures.Future[Any] = futures.Future()
                loop.call_soon_threadsafe(done.set_result, rpc_pb2.PutResponse())
                return done.result()
            return rpc_pb2.PutResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SYNC_THREADS))
    rpc_pb2_grpc.add_KVServicer_to_server(KV(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_q.put(port)
    stop.wait()
    server.stop(0)
    loop.call_soon_threadsafe(loop.stop)


def _serve(variant: str, port_q: Any, stop: Any) -> None:
    """The server process: one variant until ``stop`` is set."""
    if variant.startswith("sync-"):
        _serve_sync(variant[len("sync-"):], port_q, stop)
        return
    import grpc
    import uvloop

    from accord.node.grpc_server import MetadataInterceptor, generic_only
    from accord.node.grpcmetrics import GrpcMetricsInterceptor
    from accord.proto import (
        checkpoints_pb2_grpc,
        membership_pb2_grpc,
        rpc_pb2,
        rpc_pb2_grpc,
        scheduling_pb2_grpc,
        v3election_pb2_grpc,
        v3lock_pb2_grpc,
    )
    from accord.services.auth.guard import local_guard
    from accord.services.auth.interceptor import AuthInterceptor

    class NoBackend:
        def header_info(self) -> Any:
            raise AssertionError("no hasleader metadata is sent")

    class KV(rpc_pb2_grpc.KVServicer):
        async def Put(self, request: Any, context: Any) -> Any:
            return rpc_pb2.PutResponse()

    async def main() -> None:
        interceptors: list[Any] = []
        if variant == "table+interceptors":
            interceptors = [GrpcMetricsInterceptor(), MetadataInterceptor(cast(Any, NoBackend()), Counter()),
                            AuthInterceptor(local_guard())]
        server = grpc.aio.server(interceptors=interceptors)
        if "table" in variant:
            generic_only(server)
        rpc_pb2_grpc.add_KVServicer_to_server(KV(), server)  # type: ignore[no-untyped-call]
        if variant != "kv-only":
            for mod in (rpc_pb2_grpc, v3lock_pb2_grpc, v3election_pb2_grpc, scheduling_pb2_grpc,
                        checkpoints_pb2_grpc, membership_pb2_grpc):
                for name in dir(mod):
                    if (name.startswith("add_") and name.endswith("Servicer_to_server")
                            and name != "add_KVServicer_to_server"):
                        base = getattr(mod, name[len("add_"):-len("_to_server")])
                        getattr(mod, name)(base(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(port)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    uvloop.run(main())


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(variant: str, calls: int, concurrency: int) -> tuple[float, float]:
    """(server CPU us per call, calls/s) of one variant in a fresh server process."""
    import grpc
    import uvloop

    from accord.proto import rpc_pb2, rpc_pb2_grpc

    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(variant, port_q, stop), daemon=True)
    proc.start()
    try:
        port = port_q.get(timeout=60)

        async def client() -> tuple[float, float]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = rpc_pb2_grpc.KVStub(ch)  # type: ignore[no-untyped-call]
                req = rpc_pb2.PutRequest(key=b"k", value=b"v" * 256)
                for _ in range(300):  # warm up
                    await stub.Put(req, timeout=10)
                per = max(1, calls // concurrency)

                async def worker() -> None:
                    for _ in range(per):
                        await stub.Put(req, timeout=10)

                c0, t0 = _cpu(proc.pid or 0), time.monotonic()
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                c1, t1 = _cpu(proc.pid or 0), time.monotonic()
                n = per * concurrency
                return (c1 - c0) / n * 1e6, n / (t1 - t0)

        return uvloop.run(client())
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=6000, help="calls per variant and round")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--reps", type=int, default=4, help="interleaved rounds (default 4)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    runs: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for rep in range(args.reps):
        for v in variants if rep % 2 == 0 else variants[::-1]:
            runs[v].append(measure(v, args.calls, args.concurrency))
            print(f"  round {rep + 1} {v:<22} {runs[v][-1][0]:7.1f} us/call "
                  f"{runs[v][-1][1]:7.0f} calls/s", file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"\ngRPC server CPU per KV/Put call, medians of {args.reps} rounds "
          f"({args.calls} calls, {args.concurrency} in flight; load {load})")
    print(f"{'variant':<22}{'cpu us/call':>12}{'calls/s':>10}   all rounds (us/call)")
    table = {}
    for v in variants:
        cpu = statistics.median(x[0] for x in runs[v])
        rate = statistics.median(x[1] for x in runs[v])
        table[v] = {"cpu_us_per_call": cpu, "calls_s": rate, "rounds": [x[0] for x in runs[v]]}
        print(f"{v:<22}{cpu:>12.1f}{rate:>10.0f}   {[round(x[0]) for x in runs[v]]}")
    print(json.dumps({"bench": "frontend", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "load": float(load), "variants": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
