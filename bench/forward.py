"""The forwarding hop between a node's workers, measured: CPU per call on both ends.

``docs/workers.md`` sizes a node of ``W`` workers with ``f``, the CPU one forwarded call
costs (the caller's worker writes a frame to the owner's Unix socket, the owner decodes
it, runs the call and answers, the caller decodes the answer), and took ``f`` ~ 80 us
from the peer links' figures. This measures it on ``accord/node/forward.py`` itself:
an owner process (this script with ``--serve``) answers every call with a fixed
response at once (the call's own work is not part of ``f``), and this process, as the
forwarding worker, keeps ``--concurrency`` calls in flight for ``--duration`` seconds.

Both processes run uvloop, as a daemon does. For each concurrency it reports calls/s
and the CPU per call of each end (``/proc`` user + system for the owner, the process
time of this one) less what the same loop costs calling an in-process coroutine instead
(the driver's own work, which a real worker spends on the call anyway). Rounds are
interleaved over the concurrencies; medians are printed. There is no etcd column: etcd
has no such hop (its one process uses every core through goroutines), and this figure
is what a worker pays on top of an etcd-like split.

Usage: ``python bench/forward.py [--concurrency 1,16,256] [--duration 3] [--reps 3]
[--body 300]``. Prints a table; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from accord.node.forward import ForwardClient, ForwardServer

_TICK = os.sysconf("SC_CLK_TCK")
METHOD = "/etcdserverpb.KV/Put"


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def serve(path: Path, answer_len: int) -> None:
    """The owner: answer every forwarded call with ``answer_len`` bytes at once."""
    answer = b"r" * answer_len

    async def put(body: bytes) -> bytes:
        return answer

    server = ForwardServer(path, {METHOD: put})
    await server.start()
    await asyncio.Event().wait()


async def drive(call: Callable[[], Awaitable[bytes]], concurrency: int, seconds: float) -> int:
    """Keep ``concurrency`` calls in flight for ``seconds``; the number completed."""
    done = 0
    stop = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await call()
            done += 1

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


async def measure(client: ForwardClient, owner_pid: int, body: bytes, concurrency: int,
                  seconds: float) -> dict[str, float]:
    """One cell: forwarded calls, then the in-process baseline, same loop."""

    async def forwarded() -> bytes:
        return await client.call(METHOD, body, 10.0)

    async def local() -> bytes:
        await asyncio.sleep(0)
        return body

    c0, o0, t0 = time.process_time(), proc_cpu_s(owner_pid), time.monotonic()
    n = await drive(forwarded, concurrency, seconds)
    c1, o1, t1 = time.process_time(), proc_cpu_s(owner_pid), time.monotonic()
    m = await drive(local, concurrency, seconds)
    c2 = time.process_time()
    base_us = (c2 - c1) / max(m, 1) * 1e6
    caller_us = (c1 - c0) / n * 1e6 - base_us
    owner_us = (o1 - o0) / n * 1e6
    return {"calls_s": n / (t1 - t0), "caller_us": caller_us, "owner_us": owner_us,
            "f_us": caller_us + owner_us, "baseline_us": base_us}


async def main_async(args: argparse.Namespace) -> None:
    conc = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="fwd-") as tmp:
        path = Path(tmp) / "worker-1.sock"
        owner = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve", str(path), "--answer", str(args.answer))
        try:
            for _ in range(500):
                if path.exists():
                    break
                await asyncio.sleep(0.02)
            client = ForwardClient(path)
            body = b"b" * args.body
            await drive(lambda: client.call(METHOD, body, 10.0), 16, 0.5)  # warm up
            cells: dict[int, list[dict[str, float]]] = {c: [] for c in conc}
            for rep in range(args.reps):
                order = conc if rep % 2 == 0 else list(reversed(conc))
                for c in order:
                    cells[c].append(await measure(client, owner.pid, body, c, args.duration))
            await client.close()
        finally:
            owner.terminate()
            await asyncio.wait_for(owner.wait(), 10)
    load = os.getloadavg()
    print(f"forwarding hop, body {args.body} B, answer {args.answer} B, {args.reps} x "
          f"{args.duration:g} s, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'in flight':>9} {'calls/s':>9} {'caller us':>10} {'owner us':>9} {'f us':>7} {'base us':>8}")
    out: dict[str, object] = {"load": load, "body": args.body, "answer": args.answer}
    for c in conc:
        med = {k: statistics.median(r[k] for r in cells[c]) for k in cells[c][0]}
        out[str(c)] = med
        print(f"{c:>9} {med['calls_s']:>9.0f} {med['caller_us']:>10.1f} {med['owner_us']:>9.1f} "
              f"{med['f_us']:>7.1f} {med['baseline_us']:>8.1f}")
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--concurrency", default="1,16,256")
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--body", type=int, default=300, help="request bytes (a 256-byte put's request)")
    p.add_argument("--answer", type=int, default=40, help="response bytes (a put's header)")
    p.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve is not None:
        uvloop.run(serve(args.serve, args.answer))
    else:
        uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
