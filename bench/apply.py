"""Micro-benchmark of the KV write path inside one process: CPU per applied put.

Every replica applies every committed command, so on a 3-node cluster on one machine
the state machine's apply runs three times per write; the leader also validates and
encodes each request before proposing it. This measures those pieces alone, with no
Raft, no gRPC and no disk, on a fresh :class:`KVStateMachine` per cell:

* ``put``: ``apply`` of encoded Put commands (256-byte values over ``--keys`` keys, so
  the first pass creates keys and later ones overwrite them);
* ``txn128``: ``apply`` of Txn commands of 128 puts each (what ``client.batcher()``
  sends), reported per put;
* ``propose-put`` / ``propose-txn128``: the leader's work before proposing
  (``validate`` + ``encode``, as ``StateMachineBackend.put``/``txn`` do), per put;
* ``put+watch``: ``put`` with 100 watchers on other keys (the hub's per-put cost when
  nobody watches the written key);
* ``get``: single-key Ranges as the backend serves them (validate + range), per get;
* ``cas`` / ``cas2``: ``bench/kv.py``'s ``stxn`` and ``txn2`` Txns (a compare-and-set of
  one key; of two keys on different shards) through ``StateMachineBackend.txn`` over 8
  shards, every command applied on three replicas as a 3-member cluster applies it (the
  coordinator's work included, no Raft): what a Txn's own Python costs, per Txn.

Each cell runs ``--reps`` times; the table shows the best (least disturbed by the other
tenants of the machine) microseconds per op and ops/s (an op is one put; for ``get``,
one get). ``--profile N`` prints the top
N functions of a cProfile of the ``txn128`` cell instead.

Usage: ``.venv/bin/python bench/apply.py [--ops 100000] [--keys 10000] [--reps 3]``.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.proto import rpc_pb2  # noqa: E402
from accord.services.kv import txnplan  # noqa: E402
from accord.services.kv.backend import HeaderInfo, StateMachineBackend  # noqa: E402
from accord.services.kv.statemachine import KVStateMachine  # noqa: E402
from bench.workloads import cas_request, two_shard_keys  # noqa: E402

VALUE = b"v" * 256
TXN_OPS = 128


def _put_reqs(ops: int, keys: int) -> list[rpc_pb2.PutRequest]:
    return [
        rpc_pb2.PutRequest(key=b"/bench/p%d/k%06d" % (i % 8, i % keys), value=VALUE)
        for i in range(ops)
    ]


def _txn_reqs(ops: int, keys: int) -> list[rpc_pb2.TxnRequest]:
    """Txns of TXN_OPS puts, each on one partition, no key twice in one Txn."""
    per_part = max(TXN_OPS, keys // 8)
    out = []
    for t in range(max(1, ops // TXN_OPS)):
        part = t % 8
        base = (t // 8) * TXN_OPS
        req = rpc_pb2.TxnRequest()
        for j in range(TXN_OPS):
            op = req.success.add()
            op.request_put.key = b"/bench/p%d/k%06d" % (part, (base + j) % per_part)
            op.request_put.value = VALUE
        out.append(req)
    return out


def _timed(body: Callable[[], int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = body()
    return time.perf_counter() - t0, n


def cell_apply_put(ops: int, keys: int, watchers: int = 0) -> Callable[[], int]:
    """Apply ``ops`` encoded Puts to a fresh state machine."""
    cmds = [KVStateMachine.encode_put(r) for r in _put_reqs(ops, keys)]
    sm = KVStateMachine()
    for w in range(watchers):
        sm.watch_hub.watch(b"/elsewhere/%d" % w, b"", 0, False, [], False)

    def body() -> int:
        apply = sm.apply
        for c in cmds:
            apply(c)
        return len(cmds)

    return body


def cell_apply_txn(ops: int, keys: int) -> Callable[[], int]:
    """Apply Txns of 128 puts (``ops`` puts in all) to a fresh state machine."""
    cmds = [KVStateMachine.encode_txn(r) for r in _txn_reqs(ops, keys)]
    sm = KVStateMachine()

    def body() -> int:
        apply = sm.apply
        for c in cmds:
            apply(c)
        return len(cmds) * TXN_OPS

    return body


def cell_propose_put(ops: int, keys: int) -> Callable[[], int]:
    """The leader's validate + encode of ``ops`` Puts (``StateMachineBackend.put``)."""
    reqs = _put_reqs(ops, keys)
    sm = KVStateMachine()

    def body() -> int:
        for r in reqs:
            sm.validate_and_encode_put(r)
        return len(reqs)

    return body


def cell_propose_txn(ops: int, keys: int) -> Callable[[], int]:
    """The leader's checks and encoding of Txns of 128 puts (``StateMachineBackend.txn``)."""
    reqs = _txn_reqs(ops, keys)
    sm = KVStateMachine()

    def body() -> int:
        for r in reqs:
            items = sm.plain_puts(r)
            if items is not None:  # a batch of plain puts: the compact command
                size = r.ByteSize()
                sm.validate_puts(items, size)
                sm.encode_puts(items, size)
            else:
                sm.validate_txn(r)
                sm.is_read_only_txn(r)
                sm.encode_txn(r)
        return len(reqs) * TXN_OPS

    return body


def cell_get(ops: int, keys: int) -> Callable[[], int]:
    """Single-key Ranges (``StateMachineBackend.range`` minus the read barrier) over
    ``keys`` keys written first; reported per get."""
    sm = KVStateMachine()
    for r in _put_reqs(keys, keys):
        sm.apply(KVStateMachine.encode_put(r))
    reqs = [rpc_pb2.RangeRequest(key=r.key) for r in _put_reqs(ops, keys)]

    def body() -> int:
        for r in reqs:
            sm.validate_range(r)
            sm.range(r, validated=True)
        return len(reqs)

    return body


