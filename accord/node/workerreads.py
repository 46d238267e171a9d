"""Reads over the shards of several of a node's workers (``docs/workers.md``).

A Range over shards of several workers (or at a given revision) is read across them as
a multi-shard range is read across shards in one process (``StateMachineBackend.range``):
a ReadIndex barrier on every shard it reads (``RangeTops``: each worker for its shards,
answering their highest revision), R = the highest (or the requested revision, when the
store has it), then every worker floors its shards at R and reads them at R
(``RangeParts``), and the parts are merged by the worker the call landed on
(``fanout.merge_ranges``) after the commit-wait for R. A read-only Txn over several
workers' shards is read the same way: ``TxnCompares`` at R, the branch taken,
``TxnReads`` of it. A linearizable read answers at its clock revision where the shards'
read fences hold it, without flooring them (``docs/txn.md``, "The revision of a read").
A serializable Range reads each shard as of R or its latest, with no barrier and no
floor, R lowered below what would show part of a multi-shard Txn (``RangeHeld``: the
intents over its keys and the shards' revisions; ``RangeUnapplied``: the commits one
shard applied and another has not yet).

:class:`WorkerSet` is what this module and ``workermaint.py`` need of the router they
are part of (``workers.WorkerRouter``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgpack

from accord.node.backend import ReplicatedBackend
from accord.node.forward import ForwardClient
from accord.node.forwardgrpc import DEFAULT_TIMEOUT_S, carried, decode_fields
from accord.node.placement import WorkerPlan
from accord.proto import rpc_pb2
from accord.services.kv import errors, fanout, sharding, xtxn
from accord.services.kv.ranges import KeyRange
from accord.services.kv.txnplan import TxnPlan

RANGE_TOPS = "/accord.worker/RangeTops"
"""Internal: ``[shards, barrier]`` -> the highest revision of those shards (after a
ReadIndex barrier on each when ``barrier``)."""
RANGE_PARTS = "/accord.worker/RangeParts"
"""Internal: ``[RangeRequest, shards, R, serializable]`` -> each shard's answer at R
(floored there first unless serializable)."""
RANGE_HELD = "/accord.worker/RangeHeld"
"""Internal: ``[shards, key, range_end]`` -> ``[the lowest revision an open intent over
the range reserved on those shards (0: none), [each shard's revision]]``: a
serializable read answers below that reservation."""
RANGE_UNAPPLIED = "/accord.worker/RangeUnapplied"
"""Internal: ``[shards, [[shard, revision] of every shard the read covers], R]`` -> R,
or just below the lowest multi-shard commit at or below it that one of those shards
applied and another covered shard has not yet (``below_unapplied``)."""
TXN_COMPARES = "/accord.worker/TxnCompares"
"""Internal: ``[TxnRequest, shards, R, fenced]`` -> ``[[compares of each shard at R],
highest first revision]`` (etcd's: the last compaction, -1 if none), each shard floored
at R first (unless the read's fence ``fenced``
holds R) and the intents in the way waited out."""
TXN_READS = "/accord.worker/TxnReads"
"""Internal: ``[TxnRequest, shards, R, path]`` -> each shard's part at R of the reads of
the branches ``path`` takes (after ``TxnCompares`` at the same R)."""


class WorkerSet:
    """The node's workers as one worker's router sees them: the split of the groups,
    this worker's index, its backend, the other workers' forwarding sockets."""

    plan: WorkerPlan
    index: int
    backend: ReplicatedBackend
    clients: dict[int, ForwardClient]
    """Worker index -> the client of its forwarding socket (not this worker's own)."""

    def _by_worker(self, shards: Sequence[int]) -> dict[int, list[int]]:
        """``shards`` grouped by the worker that hosts them."""
        out: dict[int, list[int]] = {}
        for s in shards:
            out.setdefault(self.plan.worker_of_shard(s), []).append(s)
        return out


class ReadsAcrossWorkers(WorkerSet):
    """A Range and a read-only Txn over several workers' shards (see the module
    docstring), and the steps this worker serves for the others' (``RangeTops``,
    ``RangeParts``, ``TxnCompares``, ``TxnReads``)."""

    async def range_across(self, req: rpc_pb2.RangeRequest,
                           shards: Sequence[int]) -> rpc_pb2.RangeResponse:
        """``req`` read over the workers hosting ``shards`` (see the module docstring)."""
        b = self.backend
        barrier = not req.serializable
        if barrier and not b.formats_settled:
            await b.settle_formats()  # as ``StateMachineBackend.range``
        b.sm.validate_range(req)
        by_worker = self._by_worker(shards)
        start = b.read_start() if barrier else 0
        tops = await asyncio.gather(*(self._tops(w, s, barrier) for w, s in by_worker.items()))
        top = max(max(tops), start)
        rev = req.revision if req.revision > 0 else (start or top)
        if rev > top and rev > b.latest_revision():
            # A revision of the store (some shard has it) is readable on every shard once
            # floored there, as on one etcd; above every shard's it is a future revision.
            every = self._by_worker(range(self.plan.shards))
            store = max(await asyncio.gather(
                *(self._tops(w, s, barrier) for w, s in every.items())))
            if rev > store:
                raise errors.FUTURE_REV
        read_at = rev
        if not barrier and not b.broken_serializable_parts:
            # Never part of a multi-shard Txn: below the intents over its keys (at a
            # revision the client gave, the parts wait them out instead), and below a
            # commit one shard applied and another has not yet.
            held = await asyncio.gather(*(self._held(w, s, req) for w, s in by_worker.items()))
            if req.revision <= 0:
                read_at = fanout.serializable_revision(rev, (low for low, _revs in held))
            known = {shard: r for ss, (_low, revs) in zip(by_worker.values(), held, strict=True)
                     for shard, r in zip(ss, revs, strict=True)}
            read_at = min(await asyncio.gather(*(self._unapplied(w, s, known, read_at)
                                                 for w, s in by_worker.items())))
            if req.revision <= 0:
                rev = read_at
        answers = await asyncio.gather(
            *(self._parts(w, req, s, read_at, start) for w, s in by_worker.items()))
        parts = [p for ps in answers for p in ps]
        if barrier:
            await b.settle(rev)
        return fanout.merge_ranges(req, parts, rev, b.sm.limits)

    async def _tops(self, worker: int, shards: list[int], barrier: bool) -> int:
        if worker == self.index:
            return await self.local_tops(shards, barrier)
        body = msgpack.packb([shards, barrier])
        return int(msgpack.unpackb(await self.clients[worker].call(
            RANGE_TOPS, body, DEFAULT_TIMEOUT_S)))

    async def _held(self, worker: int, shards: list[int],
                    req: rpc_pb2.RangeRequest) -> tuple[int, list[int]]:
        if worker == self.index:
            return self.local_held(shards, req.key, req.range_end)
        body = msgpack.packb([shards, req.key, req.range_end])
        low, revs = msgpack.unpackb(await self.clients[worker].call(
            RANGE_HELD, body, DEFAULT_TIMEOUT_S))
        return int(low), [int(r) for r in revs]

    async def _unapplied(self, worker: int, shards: list[int], known: dict[int, int],
                         rev: int) -> int:
        if worker == self.index:
            return self.backend.below_unapplied(shards, rev, known)
        body = msgpack.packb([shards, [[s, r] for s, r in known.items()], rev])
        return int(msgpack.unpackb(await self.clients[worker].call(
            RANGE_UNAPPLIED, body, DEFAULT_TIMEOUT_S)))

    async def _parts(self, worker: int, req: rpc_pb2.RangeRequest, shards: list[int],
                     rev: int, fenced: int = 0) -> list[rpc_pb2.RangeResponse]:
        if worker == self.index:
            return await self.local_parts(req, shards, rev, fenced)
        body = msgpack.packb([req.SerializeToString(), shards, rev, fenced])
        raw = msgpack.unpackb(await self.clients[worker].call(RANGE_PARTS, body,
                                                              DEFAULT_TIMEOUT_S))
        return [rpc_pb2.RangeResponse.FromString(p) for p in raw]

    async def local_tops(self, shards: Sequence[int], barrier: bool) -> int:
        """The highest revision of this worker's ``shards`` (after a barrier on each)."""
        b = self.backend
        if barrier:
            await b._each(list(shards), b.read_barrier)
        return max(int(b.machines[s].revision) for s in shards)

    def local_held(self, shards: Sequence[int], key: bytes,
                   range_end: bytes) -> tuple[int, list[int]]:
        """The lowest revision an open intent over ``key``..``range_end`` reserved on this
        worker's ``shards`` (0: none; ``fanout.serializable_revision``), and each of
        those shards' revision."""
        b = self.backend
        for s in shards:
            b._check_local(s)
        kr = [KeyRange.of(key, range_end)]
        low = min((r for s in shards if (r := b.machines[s].intents.lowest_in_way(kr))),
                  default=0)
        return low, [int(b.machines[s].revision) for s in shards]

    async def local_parts(self, req: rpc_pb2.RangeRequest, shards: Sequence[int],
                          rev: int, fenced: int = 0) -> list[rpc_pb2.RangeResponse]:
        """Each of this worker's ``shards`` read at ``rev``: floored there first (unless
        the read's fence holds it: ``rev <= fenced``, its start) and the intents in the
        way waited out (linearizable), or at its own latest when that is lower
        (serializable, and a fenced shard behind ``rev``: nothing lands there below it;
        a serializable read at the client's revision waits out the intents at or below
        it, without a floor)."""
        b = self.backend
        for s in shards:
            b._check_local(s)
        kr = [KeyRange.of(req.key, req.range_end)]
        if not req.serializable:
            await self._settle_at(shards, kr, rev, fenced)
        elif req.revision > 0:
            await b._each(list(shards), lambda s: b.wait_intents(s, kr, rev))
        return [b.machines[s].range(fanout.per_shard_request(
            req, min(rev, int(b.machines[s].revision)))) for s in shards]

    async def _settle_at(self, shards: Sequence[int], ranges: list[KeyRange], rev: int,
                         fenced: int) -> None:
        """Make ``rev`` readable on this worker's ``shards``: floored there unless the
        read's fence holds it, and the intents over ``ranges`` at or below it waited out."""
        b = self.backend
        if rev > fenced:
            await b.floor(list(shards), rev)
        await b._each(list(shards), lambda s: b.wait_intents(s, ranges, rev))

    # -- a read-only Txn ------------------------------------------------------

    async def txn_across(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """A read-only Txn over several workers' shards, read as a multi-shard read-only
        Txn is in one process (``StateMachineBackend._read_txn_across``): a barrier on
        every shard (``RangeTops``), R = the highest revision or the read's start, every
        worker's compares at R (``TxnCompares``), the branch they take, then every
        worker's reads of it at R (``TxnReads``), merged here."""
        b = self.backend
        b.sm.validate_txn(req)
        shards = sorted(sharding.shards_of_txn(req, self.plan.shards))
        by_worker = self._by_worker(shards)
        start = b.read_start()
        tops = await asyncio.gather(*(self._tops(w, s, True) for w, s in by_worker.items()))
        rev = start or max(tops)
        raw = req.SerializeToString()
        answers = await asyncio.gather(*(
            self._txn_step(w, TXN_COMPARES, [raw, s, rev, start], self.local_txn_compares)
            for w, s in by_worker.items()))
        compares = [[[(bool(f), bool(k)) for f, k in row] for row in shard]
                    for per_worker, _c in answers for shard in per_worker]
        plan = TxnPlan(req)
        path = xtxn.path_of(plan, xtxn.combine(plan, compares))
        err = xtxn.first_error(plan, path, {}, rev + 1, max(int(c) for _p, c in answers))
        if err is not None:
            raise err
        reads = await asyncio.gather(*(
            self._txn_step(w, TXN_READS, [raw, s, rev, list(path)], self.local_txn_reads)
            for w, s in by_worker.items()))
        parts = {s: rpc_pb2.TxnResponse.FromString(p)
                 for (_w, ss), ps in zip(by_worker.items(), reads, strict=True)
                 for s, p in zip(ss, ps, strict=True)}
        await b.settle(rev)
        return xtxn.merge(req, path, parts, rev, b.sm.limits, b.shard_of)

    async def _txn_step(self, worker: int, method: str, fields: list[Any],
                        local: Callable[..., Awaitable[Any]]) -> Any:
        if worker == self.index:
            return await local(*fields)
        return msgpack.unpackb(await self.clients[worker].call(
            method, msgpack.packb(fields), DEFAULT_TIMEOUT_S))

    async def local_txn_compares(self, raw: bytes, shards: Sequence[int], rev: int,
                                 fenced: int) -> tuple[list[Any], int]:
        """This worker's ``shards``' compares of the read-only Txn ``raw`` at ``rev``
        (each shard's, in order: ``xtxn.partial_compares``) and their highest first revision
        (``KVStateMachine.first_revision``)."""
        b = self.backend
        plan = TxnPlan(rpc_pb2.TxnRequest.FromString(raw))
        for s in shards:
            b._check_local(s)
        ranges = [KeyRange.of(k, e) for k, e in plan.ranges]
        await self._settle_at(shards, ranges, rev, fenced)
        each = [b.machines[s].read_share(plan, min(rev, int(b.machines[s].revision)))[0]
                for s in shards]
        return each, max(int(b.machines[s].first_revision) for s in shards)

    async def local_txn_reads(self, raw: bytes, shards: Sequence[int], rev: int,
                              path: Sequence[bool]) -> list[bytes]:
        """This worker's ``shards``' parts of the reads along ``path`` at ``rev``."""
        b = self.backend
        req = rpc_pb2.TxnRequest.FromString(raw)
        out = []
        for s in shards:
            b._check_local(s)
            m = b.machines[s]
            out.append(m.read_branch(req, [bool(x) for x in path],
                                     min(rev, int(m.revision))).SerializeToString())
        return out

    async def _serve_txn_compares(self, body: bytes) -> bytes:
        raw, shards, rev, fenced = decode_fields(body, 4)
        rows, compact = await carried(self.local_txn_compares(raw, shards, int(rev), int(fenced)))
        return bytes(msgpack.packb([rows, compact]))

    async def _serve_txn_reads(self, body: bytes) -> bytes:
        raw, shards, rev, path = decode_fields(body, 4)
        return bytes(msgpack.packb(await carried(self.local_txn_reads(raw, shards, int(rev),
                                                                    path))))

    async def _serve_tops(self, body: bytes) -> bytes:
        shards, barrier = decode_fields(body, 2)
        return bytes(msgpack.packb(await carried(self.local_tops(shards, bool(barrier)))))

    async def _serve_held(self, body: bytes) -> bytes:
        shards, key, range_end = decode_fields(body, 3)
        low, revs = self.local_held(shards, bytes(key), bytes(range_end))
        return bytes(msgpack.packb([low, revs]))

    async def _serve_unapplied(self, body: bytes) -> bytes:
        shards, known, rev = decode_fields(body, 3)
        for s in shards:
            self.backend._check_local(s)
        revisions = {int(s): int(r) for s, r in known}
        return bytes(msgpack.packb(self.backend.below_unapplied(shards, int(rev), revisions)))

    async def _serve_parts(self, body: bytes) -> bytes:
        raw, shards, rev, fenced = decode_fields(body, 4)
        req = rpc_pb2.RangeRequest.FromString(raw)
        parts = await carried(self.local_parts(req, shards, int(rev), int(fenced)))
        return bytes(msgpack.packb([p.SerializeToString() for p in parts]))
