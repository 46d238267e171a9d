"""The load generator: etcd v3 gRPC, asyncio, several worker processes, one parent.

:class:`LoadGen` starts ``workers`` processes once (``spawn``; each runs uvloop and
keeps one ``grpc.aio`` channel per endpoint across runs) and then, for every
:class:`Spec`, sends it to all of them, waits until every worker has done its setup
(seeding keys, granting leases, opening watch streams), gives them one common start
instant, and merges what they measured: ops completed inside the window, errors, and
every op's latency, into a :class:`Result` (ops/s, p50, p99). The same generator drives
etcd, accord and the do-nothing server, so their figures compare.

Workloads (``Spec.workload``):

* ``put``: 256-byte values over a small key set per client (all under ``bench/``: one
  partition, so one shard of a sharded accord);
* ``sput``: the same with each client's keys in a partition of its own (spread over the
  shards, and over a node's workers);
* ``get`` / ``sget``: linearizable / serializable Range of one of 1,000 seeded keys;
* ``txn``: compare-and-set, ``Txn(mod_revision == last) then Put``;
* ``stxn``: the same with each client's key in a partition of its own (one-shard Txns
  spread over the shards as ``txn2``'s are: its one-shard baseline at the same spread);
* ``txn2``: the same over two keys of different partitions (on an 8-shard accord: two
  shards), ``Txn(both mod_revisions == last) then Put both``; each client's two keys in
  partitions of their own (spread over the shards, as ``stxn``'s);
* ``htxn2``: ``txn2`` with every client's two keys in the same two partitions (``bench``
  and another on a different shard of an 8-shard accord): the two-shard analog of
  ``txn``'s layout, where every client's key shares one partition;
* ``mixed``: 90% linearizable get, 10% put;
* ``scan``: a linearizable Range over 16 keys of 16 partitions (on a sharded accord: a
  read of every shard, merged at one revision); ``wscan``: the same with one op in ten
  a Put of one of those keys;
* ``lock``: acquire (``Txn(create_revision == 0) then Put with lease``) and release
  (``DeleteRange``), etcd's lock recipe without waiters; one op is the pair;
* ``revoke``: a session's life, ``LeaseGrant``, a ``Put`` of the client's key with that
  lease, ``LeaseRevoke`` (on an 8-shard accord the revoke holds the lease on every shard
  until its decision: ``docs/txn.md``); one op is the three;
* ``watch``: ``watchers`` Watch streams on one key, one writer putting ``rate`` times a
  second a value carrying its send time; the latency is per delivered event;
* ``lease``: ``leases`` leases granted once, then ``concurrency`` LeaseKeepAlive streams
  renewing them in turn; the latency is per keepalive round trip;
* ``load``: put ``total`` distinct keys once each (memory measurement), no time limit.

A Spec with a ``token`` sends it on every call, as etcd's clients do once logged in.

Clients are spread round-robin over the endpoints in the order given (the first client
of every worker on the first endpoint), so callers put the leader first.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import multiprocessing as mp
import random
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKLOADS = ("put", "sput", "get", "sget", "txn", "stxn", "txn2", "htxn2", "mixed", "scan",
             "wscan", "lock", "revoke", "watch", "lease", "load")
RPC_TIMEOUT = 10.0
READ_KEYS = 1000


@dataclass(slots=True)
class Spec:
    """One measurement: a workload, its targets and its shape."""

    workload: str
    endpoints: list[str]
    concurrency: int = 1
    duration: float = 5.0
    value_size: int = 256
    tag: str = "b"
    """Key prefix of this run; runs with different tags do not share keys."""
    watchers: int = 1000
    rate: float = 10.0
    """Watch workload: puts per second of the single writer."""
    leases: int = 10_000
    total: int = 100_000
    """Load workload: distinct keys to put."""
    check: bool = True
    """Reads fail when a seeded key is missing (off for the do-nothing server)."""
    tls: tuple[str, str, str] | None = None
    """(CA, certificate, key) files: dial the endpoints over mutual TLS."""
    token: str = ""
    """An auth token every call carries as ``token`` metadata (etcd's clients' way)."""

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; one of {', '.join(WORKLOADS)}")
        if self.concurrency < 1 or self.duration <= 0 or not self.endpoints:
            raise ValueError(f"bad spec {self}: concurrency >= 1, duration > 0, endpoints needed")


@dataclass(slots=True)
class Result:
    """What one run measured (latencies in milliseconds)."""

    ops: int
    elapsed: float
    errors: int
    p50_ms: float
    p99_ms: float
    extra: dict[str, float] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def ops_s(self) -> float:
        return self.ops / self.elapsed if self.elapsed > 0 else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of an ascending list, nearest rank; NaN when empty."""
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[i]