class Replicated(StateMachineBackend):
    """``shards`` shards of three replicas each, every command applied on all three at
    once (the first one's answer returned, the other two applying it without one, as
    the members whose client does not wait for it do): a 3-member cluster's apply
    work, no Raft. Each member keeps its own cache of Txn plans (``txnplan.plan_of``),
    as each process of a cluster does: the coordinator's member finds the plan it made,
    the other two make their own."""

    def __init__(self, shards: int = 8) -> None:
        super().__init__([KVStateMachine(lease_id_seed=i + 2) for i in range(shards)])
        self.followers = [[KVStateMachine(lease_id_seed=i + 2) for i in range(shards)]
                          for _ in range(2)]
        for copy in self.followers:
            for i, m in enumerate(copy):
                m.set_stripe((shards, i))
        self.plan_caches: list[dict[bytes, Any]] = [{} for _ in self.followers]

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        answer = self.machines[shard].apply(command)
        own = txnplan._cache
        try:
            for copy, cache in zip(self.followers, self.plan_caches, strict=True):
                txnplan._cache = cache
                copy[shard].apply(command, answer=False)
        finally:
            txnplan._cache = own
        return answer

    async def read_barrier(self, shard: int = 0) -> None:
        return None

    def header_info(self) -> HeaderInfo:
        return HeaderInfo(1, 1, 1, 1)


def _cas(key_sets: list[tuple[bytes, ...]], ops: int) -> Callable[[], int]:
    """``ops`` compare-and-set Txns, one per key set in turn, each on the revision the
    set's last Txn answered (every one succeeds), through :class:`Replicated`."""
    backend = Replicated()
    value = VALUE

    async def seed() -> list[list[int]]:
        revs = []
        for keys in key_sets:
            r = [(await backend.put(rpc_pb2.PutRequest(key=k, value=value))).header.revision
                 for k in keys]
            revs.append(r)
        return revs

    revs = asyncio.run(seed())

    async def run() -> int:
        for i in range(ops):
            j = i % len(key_sets)
            keys, rev = key_sets[j], revs[j]
            t = await backend.txn(cas_request(keys, rev, value))
            if not t.succeeded:
                raise RuntimeError(f"compare-and-set lost on {keys!r}")
            revs[j] = [int(t.header.revision)] * len(keys)
        await backend.xcoord.drain()
        return ops

    return lambda: asyncio.run(run())


def cell_cas(ops: int, keys: int) -> Callable[[], int]:
    """One-shard compare-and-set Txns (``stxn``), reported per Txn."""
    return _cas([(b"/bench-apply-scas/%d" % c,) for c in range(16)], max(1, ops // 20))


def cell_cas2(ops: int, keys: int) -> Callable[[], int]:
    """Two-shard compare-and-set Txns (``txn2``), reported per Txn."""
    return _cas([two_shard_keys(f"/bench-apply-cas2/{c}") for c in range(16)],
                max(1, ops // 20))


CELLS: dict[str, Callable[[int, int], Callable[[], int]]] = {
    "put": cell_apply_put,
    "txn128": cell_apply_txn,
    "propose-put": cell_propose_put,
    "propose-txn128": cell_propose_txn,
    "put+watch": lambda ops, keys: cell_apply_put(ops, keys, watchers=100),
    "get": cell_get,
    "cas": cell_cas,
    "cas2": cell_cas2,
}


def main() -> None:
    """Run every cell ``--reps`` times; print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", type=int, default=100_000, help="puts per cell (default 100000)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10000)")
    p.add_argument("--reps", type=int, default=3, help="runs per cell, best kept (default 3)")
    p.add_argument("--cells", default=",".join(CELLS), help="comma-separated cells to run")
    p.add_argument("--profile", type=int, default=0,
                   help="cProfile a cell (--profile-cell) and print this many functions")
    p.add_argument("--profile-cell", default="txn128", help="the cell --profile profiles")
    args = p.parse_args()
    cells = [c for c in args.cells.split(",") if c]
    unknown = [c for c in cells if c not in CELLS]
    if args.ops < TXN_OPS or args.keys < 1 or args.reps < 1 or not cells or unknown:
        p.error(f"--ops >= {TXN_OPS}, --keys >= 1, --reps >= 1, known --cells "
                f"({', '.join(CELLS)}); unknown: {unknown}")
    if args.profile:
        if args.profile_cell not in CELLS:
            p.error(f"--profile-cell must be one of {', '.join(CELLS)}")
        body = CELLS[args.profile_cell](args.ops, args.keys)
        prof = cProfile.Profile()
        prof.runcall(body)
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    results: dict[str, dict[str, float]] = {}
    for name in cells:
        best = float("inf")
        n = 0
        for _ in range(args.reps):
            secs, n = _timed(CELLS[name](args.ops, args.keys))
            best = min(best, secs / n)
        results[name] = {"us_per_op": round(best * 1e6, 3), "ops_per_s": round(1 / best)}
    print(f"KV write path in one process: {args.ops} puts per cell, {args.keys} keys, "
          f"256 B values, best of {args.reps}")
    print(f"{'cell':<16}{'us/op':>10}{'ops/s':>12}   (an op: one put; for get, one get; for cas/cas2, one Txn)")
    for name, r in results.items():
        print(f"{name:<16}{r['us_per_op']:>10.2f}{r['ops_per_s']:>12,.0f}")
    print(json.dumps({"ops": args.ops, "keys": args.keys, "reps": args.reps, "cells": results}))


if __name__ == "__main__":
    main()
