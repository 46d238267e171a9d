"""Maintenance over every worker of a node: Compact, HashKV, Hash and MoveLeader
(``docs/workers.md``).

Each is checked against every worker's shards first (etcd's ``compacted`` and ``future
revision`` refusals, nothing changed: ``RevisionState``), then each worker compacts
(``CompactParts``) or hashes (``HashParts``) its own shards, as ``StateMachineBackend``
compacts every shard of one process and combines their hashes in shard order; a Hash is
chained through the workers shard by shard (``HashChain``); a MoveLeader is checked by
worker 0 (whose home group's leader is the node's), then every worker hands the groups
it leads to the target (``Leaders``). Automatic compaction samples the store's revision
and its history through the same steps (``RevisionsWritten``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import crc32c
import grpc
import msgpack

from accord.node.forward import ForwardedError
from accord.node.forwardgrpc import DEFAULT_TIMEOUT_S, carried, decode_fields
from accord.node.workerreads import WorkerSet
from accord.proto import rpc_pb2
from accord.services.kv import errors, fanout
from accord.services.kv.backend import check_compaction, check_hash_revision, nth_latest
from accord.services.kv.errors import EtcdError

REVISION_STATE = "/accord.worker/RevisionState"
"""Internal: ``[shards]`` -> ``[highest revision, highest compaction]`` of those shards
(what a Compact or a HashKV is checked against)."""
COMPACT_PARTS = "/accord.worker/CompactParts"
"""Internal: ``[CompactionRequest, shards]`` -> those shards compacted at its revision
(each floored there first); the highest revision of their answers."""
REVISIONS_WRITTEN = "/accord.worker/RevisionsWritten"
"""Internal: ``[shards, n]`` -> the ``n`` highest revisions each of those shards wrote
at, together (``StateMachineBackend.revisions_written``; automatic compaction)."""
HASH_PARTS = "/accord.worker/HashParts"
"""Internal: ``[revision, shards]`` -> ``[[hash, compaction], ...]`` of those shards."""
HASH_CHAIN = "/accord.worker/HashChain"
"""Internal: ``[shards, crc]`` -> the CRC-32C ``crc`` continued over those shards'
images (``ReplicatedBackend.image_crc``): a Hash chained through the workers."""
LEADERS = "/accord.worker/Leaders"
"""Internal: ``[target, step]`` -> step ``check``: etcd's refusals of a MoveLeader
(worker 0: the node's leadership is its home group's); ``transfer``: hand the groups
this worker leads to ``target``; ``move``: both, and wait for the home group's leader
to be ``target`` (worker 0)."""


class MaintenanceAcrossWorkers(WorkerSet):
    """Compact, HashKV, Hash and MoveLeader over every worker's shards (see the module
    docstring), and the steps this worker serves for them."""

    async def hash_kv_across(self, req: rpc_pb2.HashKVRequest) -> rpc_pb2.HashKVResponse:
        """etcd's HashKV over every shard of the node: each worker hashes its own, the
        hashes combined in shard order as ``StateMachineBackend.hash_kv`` combines them,
        so members with the same contents answer the same hash whatever their workers."""
        by_worker = self._by_worker(range(self.plan.shards))
        states = await asyncio.gather(*(self._revision_state(w, s)
                                        for w, s in by_worker.items()))
        top = max(t for t, _c in states)
        check_hash_revision(req.revision, top, max(c for _t, c in states))
        answers = await asyncio.gather(*(self._hash_parts(w, req.revision, s)
                                         for w, s in by_worker.items()))
        by_shard = {s: part for (_w, shards), parts in zip(by_worker.items(), answers,
                                                            strict=True)
                    for s, part in zip(shards, parts, strict=True)}
        ordered = [by_shard[s] for s in range(self.plan.shards)]
        resp = rpc_pb2.HashKVResponse(hash=fanout.combine_hashes([h for h, _c in ordered]),
                                      compact_revision=max(c for _h, c in ordered))
        resp.header.revision = top
        return resp

    async def _hash_parts(self, worker: int, revision: int,
                          shards: list[int]) -> list[tuple[int, int]]:
        if worker == self.index:
            return await self.local_hashes(revision, shards)
        raw = msgpack.unpackb(await self.clients[worker].call(
            HASH_PARTS, msgpack.packb([revision, shards]), DEFAULT_TIMEOUT_S))
        return [(int(h), int(c)) for h, c in raw]

    async def local_hashes(self, revision: int, shards: Sequence[int]) -> list[tuple[int, int]]:
        """``(hash, compaction)`` of each of this worker's ``shards`` up to ``revision``."""
        for s in shards:
            self.backend._check_local(s)
        return self.backend.shard_hashes(revision, shards)

    async def _serve_hash_parts(self, body: bytes) -> bytes:
        revision, shards = decode_fields(body, 2)
        parts = await carried(self.local_hashes(int(revision), shards))
        return bytes(msgpack.packb([list(p) for p in parts]))

    async def hash_across(self, _req: rpc_pb2.HashRequest) -> rpc_pb2.HashResponse:
        """etcd's Hash of the node's whole store: the CRC-32C of every shard's image in
        shard order, framed as a node of one process frames them
        (``ReplicatedBackend._image``), chained through the workers shard by shard.
        Each shard is captured when its turn comes, not all at one instant as in one
        process: on a store being written, members (and calls) can differ, as etcd's
        Hash of members at different revisions differs."""
        n = self.plan.shards
        crc = int(crc32c.crc32c(msgpack.packb(["accord-shards", [b""] * n],
                                              use_bin_type=True)[:-2 * n]))
        for s in range(n):
            worker = self.plan.worker_of_shard(s)
            if worker == self.index:
                crc = await self.backend.image_crc([s], crc)
            else:
                crc = int(msgpack.unpackb(await self.clients[worker].call(
                    HASH_CHAIN, msgpack.packb([[s], crc]), DEFAULT_TIMEOUT_S)))
        return rpc_pb2.HashResponse(hash=crc)

    async def _serve_hash_chain(self, body: bytes) -> bytes:
        shards, crc = decode_fields(body, 2)
        if not (isinstance(shards, list) and all(type(x) is int for x in shards)
                and type(crc) is int):
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "a hash chain carries [shards, crc]")
        return bytes(msgpack.packb(await carried(self.backend.image_crc(shards, crc))))

    async def move_leader_across(self, req: rpc_pb2.MoveLeaderRequest) -> rpc_pb2.MoveLeaderResponse:
        """etcd's MoveLeader for the whole node: refused as etcd refuses it unless this
        member leads (worker 0's home group, the leader ``Status`` reports) and the target
        is another voter; then every worker hands the groups it leads to the target, and
        the call returns once worker 0's home group follows it."""
        target = int(req.targetID)
        await self._leaders(0, target, "check")
        others = [w for w in range(self.plan.workers) if w != 0]
        await asyncio.gather(*(self._leaders(w, target, "transfer") for w in others))
        await self._leaders(0, target, "move")
        return rpc_pb2.MoveLeaderResponse()

    async def _leaders(self, worker: int, target: int, step: str) -> None:
        if worker == self.index:
            await self.local_leaders(target, step)
            return
        try:
            await self.clients[worker].call(LEADERS, msgpack.packb([target, step]),
                                            DEFAULT_TIMEOUT_S)
        except ForwardedError as e:
            raise EtcdError(e.code, e.message) from None

    async def local_leaders(self, target: int, step: str) -> None:
        """One step of :meth:`move_leader_across` on this worker."""
        b = self.backend
        if step == "check":
            b.check_move_leader(target)
        elif step == "transfer":
            b.transfer_leaders(target)
        elif step == "move":
            await b.move_leader(target)
        else:
            raise errors.bad_request(f"unknown leadership step {step!r}")

    async def _serve_leaders(self, body: bytes) -> bytes:
        target, step = decode_fields(body, 2)
        if type(target) is not int or not isinstance(step, str):
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "a leadership step carries [target, step]")
        await carried(self.local_leaders(target, step))
        return b""

    async def compact_across(self, req: rpc_pb2.CompactionRequest) -> rpc_pb2.CompactionResponse:
        """``req`` on every shard of the node, each worker compacting its own: checked
        against every shard's revision and compaction first (etcd's ``compacted`` and
        ``future revision`` refusals, nothing changed), then applied on each worker's
        shards, as ``StateMachineBackend.compact`` applies it on every shard."""
        by_worker = self._by_worker(range(self.plan.shards))
        states = await asyncio.gather(*(self._revision_state(w, s)
                                        for w, s in by_worker.items()))
        check_compaction(req.revision, max(t for t, _c in states), max(c for _t, c in states))
        revs = await asyncio.gather(*(self._compact_parts(w, req, s)
                                      for w, s in by_worker.items()))
        resp = rpc_pb2.CompactionResponse()
        resp.header.revision = max(revs)
        return resp

    async def store_revision(self) -> int:
        """The store's revision over every worker's shards (what a linearizable read
        would answer at now): automatic compaction's periodic sample."""
        by_worker = self._by_worker(range(self.plan.shards))
        states = await asyncio.gather(*(self._revision_state(w, s)
                                        for w, s in by_worker.items()))
        return max(t for t, _c in states)

    async def revision_writes_ago(self, n: int) -> int:
        """``StateMachineBackend.revision_writes_ago`` over every worker's shards: the
        revision ``n`` writes below the store's latest (0: the history holds no more)."""
        by_worker = self._by_worker(range(self.plan.shards))
        parts = await asyncio.gather(*(self._revisions_written(w, s, n + 1)
                                       for w, s in by_worker.items()))
        return nth_latest(set().union(*parts), n)

    async def _revisions_written(self, worker: int, shards: list[int], n: int) -> set[int]:
        if worker == self.index:
            for s in shards:
                self.backend._check_local(s)
            return self.backend.revisions_written(shards, n)
        raw = msgpack.unpackb(await self.clients[worker].call(
            REVISIONS_WRITTEN, msgpack.packb([shards, n]), DEFAULT_TIMEOUT_S))
        return {int(r) for r in raw}

    async def _serve_revisions_written(self, body: bytes) -> bytes:
        shards, n = decode_fields(body, 2)
        return bytes(msgpack.packb(sorted(await carried(
            self._revisions_written(self.index, shards, int(n))))))

    async def _revision_state(self, worker: int, shards: list[int]) -> tuple[int, int]:
        if worker == self.index:
            return await self.local_revision_state(shards)
        raw = msgpack.unpackb(await self.clients[worker].call(
            REVISION_STATE, msgpack.packb([shards]), DEFAULT_TIMEOUT_S))
        return int(raw[0]), int(raw[1])

    async def _compact_parts(self, worker: int, req: rpc_pb2.CompactionRequest,
                             shards: list[int]) -> int:
        if worker == self.index:
            return await self.local_compact(req, shards)
        body = msgpack.packb([req.SerializeToString(), shards])
        return int(msgpack.unpackb(await self.clients[worker].call(
            COMPACT_PARTS, body, DEFAULT_TIMEOUT_S)))

    async def local_revision_state(self, shards: Sequence[int]) -> tuple[int, int]:
        """``(highest revision, highest compaction)`` of this worker's ``shards``."""
        for s in shards:
            self.backend._check_local(s)
        return self.backend.revision_state(shards)

    async def local_compact(self, req: rpc_pb2.CompactionRequest, shards: Sequence[int]) -> int:
        """This worker's ``shards`` compacted at ``req.revision``."""
        for s in shards:
            self.backend._check_local(s)
        return await self.backend.compact_shards(req, shards)

    async def _serve_revision_state(self, body: bytes) -> bytes:
        (shards,) = decode_fields(body, 1)
        return bytes(msgpack.packb(list(await carried(self.local_revision_state(shards)))))

    async def _serve_compact_parts(self, body: bytes) -> bytes:
        raw, shards = decode_fields(body, 2)
        req = rpc_pb2.CompactionRequest.FromString(raw)
        return bytes(msgpack.packb(await carried(self.local_compact(req, shards))))