def share(total: int, parts: int, index: int) -> int:
    """Index ``index``'s share when ``total`` is split as evenly as possible in ``parts``."""
    return total // parts + (1 if index < total % parts else 0)


class LoadGen:
    """A pool of worker processes driving gRPC load (see the module docstring)."""

    def __init__(self, workers: int = 3) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for i in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_entry, args=(i, workers, child), daemon=True,
                            name=f"loadgen-{i}")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if c.recv() != "up":
                raise RuntimeError("load generator worker failed to start")

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs]

    def run(self, spec: Spec, setup_timeout: float = 600.0) -> Result:
        """Run ``spec`` on every worker at once; merge their figures."""
        for c in self.conns:
            c.send(("spec", spec))
        for c in self.conns:
            if not c.poll(setup_timeout):
                raise RuntimeError(f"{spec.workload}: worker setup took over {setup_timeout}s")
            msg = c.recv()
            if msg[0] != "ready":
                raise RuntimeError(f"{spec.workload}: worker setup failed: {msg[1]}")
        start = time.monotonic() + 0.2
        for c in self.conns:
            c.send(("go", start))
        ops = errors = 0
        lat = array.array("d")
        kinds: Counter[str] = Counter()
        extra: Counter[str] = Counter()
        end = start
        for c in self.conns:
            if not c.poll(spec.duration + setup_timeout):
                raise RuntimeError(f"{spec.workload}: a worker did not report")
            msg = c.recv()
            if msg[0] != "done":
                raise RuntimeError(f"{spec.workload}: worker failed: {msg[1]}")
            _, n, e, raw, k, x, wend = msg
            ops += n
            errors += e
            lat.frombytes(raw)
            kinds.update(k)
            extra.update(x)
            end = max(end, wend)
        values = sorted(lat)
        elapsed = end - start
        return Result(ops, elapsed, errors, percentile(values, 0.5) * 1e3,
                      percentile(values, 0.99) * 1e3, dict(extra), dict(kinds))

    def close(self) -> None:
        """Ask every worker to quit; kill by PID whoever does not."""
        for c in self.conns:
            with contextlib.suppress(OSError, ValueError):
                c.send(("quit", None))
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.conns.clear()
        self.procs.clear()

    def __enter__(self) -> LoadGen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------
# worker side


def _worker_entry(index: int, count: int, conn: Connection) -> None:
    try:
        import uvloop

        uvloop.run(_worker_main(index, count, conn))
    except ImportError:
        asyncio.run(_worker_main(index, count, conn))


async def _worker_main(index: int, count: int, conn: Connection) -> None:
    from bench.workloads import Worker  # heavy imports only in the workers

    loop = asyncio.get_running_loop()
    worker = Worker(index, count)
    conn.send("up")
    try:
        while True:
            kind, payload = await loop.run_in_executor(None, conn.recv)
            if kind == "quit":
                return
            spec: Spec = payload
            try:
                run = await worker.prepare(spec)
            except Exception as e:  # report, keep serving the parent
                conn.send(("error", f"{type(e).__name__}: {e}"))
                continue
            conn.send(("ready",))
            kind, start = await loop.run_in_executor(None, conn.recv)
            try:
                res = await run(start, start + spec.duration)
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
                continue
            conn.send(("done", res.ops, res.errors, res.latencies.tobytes(),
                       dict(res.kinds), dict(res.extra), res.end))
    finally:
        await worker.close()


def random_value(size: int) -> bytes:
    """``size`` random printable bytes."""
    return bytes(random.choice(b"abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size))


def stamp(value_size: int) -> bytes:
    """A value whose first 8 bytes are the monotonic send time (watch latency)."""
    return struct.pack("<d", time.monotonic()) + b"w" * max(0, value_size - 8)


def unstamp(value: bytes) -> float:
    """The send time carried by a :func:`stamp` value."""
    return float(struct.unpack_from("<d", value)[0])


