"""Failover: time from kill -9 of the leader to the next acknowledged write, accord vs etcd.

One run starts a real 3-member etcd (fsync on) and a 3-node accord with the same
``--heartbeat-interval`` and ``--election-timeout`` (default 100 / 1000 ms, etcd's
defaults), then, ``--kills`` times for each system, alternating which goes first:

1. finds the leader (``Maintenance.Status``: the member whose ``header.member_id`` is
   the ``leader`` every live member reports) and opens warm channels to the survivors;
2. ``kill -9`` the leader by PID and starts the clock;
3. sends a Put to every survivor every ``--probe-ms`` (each attempt with its own
   timeout, without waiting for earlier ones) until one is acknowledged: that instant
   ends the measurement. With ``--keys N`` (for a sharded accord, whose ``Status``
   names the meta group's leader, which need not lead a given key's shard) it probes
   N keys and ends when every one of them has been acknowledged: every shard the
   killed node led is writable again;
4. restarts the killed member on its data and waits until all three agree on a leader.

Reports median, p90, min and max per system and the accord/etcd median ratio (goal:
at most 1.0). Usage: ``python bench/failover.py [--kills 20] [--heartbeat 100]
[--election 1000] [--probe-ms 10] [--keys 1]``. Prints a table; the last line is one
JSON object.

accord reacts to the killed leader's closed TCP links (``RaftCore.leader_unreachable``):
its followers campaign within a few ticks instead of an election timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.proto import rpc_pb2  # noqa: E402
from accord.proto import rpc_pb2_grpc as _rpc_grpc  # noqa: E402

rpc_pb2_grpc: Any = _rpc_grpc  # generated stubs are untyped
from bench.harness import Cluster, Harness, Member, machine  # noqa: E402
from bench.loadgen import percentile  # noqa: E402

GIVE_UP_S = 60.0
ATTEMPT_TIMEOUT_S = 5.0
MANY_KEYS_ATTEMPT_TIMEOUT_S = 1.0
"""With several keys, hopeless attempts (sent before recovery) end sooner, so that the
number of attempts in flight stays bounded; later attempts find the new leader."""


async def kill_and_time(leader: Member, survivors: list[Member], keys: list[bytes],
                        probe_s: float) -> float:
    """kill -9 ``leader``; seconds until a Put of every key through ``survivors`` is
    acknowledged (each key by any survivor)."""
    channels = [grpc.aio.insecure_channel(m.endpoint) for m in survivors]
    try:
        stubs = [rpc_pb2_grpc.KVStub(ch) for ch in channels]
        for ch in channels:  # connect before the clock starts
            await asyncio.wait_for(ch.channel_ready(), 10.0)
        done = asyncio.Event()
        acked: dict[bytes, float] = {}
        pending: set[asyncio.Task[None]] = set()

        many = len(keys) > 1
        timeout = MANY_KEYS_ATTEMPT_TIMEOUT_S if many else ATTEMPT_TIMEOUT_S
        max_pending = max(2000, 200 * len(keys))

        async def attempt(stub: rpc_pb2_grpc.KVStub, key: bytes) -> None:
            try:
                await stub.Put(rpc_pb2.PutRequest(key=key, value=b"failover"), timeout=timeout)
            except grpc.RpcError:
                return
            if key not in acked:
                acked[key] = time.monotonic()
                if len(acked) == len(keys):
                    done.set()

        assert leader.proc is not None
        os.kill(leader.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        deadline = t0 + GIVE_UP_S
        rounds = 0
        while not done.is_set() and time.monotonic() < deadline:
            rounds += 1
            for k, key in enumerate(keys):
                if key in acked:
                    continue
                # One key: every survivor each round. Several: one survivor per key per
                # round, in turn, to keep the probe rate moderate.
                for stub in ([stubs[(rounds + k) % len(stubs)]] if many else stubs):
                    if len(pending) < max_pending:
                        t = asyncio.ensure_future(attempt(stub, key))
                        pending.add(t)
                        t.add_done_callback(pending.discard)
            with_timeout = asyncio.ensure_future(done.wait())
            await asyncio.wait({with_timeout}, timeout=probe_s)
            with_timeout.cancel()
        for t in list(pending):
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        leader.proc.wait(10)
        if len(acked) < len(keys):
            raise RuntimeError(f"{len(keys) - len(acked)} of {len(keys)} keys not acknowledged "
                               f"within {GIVE_UP_S}s of killing {leader.name}")
        return max(acked.values()) - t0
    finally:
        for ch in channels:
            await ch.close()


def one_failover(c: Cluster, i: int, probe_s: float, nkeys: int = 1) -> tuple[float, str]:
    """Kill the leader of ``c``, time the next write (of every one of ``nkeys`` keys),
    restart it and wait for a full cluster."""
    leader = c.leader()
    survivors = [m for m in c.members if m is not leader]
    keys = [f"failover/{i}".encode()] if nkeys == 1 else [
        f"failover/{i}/{k}".encode() for k in range(nkeys)]
    dt = asyncio.run(kill_and_time(leader, survivors, keys, probe_s))
    leader.start()
    leader.wait_serving(60)
    c.leader(timeout=60)
    c.wait_ready(60)
    return dt, leader.name


def summary(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {"n": len(s), "median_ms": statistics.median(s) * 1e3, "p90_ms": percentile(s, 0.9) * 1e3,
            "min_ms": s[0] * 1e3, "max_ms": s[-1] * 1e3}


def main(argv: list[str] | None = None) -> int:
    """Run the failover benchmark; print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20, help="leader kills per system (default 20)")
    p.add_argument("--heartbeat", type=int, default=100, help="heartbeat interval ms (default 100)")
    p.add_argument("--election", type=int, default=1000, help="election timeout ms (default 1000)")
    p.add_argument("--probe-ms", type=float, default=10.0, help="ms between write attempts")
    p.add_argument("--keys", type=int, default=1,
                   help="keys that must all be written again (default 1; more for sharded "
                        "clusters, whose shards may be led by other members)")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    args = p.parse_args(argv)
    if args.kills < 1 or args.probe_ms <= 0 or not 1 <= args.keys <= 256:
        p.error("--kills must be >= 1, --probe-ms > 0 and --keys in 1..256")
    started = time.time()
    times: dict[str, list[float]] = {"etcd": [], "accord": []}
    with Harness(keep=args.keep) as h:
        kw = {"heartbeat_ms": args.heartbeat, "election_ms": args.election}
        systems: dict[str, Cluster] = {"etcd": h.etcd(**kw), "accord": h.accord(**kw)}
        for i in range(args.kills):
            order = ["etcd", "accord"] if i % 2 == 0 else ["accord", "etcd"]
            for name in order:
                dt, who = one_failover(systems[name], i, args.probe_ms / 1e3, args.keys)
                times[name].append(dt)
                print(f"  kill {i + 1:2d} {name:<6} leader {who}: write acknowledged after "
                      f"{dt * 1e3:7.1f} ms", file=sys.stderr, flush=True)
    res = {name: summary(v) for name, v in times.items()}
    ratio = res["accord"]["median_ms"] / res["etcd"]["median_ms"]
    print(f"\nfailover: kill -9 of the leader -> next acknowledged write "
          f"(heartbeat {args.heartbeat} ms, election timeout {args.election} ms, {args.kills} kills each"
          f"{'' if args.keys == 1 else f', every one of {args.keys} keys'})")
    print(f"machine: {machine()}  ({time.time() - started:.0f}s)")
    print(f"{'system':<8}{'median ms':>10}{'p90 ms':>9}{'min ms':>9}{'max ms':>9}")
    for name, r in res.items():
        print(f"{name:<8}{r['median_ms']:>10.0f}{r['p90_ms']:>9.0f}{r['min_ms']:>9.0f}{r['max_ms']:>9.0f}")
    print(f"accord/etcd median: {ratio:.2f}  (goal <= 1.0: {'met' if ratio <= 1.0 else 'MISSED'})")
    out: dict[str, Any] = {
        "bench": "failover", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(), "heartbeat_ms": args.heartbeat, "election_ms": args.election,
        "kills": args.kills, "keys": args.keys, "results": res,
        "samples_ms": {k: [round(x * 1e3, 1) for x in v] for k, v in times.items()},
        "ratios": {"median_accord_over_etcd": round(ratio, 3)}, "goal_met": ratio <= 1.0,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
