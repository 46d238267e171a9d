"""etcd-compatible KV, Watch and Lease gRPC servicers.

Thin by design: each RPC translates to one :class:`~accord.services.kv.backend.Backend`
call, fills the response header (cluster id, member id, Raft term; the revision comes
from the store) and turns :class:`~accord.services.kv.errors.EtcdError` into
``context.abort(code, message)`` with etcd's exact code and message. The Watch stream's
protocol (handshake order, ids, cancellation, progress, fragmentation) is
:class:`WatchStream`, which drives the store's :class:`~accord.services.kv.watchhub.WatchHub`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.kv import errors
from accord.services.kv.backend import Backend
from accord.services.kv.errors import EtcdError
from accord.services.kv.shardwatch import AnyWatcher
from accord.services.kv.watchhub import WatchBatch

R = TypeVar("R")


def fill_header(header: rpc_pb2.ResponseHeader, backend: Backend, revision: int | None = None) -> None:
    """Stamp identity and term on ``header``; set ``revision`` when given, else keep the
    store's (and use the member's current revision if the store left none)."""
    info = backend.header_info()
    header.cluster_id = info.cluster_id
    header.member_id = info.member_id
    header.raft_term = info.raft_term
    if revision is not None:
        header.revision = revision
    elif header.revision == 0:
        header.revision = backend.revision


async def or_abort(context: grpc.aio.ServicerContext, call: Awaitable[R]) -> R:
    """Await a backend call, or abort the RPC with the etcd error it raised."""
    try:
        return await call
    except EtcdError as e:
        await context.abort(e.code, e.message)
        raise  # unreachable: abort raises


async def answer(context: grpc.aio.ServicerContext, backend: Backend, call: Awaitable[R]) -> R:
    """Await a backend call, stamp its header, or abort the RPC with the etcd error."""
    resp = await or_abort(context, call)
    fill_header(resp.header, backend)  # type: ignore[attr-defined]
    return resp


class KVServicer(rpc_pb2_grpc.KVServicer):
    """``etcdserverpb.KV``: Range, Put, DeleteRange, Txn, Compact."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def Range(
        self, request: rpc_pb2.RangeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.RangeResponse:
        """Read keys (linearizable unless ``serializable``)."""
        return await answer(context, self._b, self._b.range(request))

    async def Put(
        self, request: rpc_pb2.PutRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.PutResponse:
        """Write one key."""
        return await answer(context, self._b, self._b.put(request))

    async def DeleteRange(
        self, request: rpc_pb2.DeleteRangeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.DeleteRangeResponse:
        """Delete a key range."""
        return await answer(context, self._b, self._b.delete_range(request))

    async def Txn(
        self, request: rpc_pb2.TxnRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.TxnResponse:
        """Guarded multi-op transaction."""
        return await answer(context, self._b, self._b.txn(request))

    async def Compact(
        self, request: rpc_pb2.CompactionRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.CompactionResponse:
        """Compact history."""
        return await answer(context, self._b, self._b.compact(request))


class LeaseServicer(rpc_pb2_grpc.LeaseServicer):
    """``etcdserverpb.Lease``: grant, revoke, the keepalive stream, time-to-live, list."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def LeaseGrant(
        self, request: rpc_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseGrantResponse:
        """Create a lease."""
        return await answer(context, self._b, self._b.lease_grant(request))

    async def LeaseRevoke(
        self, request: rpc_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseRevokeResponse:
        """Revoke a lease (its keys are deleted)."""
        return await answer(context, self._b, self._b.lease_revoke(request))

    async def LeaseKeepAlive(
        self,
        request_iterator: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rpc_pb2.LeaseKeepAliveResponse]:
        """One reply per request, in order; ``TTL=0`` (not an error) for an unknown lease."""
        async for req in request_iterator:
            try:
                ttl = await self._b.lease_keepalive(req.ID)
            except EtcdError as e:
                await context.abort(e.code, e.message)
                return
            resp = rpc_pb2.LeaseKeepAliveResponse(ID=req.ID, TTL=ttl)
            fill_header(resp.header, self._b, self._b.revision)
            yield resp

    async def LeaseTimeToLive(
        self, request: rpc_pb2.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseTimeToLiveResponse:
        """Remaining TTL (``-1`` for an unknown lease) and optionally the attached keys."""
        return await answer(context, self._b, self._b.lease_time_to_live(request))

    async def LeaseLeases(
        self, request: rpc_pb2.LeaseLeasesRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseLeasesResponse:
        """Every live lease."""
        return await answer(context, self._b, self._b.lease_leases())


class WatchServicer(rpc_pb2_grpc.WatchServicer):
    """``etcdserverpb.Watch``: one :class:`WatchStream` per gRPC stream."""

    def __init__(self, backend: Backend, *, max_response_bytes: int) -> None:
        self._b = backend
        self._max_response_bytes = max_response_bytes
        self._streams: set[WatchStream] = set()
        self._closed = False

    async def Watch(
        self, request_iterator: AsyncIterator[rpc_pb2.WatchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpc_pb2.WatchResponse]:
        """Serve one multiplexed watch stream until the client or the server ends it."""
        if self._closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "accord: server is shutting down")
        require_leader = _metadata_flag(context, "hasleader", "true")
        stream = WatchStream(
            self._b, max_response_bytes=self._max_response_bytes, require_leader=require_leader
        )
        self._streams.add(stream)
        try:
            async for resp in stream.run(request_iterator):
                yield resp
            if stream.error is not None:
                await context.abort(stream.error.code, stream.error.message)
        finally:
            self._streams.discard(stream)
            await stream.close()

    async def close(self) -> None:
        """End every open watch stream (server shutdown)."""
        self._closed = True
        for stream in list(self._streams):
            await stream.close()

    @property
    def open_streams(self) -> int:
        """How many watch streams are being served."""
        return len(self._streams)


def _metadata_flag(context: grpc.aio.ServicerContext, key: str, value: str) -> bool:
    md: Any = context.invocation_metadata() or ()
    return any(k == key and v == value for k, v in md)


# --------------------------------------------------------------------------- watch stream

_OUT_QUEUE = 256
"""Responses buffered per stream before the watchers' own (bounded) buffers take over."""
_LEADER_CHECK_S = 1.0
MSG_EMPTY_WATCH_RANGE = "mvcc: watcher range is empty"
"""How often a ``hasleader`` stream checks that this member still knows a leader."""


@dataclass(slots=True)
class _Entry:
    """One watcher of a stream: its hub watcher, the task pumping it, its options."""

    watcher: AnyWatcher
    fragment: bool
    progress_notify: bool
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class _ProgressRound:
    """A stream-wide progress request waiting for every watcher to drain up to ``revision``."""

    revision: int
    waiting: set[int] = field(default_factory=set)
    requested: set[int] = field(default_factory=set)
    again: bool = False


class WatchStream:
    """One gRPC watch stream, etcd's way.

    * A reader task handles requests strictly in order, so ``created`` responses come back
      in request order, each before any event of its watcher.
    * Ids are per stream, assigned from 0 upward skipping ids in use; a client-chosen id
      that is in use is refused with ``created``+``canceled``, ``watch_id=-1`` and etcd's
      ``cancel_reason``.
    * A start revision below the compaction revision gives ``created``, then a separate
      ``canceled`` response carrying ``compact_revision`` (header revision 0, as etcd).
    * A progress request is answered with one event-less response, ``watch_id=-1``, once
      every watcher of the stream has delivered everything up to the revision at the time
      of the request: all later events on the stream have a higher revision.
    * Cancelling an unknown id gets no reply.
    * Responses over ``max_response_bytes`` are split into fragments for watchers created
      with ``fragment``; all events of one revision otherwise travel in one response.
    """

    def __init__(self, backend: Backend, *, max_response_bytes: int, require_leader: bool) -> None:
        self._b = backend
        self._hub = backend.watch_hub
        self._max_bytes = max_response_bytes
        self._require_leader = require_leader
        self._out: asyncio.Queue[rpc_pb2.WatchResponse | None] = asyncio.Queue(_OUT_QUEUE)
        self._entries: dict[int, _Entry] = {}
        self._next_id = 0
        self._reader: asyncio.Task[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._progress: _ProgressRound | None = None
        self._closed = False
        self.error: EtcdError | None = None
        """Set when the stream ended because of an error the client must see."""

    # --- output -------------------------------------------------------------------------
    def _response(self, watch_id: int, revision: int, **fields: Any) -> rpc_pb2.WatchResponse:
        resp = rpc_pb2.WatchResponse(watch_id=watch_id, **fields)
        fill_header(resp.header, self._b, revision)
        return resp

    async def run(
        self, requests: AsyncIterator[rpc_pb2.WatchRequest]
    ) -> AsyncIterator[rpc_pb2.WatchResponse]:
        """Yield responses until the client goes away, the server closes, or an error."""
        self._reader = asyncio.create_task(self._read(requests), name="watch-reader")
        if self._require_leader:
            self._monitor = asyncio.create_task(self._watch_leader(), name="watch-leader")
        while not self._closed:
            item = await self._out.get()
            if item is None:
                return
            yield item

    async def _watch_leader(self) -> None:
        """End a ``hasleader`` stream with etcd's "no leader" once this member has none."""
        while True:
            if self._b.header_info().leader == 0:
                self.error = errors.NO_LEADER
                await self._out.put(None)
                return
            await asyncio.sleep(_LEADER_CHECK_S)

    async def close(self) -> None:
        """Stop the reader and every pump, and cancel every watcher."""
        if self._closed:
            return
        self._closed = True
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        tasks += [t for t in (self._reader, self._monitor) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for e in self._entries.values():
            e.watcher.close()
        self._entries.clear()
        with contextlib.suppress(asyncio.QueueFull):
            self._out.put_nowait(None)

    # --- requests -----------------------------------------------------------------------
    async def _read(self, requests: AsyncIterator[rpc_pb2.WatchRequest]) -> None:
        try:
            async for req in requests:
                try:
                    await self._handle(req)
                except (EtcdError, asyncio.CancelledError):
                    raise
                except Exception as e:  # a bug: say so instead of stalling the stream
                    raise EtcdError(
                        grpc.StatusCode.INTERNAL, f"accord: watch stream failed: {e!r}"
                    ) from e
        except EtcdError as e:
            self.error = e
            self._closed_by_error()
        except asyncio.CancelledError:
            raise
        except Exception:
            # Reading failed: the client went away. End the stream quietly, as etcd does.
            await self._out.put(None)
        # End of the request stream (client half-close): keep serving, as etcd does.

    async def _handle(self, req: rpc_pb2.WatchRequest) -> None:
        kind = req.WhichOneof("request_union")
        if kind == "create_request":
            await self._create(req.create_request)
        elif kind == "cancel_request":
            await self._cancel(req.cancel_request.watch_id)
        elif kind == "progress_request":
            await self._request_progress()

    async def _create(self, cr: rpc_pb2.WatchCreateRequest) -> None:
        now = self._hub.progress()

        async def refuse(reason: str) -> None:
            # etcd: a watch that cannot be created answers created+canceled with id -1.
            await self._out.put(
                self._response(-1, now, created=True, canceled=True, cancel_reason=reason)
            )

        key = cr.key or b"\x00"  # etcd: an empty key means the smallest key
        end = cr.range_end
        if end and end != b"\x00" and key >= end:
            await refuse(MSG_EMPTY_WATCH_RANGE)
            return
        if cr.watch_id != 0 and cr.watch_id in self._entries:
            await refuse(errors.MSG_DUPLICATE_WATCH_ID)
            return
        try:
            watcher = self._hub.watch(
                key, end, cr.start_revision, cr.prev_kv, list(cr.filters), cr.progress_notify
            )
        except EtcdError as e:
            await refuse(e.message)
            return
        if cr.watch_id != 0:
            wid = cr.watch_id
        else:
            while self._next_id in self._entries:
                self._next_id += 1
            wid = self._next_id
            self._next_id += 1
        entry = _Entry(watcher, cr.fragment, cr.progress_notify)
        self._entries[wid] = entry
        await self._out.put(self._response(wid, now, created=True))
        entry.task = asyncio.create_task(self._pump(wid, entry), name=f"watch-pump-{wid}")
        entry.task.add_done_callback(self._pump_done)

    async def _cancel(self, wid: int) -> None:
        entry = self._entries.pop(wid, None)
        if entry is None:
            return  # etcd: cancelling an unknown id gets no reply
        if entry.task is not None:
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
        entry.watcher.close()
        self._progress_drop(wid)
        await self._out.put(self._response(wid, self._hub.progress(), canceled=True))

    def _pump_done(self, task: asyncio.Task[None]) -> None:
        """A pump that failed (a bug, not a cancel) ends the stream with INTERNAL, loudly,
        rather than leaving its watcher silently stalled."""
        if task.cancelled() or task.exception() is None or self._closed:
            return
        self.error = EtcdError(
            grpc.StatusCode.INTERNAL, f"accord: watch stream failed: {task.exception()!r}"
        )
        self._closed_by_error()

    def _closed_by_error(self) -> None:
        try:
            self._out.put_nowait(None)
        except asyncio.QueueFull:
            # The consumer is behind: make room, the stream ends with the error anyway.
            with contextlib.suppress(asyncio.QueueEmpty):
                self._out.get_nowait()
            self._out.put_nowait(None)

    # --- progress -----------------------------------------------------------------------
    async def _request_progress(self) -> None:
        if self._progress is not None:
            self._progress.again = True
            return
        rnd = _ProgressRound(self._hub.progress(), waiting=set(self._entries))
        self._progress = rnd
        for wid in list(rnd.waiting):
            self._progress_ask(wid)
        await self._progress_check()

    def _progress_ask(self, wid: int) -> None:
        rnd = self._progress
        entry = self._entries.get(wid)
        if rnd is None or entry is None or wid in rnd.requested:
            return
        if entry.watcher.synced:
            rnd.requested.add(wid)
            entry.watcher.request_progress()

    def _progress_drop(self, wid: int) -> None:
        if self._progress is not None:
            self._progress.waiting.discard(wid)

    async def _progress_check(self) -> None:
        rnd = self._progress
        if rnd is None or rnd.waiting:
            return
        self._progress = None
        await self._out.put(self._response(-1, rnd.revision))
        if rnd.again:
            await self._request_progress()

    # --- events -------------------------------------------------------------------------
    async def _pump(self, wid: int, entry: _Entry) -> None:
        watcher = entry.watcher
        while True:
            batch = watcher.poll()
            if batch is None:
                # Nothing queued, so the watcher is synced now: a pending progress round
                # can ask it for its marker.
                if self._progress is not None and wid in self._progress.waiting:
                    self._progress_ask(wid)
                batch = await watcher.next_batch()
            if batch.canceled:
                await self._send_cancel(wid, batch)
                return
            if batch.progress:
                rnd = self._progress
                if rnd is not None and wid in rnd.requested and batch.revision >= rnd.revision:
                    rnd.waiting.discard(wid)
                    await self._progress_check()
                if entry.progress_notify:
                    await self._out.put(self._response(wid, batch.revision))
                continue
            for resp in self._split(wid, batch, entry.fragment):
                await self._out.put(resp)

    async def _send_cancel(self, wid: int, batch: WatchBatch) -> None:
        if self._entries.get(wid) is None:
            return
        del self._entries[wid]
        self._progress_drop(wid)
        await self._out.put(
            self._response(
                wid,
                batch.revision,
                canceled=True,
                compact_revision=batch.compact_revision,
                cancel_reason=batch.cancel_reason,
            )
        )
        await self._progress_check()

    def _split(self, wid: int, batch: WatchBatch, fragment: bool) -> list[rpc_pb2.WatchResponse]:
        """One response, or fragments when allowed and the response is too large."""
        whole = self._response(wid, batch.revision, events=batch.events)
        if not fragment or len(batch.events) < 2 or whole.ByteSize() < self._max_bytes:
            return [whole]
        out: list[rpc_pb2.WatchResponse] = []
        cur = self._response(wid, batch.revision, fragment=True)
        base = cur.ByteSize()
        size = base
        for ev in batch.events:
            ev_size = ev.ByteSize() + 3  # tag and length prefix of the repeated field
            if len(cur.events) > 0 and size + ev_size >= self._max_bytes:
                out.append(cur)
                cur = self._response(wid, batch.revision, fragment=True)
                size = base
            cur.events.append(ev)
            size += ev_size
        cur.fragment = False
        out.append(cur)
        return out
