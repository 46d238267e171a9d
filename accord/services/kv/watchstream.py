"""etcd's Watch RPC: one bidirectional stream multiplexing many watchers.

A stream has two sides and two tasks. The *reader* task handles the client's requests
strictly in order (create, cancel, progress) and queues their answers. The *sender* is
the RPC's own response generator: it sends the queued answers first, then the events
of whichever watchers have some. A watcher signals "I have something" by putting its
id on the stream's ready list (:class:`_Ready`, installed with ``share_wake``), so one
committed revision seen by a thousand watchers costs a thousand list appends and
one wake-up per stream, not a task switch per watcher.

Responses leave as bytes. Every watcher of a revision gets the same event messages
(the hub shares them), so each event is serialized once (:class:`_EventBytes`) and each
response is the concatenation of a header (serialized once per revision and term),
the watch id, and the events' bytes: protobuf's wire format allows a message to be
built by concatenating its fields. The Watch method is registered with a serializer
that passes those bytes through (:func:`add_watch_servicer`).

etcd's behaviour kept here:

* ``created`` answers come back in request order, each before any event of its watcher.
* Ids are per stream, assigned from 0 upward skipping ids in use; a client-chosen id that
  is in use is refused with ``created``+``canceled``, ``watch_id=-1`` and etcd's reason.
* A start revision below the compaction revision gives ``created``, then a separate
  ``canceled`` response carrying ``compact_revision``.
* A progress request is answered with one event-less response, ``watch_id=-1``, once
  every watcher of the stream has delivered everything up to the revision at the time of
  the request: all later events on the stream have a higher revision. Over several
  shards that revision is the store's current one (every write acknowledged before the
  request is at or below it): the member's idle shards are floored there first, as
  they are before the server's periodic progress notifications (``progress_notify``;
  :func:`close_shards_through`). ``created`` answers, cancel answers and refusals name
  that revision too, without floors (none of them promises that events were delivered),
  and a watch without a start revision delivers exactly the changes above the revision
  its created answer names, as one etcd's.
* Cancelling an unknown id gets no reply.
* Responses over ``max_response_bytes`` are split into fragments for watchers created
  with ``fragment``; all events of one revision otherwise travel in one response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from accord.proto import kv_pb2, rpc_pb2, rpc_pb2_grpc
from accord.services.auth.guard import AuthGuard
from accord.services.auth.needs import watch_needs
from accord.services.kv import errors
from accord.services.kv.backend import Backend
from accord.services.kv.errors import EtcdError
from accord.services.kv.pbwire import varint
from accord.services.kv.shardwatch import AnyWatcher, ShardedWatchHub
from accord.services.kv.watchhub import WatchBatch, WatchHub

_PROGRESS_CLOSE_S = 2.0
"""The longest a progress request or a periodic progress notification waits for idle
shards to be floored at the store's current revision (:func:`close_shards_through`): a
member cut off from the quorum answers after it, at what its shards have closed."""
_CONTROL_LIMIT = 256
"""Answers to requests queued per stream before the reader waits for the sender."""
_LEADER_CHECK_S = 1.0
"""How often a ``hasleader`` stream checks that this member still knows a leader (about
an election timeout, as etcd checks)."""
NO_LEADER_CHECKS = 3
"""Checks in a row without a leader that end a ``hasleader`` stream (etcd's ``maxNoLeaderCnt``)."""
MSG_EMPTY_WATCH_RANGE = "mvcc: watcher range is empty"

# WatchResponse field tags (field number << 3 | wire type).
_TAG_HEADER = b"\x0a"
_TAG_WATCH_ID = b"\x10"
_TAG_FRAGMENT_TRUE = b"\x38\x01"
_TAG_EVENT = b"\x5a"


def _watch_id_field(wid: int) -> bytes:
    return _TAG_WATCH_ID + varint(wid) if wid else b""


class _EventBytes:
    """Each shared event message serialized once, with its length-prefixed field tag.

    Keyed by the message object (held here, so its id cannot be reused while cached);
    emptied when it grows past ``limit``: a miss only costs one serialization."""

    def __init__(self, limit: int = 8192) -> None:
        self._limit = limit
        self._cache: dict[int, tuple[kv_pb2.Event, bytes]] = {}

    def field(self, ev: kv_pb2.Event) -> bytes:
        hit = self._cache.get(id(ev))
        if hit is not None and hit[0] is ev:
            return hit[1]
        raw = ev.SerializeToString()
        data = _TAG_EVENT + varint(len(raw)) + raw
        if len(self._cache) >= self._limit:
            self._cache.clear()
        self._cache[id(ev)] = (ev, data)
        return data


_EVENTS = _EventBytes()


class _HeaderBytes:
    """A response header field, serialized once per (identity, revision, term)."""

    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        self._cache: dict[tuple[int, int, int, int], bytes] = {}

    def field(self, backend: Backend, revision: int) -> bytes:
        info = backend.header_info()
        key = (info.cluster_id, info.member_id, revision, info.raft_term)
        data = self._cache.get(key)
        if data is None:
            raw = rpc_pb2.ResponseHeader(
                cluster_id=info.cluster_id, member_id=info.member_id,
                revision=revision, raft_term=info.raft_term,
            ).SerializeToString()
            data = _TAG_HEADER + varint(len(raw)) + raw
            if len(self._cache) >= self._limit:
                self._cache.clear()
            self._cache[key] = data
        return data


_HEADERS = _HeaderBytes()


def serialize_response(resp: bytes | rpc_pb2.WatchResponse) -> bytes:
    """The Watch method's response serializer: bytes pass through, messages serialize."""
    if isinstance(resp, bytes):
        return resp
    return resp.SerializeToString()


class _Ready:
    """What a watcher rings when it has a batch or ended: its id joins the stream's
    ready list (the surface of ``asyncio.Event.set`` that ``share_wake`` needs)."""

    __slots__ = ("_stream", "_wid")

    def __init__(self, stream: WatchStream, wid: int) -> None:
        self._stream = stream
        self._wid = wid

    def set(self) -> None:
        self._stream._mark_ready(self._wid)


@dataclass(slots=True)
class _Entry:
    """One watcher of a stream and its options."""

    watcher: AnyWatcher
    fragment: bool
    progress_notify: bool


@dataclass(slots=True)
class _ProgressRound:
    """A stream-wide progress request waiting for every watcher to drain up to ``revision``."""

    revision: int
    waiting: set[int] = field(default_factory=set)
    requested: set[int] = field(default_factory=set)
    again: bool = False


class WatchServicer(rpc_pb2_grpc.WatchServicer):
    """``etcdserverpb.Watch``: one :class:`WatchStream` per gRPC stream (register it with
    :func:`add_watch_servicer`: its responses are bytes)."""

    def __init__(self, backend: Backend, *, max_response_bytes: int,
                 auth: AuthGuard | None = None) -> None:
        self._b = backend
        self._auth = auth
        self._max_response_bytes = max_response_bytes
        self._streams: set[WatchStream] = set()
        self._closed = False

    async def Watch(
        self, request_iterator: AsyncIterator[rpc_pb2.WatchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Serve one multiplexed watch stream until the client or the server ends it."""
        if self._closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "accord: server is shutting down")
        md: Any = context.invocation_metadata() or ()
        require_leader = any(k == "hasleader" and v == "true" for k, v in md)
        stream = WatchStream(
            self._b, max_response_bytes=self._max_response_bytes, require_leader=require_leader,
            auth=self._auth,
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


def add_watch_servicer(servicer: WatchServicer, server: grpc.aio.Server) -> None:
    """Register ``etcdserverpb.Watch/Watch`` with a serializer that lets bytes through."""
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.Watch,
        request_deserializer=rpc_pb2.WatchRequest.FromString,
        response_serializer=serialize_response,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("etcdserverpb.Watch", {"Watch": handler}),)
    )


class WatchStream:
    """One gRPC watch stream, etcd's way (see the module docstring)."""

    broken_at_idlest_shard = False
    """A deliberately broken variant for tests (the behaviour before progress requests and
    watches from now closed the idle shards): over several shards a progress request is
    answered, and a watch from now created, at the idlest shard's closed revision. Never
    set outside tests."""

    def __init__(self, backend: Backend, *, max_response_bytes: int, require_leader: bool,
                 auth: AuthGuard | None = None) -> None:
        self._b = backend
        self._auth = auth
        self._hub = backend.watch_hub
        self._max_bytes = max_response_bytes
        self._require_leader = require_leader
        self._control: deque[bytes | None] = deque()
        """Answers to requests (and the end marker ``None``), sent before any event."""
        self._room = asyncio.Event()
        self._room.set()
        self._ready: dict[int, None] = {}
        """Ids of watchers that may have something to send, oldest first."""
        self._wake = asyncio.Event()
        self._entries: dict[int, _Entry] = {}
        self._next_id = 0
        self._reader: asyncio.Task[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._progress: _ProgressRound | None = None
        self._closed = False
        self.error: EtcdError | None = None
        """Set when the stream ended because of an error the client must see."""

    # --- output -------------------------------------------------------------------------
    def _response(self, watch_id: int, revision: int, **fields: Any) -> bytes:
        """A control response (created, canceled, progress) as bytes."""
        body = rpc_pb2.WatchResponse(watch_id=watch_id, **fields).SerializeToString()
        return _HEADERS.field(self._b, revision) + body

    def _events_response(self, wid: int, revision: int, events: list[kv_pb2.Event],
                         fragment: bool = False) -> bytes:
        parts = [_HEADERS.field(self._b, revision), _watch_id_field(wid)]
        if fragment:
            parts.append(_TAG_FRAGMENT_TRUE)
        parts += [_EVENTS.field(ev) for ev in events]
        return b"".join(parts)

    def _emit(self, resp: bytes | None) -> None:
        self._control.append(resp)
        self._wake.set()

    async def _emit_waiting(self, resp: bytes) -> None:
        """Queue an answer from the reader; wait while the sender is far behind."""
        while len(self._control) >= _CONTROL_LIMIT and not self._closed:
            self._room.clear()
            await self._room.wait()
        self._emit(resp)

    def _mark_ready(self, wid: int) -> None:
        self._ready[wid] = None
        self._wake.set()

    async def run(self, requests: AsyncIterator[rpc_pb2.WatchRequest]) -> AsyncIterator[bytes]:
        """Yield responses until the client goes away, the server closes, or an error."""
        self._reader = asyncio.create_task(self._read(requests), name="watch-reader")
        if self._require_leader:
            self._monitor = asyncio.create_task(self._watch_leader(), name="watch-leader")
        while True:
            if self._control:
                item = self._control.popleft()
                if len(self._control) < _CONTROL_LIMIT:
                    self._room.set()
                if item is None:
                    return
                yield item
                continue
            if self._closed:
                return
            if self._ready:
                wid = next(iter(self._ready))
                del self._ready[wid]
                try:
                    out = self._serve(wid)
                except Exception as e:  # a bug: end the stream loudly, not a stalled watcher
                    self.error = EtcdError(
                        grpc.StatusCode.INTERNAL, f"accord: watch stream failed: {e!r}"
                    )
                    return
                for resp in out:
                    yield resp
                continue
            self._wake.clear()
            await self._wake.wait()

    async def _watch_leader(self) -> None:
        """End a ``hasleader`` stream with etcd's "no leader" once this member has known
        no leader at ``NO_LEADER_CHECKS`` checks in a row.

        As etcd (``monitorLeader``): ending a stream costs its client a reconnect and a
        resume, so a moment without a leader (an election, a leadership transfer, which
        leader balancing makes routine) must not end it; a lasting loss does.
        """
        misses = 0
        while True:
            misses = misses + 1 if self._b.header_info().leader == 0 else 0
            if misses >= NO_LEADER_CHECKS:
                self.error = errors.NO_LEADER
                self._emit(None)
                return
            await asyncio.sleep(_LEADER_CHECK_S)

    async def close(self) -> None:
        """Stop the reader, and cancel every watcher."""
        if self._closed:
            return
        self._closed = True
        self._room.set()
        tasks = [t for t in (self._reader, self._monitor) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for e in self._entries.values():
            e.watcher.close()
        self._entries.clear()
        self._ready.clear()
        self._emit(None)

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
            self._emit(None)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Reading failed: the client went away. End the stream quietly, as etcd does.
            self._emit(None)
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
            # etcd: a watch that cannot be created answers created+canceled with id -1,
            # at the store's current revision (see ``_answer_revision``).
            await self._emit_waiting(self._response(
                -1, await self._answer_revision(), created=True, canceled=True,
                cancel_reason=reason))

        key = cr.key or b"\x00"  # etcd: an empty key means the smallest key
        end = cr.range_end
        if self._auth is not None:  # etcd checks the caller first
            reason = await self._auth.watch_refusal(watch_needs(cr))
            if reason is not None:
                await refuse(reason)
                return
        if end and end != b"\x00" and key >= end:
            await refuse(MSG_EMPTY_WATCH_RANGE)
            return
        if cr.watch_id != 0 and cr.watch_id in self._entries:
            await refuse(errors.MSG_DUPLICATE_WATCH_ID)
            return
        start = cr.start_revision
        hub = self._hub
        if isinstance(hub, ShardedWatchHub) and not self.broken_at_idlest_shard:
            # As one etcd's, the created answer names the store's current revision: the
            # revision a read starting now answers at (above every write acknowledged
            # before, on any shard or worker), after its commit-wait (zero on one host,
            # ``--max-clock-offset`` at most), so that every write started after the
            # answer lands above it. A watch "from now" starts every shard just above
            # it: it delivers exactly the changes above the revision it was told. No
            # floor is needed for that: a write still in flight that lands at or below
            # it was concurrent with the creation, and leaving it out is what one etcd
            # may do too; every progress answer after it floors the idle shards first,
            # so none names less. (Floored here, every watch created would wait a Raft
            # round, the clock-derived revision moving on between two creations.)
            now = await self._answer_revision()
            if start <= 0:
                start = now + 1
        try:
            watcher = hub.watch(
                key, end, start, cr.prev_kv, list(cr.filters), cr.progress_notify
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
        self._entries[wid] = _Entry(watcher, cr.fragment, cr.progress_notify)
        await self._emit_waiting(self._response(wid, now, created=True))
        # After ``created`` is queued: the sender sends queued answers before events.
        watcher.share_wake(_Ready(self, wid))
        self._mark_ready(wid)  # a replay may have queued history already

    async def _cancel(self, wid: int) -> None:
        entry = self._entries.pop(wid, None)
        if entry is None:
            return  # etcd: cancelling an unknown id gets no reply
        self._ready.pop(wid, None)
        entry.watcher.close()
        self._progress_drop(wid)
        # At the store's current revision, as etcd's (no event of it follows).
        await self._emit_waiting(self._response(wid, await self._answer_revision(),
                                                canceled=True))
        self._progress_check()

    async def _answer_revision(self) -> int:
        """The store's current revision for a created, cancel or refusal answer: the one a
        read starting now answers at (above every write acknowledged before, on any shard
        or worker), after the revision order's commit-wait (zero on one host, at most
        ``--max-clock-offset``), so that every write started after the answer lands
        above it, as after one etcd's answer."""
        now = self._b.latest_revision()
        await self._b.settle(now)
        return now

    # --- progress -----------------------------------------------------------------------
    async def _request_progress(self) -> None:
        if not self.broken_at_idlest_shard:
            await self._close_through(self._b.latest_revision())
        if self._progress is not None:
            self._progress.again = True
            return
        self._start_progress_round()

    async def _close_through(self, revision: int) -> bool:
        """Over several shards: have every shard of this member closed at ``revision``
        before the round takes the hub's progress (:func:`close_shards_through`), so that
        a progress request is answered at the store's current revision, as one etcd
        answers it, and not at its idlest shard's (a client that read at R and waits for a
        progress notification at or above R would wait for a write to every shard)."""
        return await close_shards_through(self._hub, revision)

    def _start_progress_round(self) -> None:
        rnd = _ProgressRound(self._hub.progress(), waiting=set(self._entries))
        self._progress = rnd
        for wid in list(rnd.waiting):
            self._progress_ask(wid)
        self._progress_check()

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

    def _progress_check(self) -> None:
        rnd = self._progress
        if rnd is None or rnd.waiting:
            return
        self._progress = None
        self._emit(self._response(-1, rnd.revision))
        if rnd.again:
            self._start_progress_round()

    # --- events -------------------------------------------------------------------------
    def _serve(self, wid: int) -> list[bytes]:
        """The responses for watcher ``wid``'s next batch (none if it has nothing)."""
        entry = self._entries.get(wid)
        if entry is None:
            return []  # cancelled meanwhile
        batch = entry.watcher.poll()
        if batch is None:
            # Nothing queued, so the watcher is synced now: a pending progress round can
            # ask it for its marker.
            if self._progress is not None and wid in self._progress.waiting:
                self._progress_ask(wid)
            return []
        if batch.canceled:
            return self._send_cancel(wid, batch)
        self._ready[wid] = None  # more may be queued (or a replay refilled): come back
        if batch.progress:
            rnd = self._progress
            if rnd is not None and wid in rnd.requested and batch.revision >= rnd.revision:
                rnd.waiting.discard(wid)
                self._progress_check()
            if entry.progress_notify:
                return [self._events_response(wid, batch.revision, [])]
            return []
        return self._split(wid, batch, entry.fragment)

    def _send_cancel(self, wid: int, batch: WatchBatch) -> list[bytes]:
        if self._entries.pop(wid, None) is None:
            return []
        self._ready.pop(wid, None)
        self._progress_drop(wid)
        out = self._response(
            wid,
            batch.revision,
            canceled=True,
            compact_revision=batch.compact_revision,
            cancel_reason=batch.cancel_reason,
        )
        self._progress_check()
        return [out]

    def _split(self, wid: int, batch: WatchBatch, fragment: bool) -> list[bytes]:
        """One response, or fragments when allowed and the response is too large."""
        whole = self._events_response(wid, batch.revision, batch.events)
        if not fragment or len(batch.events) < 2 or len(whole) < self._max_bytes:
            return [whole]
        out: list[bytes] = []
        base = len(self._events_response(wid, batch.revision, [], fragment=True))
        cur: list[kv_pb2.Event] = []
        size = base
        for ev in batch.events:
            ev_size = len(_EVENTS.field(ev))
            if cur and size + ev_size >= self._max_bytes:
                out.append(self._events_response(wid, batch.revision, cur, fragment=True))
                cur, size = [], base
            cur.append(ev)
            size += ev_size
        out.append(self._events_response(wid, batch.revision, cur))
        return out


async def close_shards_through(hub: WatchHub | ShardedWatchHub, revision: int) -> bool:
    """Have every shard of this member closed at ``revision`` (a revision of the store,
    e.g. the current one: ``ShardedWatchHub.close_through``), so that progress answered
    next is that revision, as one etcd's is. Used before a progress answer and the
    periodic progress notifications. One store (a plain hub), or
    every shard current already: nothing to do. No quorum, or no answer within
    :data:`_PROGRESS_CLOSE_S`: False, and what is answered next is what the shards have
    closed (lower, never wrong)."""
    if not isinstance(hub, ShardedWatchHub) or hub.progress() >= revision:
        return True
    try:
        await asyncio.wait_for(hub.close_through(revision), _PROGRESS_CLOSE_S)
    except (EtcdError, TimeoutError):
        return False
    return True


async def notify_progress_now(backend: Backend) -> int:
    """One round of etcd's periodic progress notifications (the server runs it every
    ``--watch-progress-notify-interval``): every idle watcher created with
    ``progress_notify`` is told the store's current revision, over several shards after
    the idle ones were floored there (only while some watch is open: an idle cluster
    writes nothing). The broken variant (``WatchStream.broken_at_idlest_shard``) tells
    them the idlest shard's revision. Returns how many were told."""
    hub = backend.watch_hub
    if len(hub) and not WatchStream.broken_at_idlest_shard:
        await close_shards_through(hub, backend.latest_revision())
    return hub.notify_progress()
