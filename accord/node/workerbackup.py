"""A backup (etcd's ``Snapshot``) of a node of several worker processes (``docs/workers.md``).

A node of one process saves every group it hosts at one consistent cut of its shards
(``ReplicatedBackend.snapshot``). A node of several has its groups spread over its
workers, so the worker a ``Snapshot`` call lands on gathers the same file from all of
them, over their forwarding sockets:

1. **the cut**: a ReadIndex barrier on every shard (``RangeTops``), R = the highest
   revision; then every worker floors its shards at R and waits out the multi-shard Txns
   open at or below R (``SnapshotCut``), answering the highest revision such a Txn
   committed at; if one committed above R, R moves up to it and the cut runs again (as
   a read at a revision of its own does), so no Txn is half in the backup;
2. **the capture** (``SnapshotCapture``): every worker captures every group it hosts (the
   KV shards cut back to R; worker 0 also the member table and the services' groups) and
   keeps the packed images for the caller, who fetches them in pieces of
   :data:`CHUNK_BYTES` (``SnapshotChunk``: a forwarded frame holds at most 4 MiB);
3. the caller writes the backup file (``snapfile.encode``) exactly as a node of one
   process would: ``accord snapshot restore`` builds a member of either kind from it.

A capture nobody fetched within :data:`EXPORT_TTL_S` (its caller died) is dropped at the
next capture.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
import msgpack

from accord.node.backend import ReplicatedBackend, kv_group
from accord.node.forward import ForwardClient, ForwardedError, Handler
from accord.node.forwardgrpc import carried, decode_fields
from accord.node.placement import WorkerPlan
from accord.services.cluster import snapfile
from accord.services.kv.errors import EtcdError
from accord.services.kv.ranges import KeyRange
from accord.services.kv.statemachine import KVStateMachine

SNAPSHOT_CUT = "/accord.worker/SnapshotCut"
SNAPSHOT_CAPTURE = "/accord.worker/SnapshotCapture"
SNAPSHOT_CHUNK = "/accord.worker/SnapshotChunk"
CHUNK_BYTES = 2 << 20
EXPORT_TTL_S = 120.0
CALL_TIMEOUT_S = 60.0
MAX_CUT_ROUNDS = 100
EVERY_KEY = [KeyRange(b"", None, False)]

Tops = Callable[[int, list[int], bool], Awaitable[int]]
"""``tops(worker, shards, barrier)``: the highest revision of a worker's shards, after a
ReadIndex barrier on each (``WorkerRouter._tops``)."""


def _bad(message: str) -> ForwardedError:
    return ForwardedError(grpc.StatusCode.INVALID_ARGUMENT, message)


class WorkerBackups:
    """This worker's part in backups of its node: serving the cut and the capture of its
    groups to the worker that saves, and saving when a ``Snapshot`` lands here."""

    def __init__(self, plan: WorkerPlan, index: int, backend: ReplicatedBackend,
                 clients: Mapping[int, ForwardClient], tops: Tops) -> None:
        self.plan = plan
        self.index = index
        self.backend = backend
        self.clients = clients
        self._tops = tops
        self._exports: dict[str, tuple[float, bytes]] = {}

    def handlers(self) -> dict[str, Handler]:
        """The internal methods this worker's forwarding socket serves for backups."""
        return {SNAPSHOT_CUT: self._serve_cut, SNAPSHOT_CAPTURE: self._serve_capture,
                SNAPSHOT_CHUNK: self._serve_chunk}

    # --- the worker that saves ------------------------------------------------------
    async def snapshot(self) -> tuple[int, bytes]:
        """The node's backup file and its revision (see the module docstring)."""
        workers = list(range(self.plan.workers))
        shards = {w: self.plan.shards_of(w) for w in workers}
        rev = max(await asyncio.gather(*(self._tops(w, shards[w], True) for w in workers)))
        for _ in range(MAX_CUT_ROUNDS):
            met = max(await asyncio.gather(*(self._cut(w, rev) for w in workers)))
            if met <= rev:
                break
            rev = met  # a Txn committed above the cut: move the cut up to it
        else:
            raise EtcdError(grpc.StatusCode.UNAVAILABLE,
                            "accord: no consistent cut of the shards was found (Txns kept "
                            "committing above it); try the snapshot again")
        parts = await asyncio.gather(*(self._capture(w, rev) for w in workers))
        images: dict[int, bytes] = {}
        for part in parts:
            images.update(part)
        kv_groups = [kv_group(s) for s in range(self.plan.shards)]
        return rev, await asyncio.to_thread(snapfile.encode, rev, images, kv_groups)

    async def _call(self, worker: int, method: str, body: list[Any]) -> Any:
        try:
            return msgpack.unpackb(await self.clients[worker].call(
                method, msgpack.packb(body), CALL_TIMEOUT_S))
        except ForwardedError as e:
            raise EtcdError(e.code, e.message) from None

    async def _cut(self, worker: int, rev: int) -> int:
        if worker == self.index:
            return await self.local_cut(rev)
        return int(await self._call(worker, SNAPSHOT_CUT, [rev]))

    async def _capture(self, worker: int, rev: int) -> dict[int, bytes]:
        if worker == self.index:
            return await self.local_capture(rev)
        token, size = await self._call(worker, SNAPSHOT_CAPTURE, [rev])
        packed = bytearray()
        while len(packed) < size:
            packed += await self._call(worker, SNAPSHOT_CHUNK, [token, len(packed)])
        images = msgpack.unpackb(bytes(packed), strict_map_key=False)
        return {int(g): bytes(img) for g, img in images.items()}

    # --- every worker ---------------------------------------------------------------
    async def local_cut(self, rev: int) -> int:
        """This worker's shards floored at ``rev``, the Txns open at or below it waited
        out; the highest revision one of them committed at (0: none)."""
        b = self.backend
        mine = self.plan.shards_of(self.index)
        await b.floor(mine, rev)
        met = await b._each(mine, lambda s: b.wait_intents(s, EVERY_KEY, rev))
        return int(max(met))

    async def local_capture(self, rev: int) -> dict[int, bytes]:
        """Every group this worker hosts captured now (no await between two), the KV
        shards cut back to ``rev``; serialized off the loop."""
        b = self.backend
        groups = b.node.host.groups
        captures = {gid: g.sm.prepare_snapshot() for gid, g in groups.items()}
        kv = {kv_group(s) for s in self.plan.shards_of(self.index)}

        def build() -> dict[int, bytes]:
            out = {gid: c() for gid, c in captures.items()}
            for gid in kv & out.keys():
                out[gid] = KVStateMachine.image_at(out[gid], rev)
            return out

        return await asyncio.to_thread(build)

    async def _serve_cut(self, body: bytes) -> bytes:
        (rev,) = decode_fields(body, 1)
        if type(rev) is not int or rev < 0:
            raise _bad("a snapshot cut carries [revision]")
        return bytes(msgpack.packb(await carried(self.local_cut(rev))))

    async def _serve_capture(self, body: bytes) -> bytes:
        (rev,) = decode_fields(body, 1)
        if type(rev) is not int or rev < 0:
            raise _bad("a snapshot capture carries [revision]")
        images = await carried(self.local_capture(rev))
        packed = await asyncio.to_thread(msgpack.packb, images)
        now = time.monotonic()
        for token, (made, _b) in list(self._exports.items()):
            if now - made > EXPORT_TTL_S:
                del self._exports[token]
        token = secrets.token_hex(8)
        self._exports[token] = (now, packed)
        return bytes(msgpack.packb([token, len(packed)]))

    async def _serve_chunk(self, body: bytes) -> bytes:
        token, offset = decode_fields(body, 2)
        export = self._exports.get(token) if isinstance(token, str) else None
        if export is None or type(offset) is not int or offset < 0:
            raise ForwardedError(grpc.StatusCode.NOT_FOUND,
                                 "no such snapshot capture (taken too long ago?)")
        packed = export[1]
        piece = packed[offset:offset + CHUNK_BYTES]
        if offset + len(piece) >= len(packed):
            del self._exports[token]  # fetched whole
        return bytes(msgpack.packb(piece))
