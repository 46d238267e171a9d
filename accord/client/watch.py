"""A watch as an async iterator that survives disconnects: ``async for event in watch``.

::

    async with client.watch("/jobs/", prefix=True, start_revision=rev + 1) as watch:
        async for event in watch:
            print(event.type, event.kv.key, event.kv.value)

The watch keeps one etcd Watch stream open on the client's current endpoint, with
etcd's ``hasleader`` metadata (a member cut off from the cluster ends the stream). It
tracks a *safe revision*: every event at or below it has been received. That is the
revision before the start, raised by each progress notification. Events above the safe
revision are remembered by ``(key, mod_revision)`` until a progress notification passes
them; the watch asks for one itself after every :data:`PROGRESS_ASK_EVENTS` such events
or once every :data:`PROGRESS_ASK_S` while events flow, so that memory stays small. A
server answers a progress request at the store's current revision, flooring the shards
that had no writes first (so the progress of a range over several shards moves too; on
a server from before that, the answer stays at the idlest shard's revision and the
memory is released once every shard of the range has written). The stream is created
with ``progress_notify`` so that the server answers for this watch's own shards. When
the stream breaks — the member was killed, restarted, lost its leader, the connection
dropped, or the server cancelled a too-slow watcher — the watch opens a new stream on
the next endpoint from the safe revision + 1 and drops the events it already
delivered. Every member applies the same history, so none is delivered twice and none
is skipped. Tracking a safe revision rather than "the last event's revision" matters
when a range spans shards on a server from before the ordered merge
(``accord/services/kv/shardwatch.py``): it could deliver a lagging shard's revision 11
after another shard's revision 100, and both must arrive.

The rule that makes a revision a point to start or resume from, over several shards:
each shard numbers its own revisions, so a revision S is *closed* (no shard of the
range can still commit a change at or below S) only once every shard of the range has
passed S. Before its first stream the watch therefore reads the range (linearizable,
count only): the read floors every shard of the range at its revision R, so every
later write to the range gets a revision above R. A watch "from now" starts at R + 1;
a watch from ``start_revision`` S <= R + 1 then receives every change committed after
the read, whatever its shard (without that read, a write made after the watch was
created, to a shard whose counter was still below S, got a revision below S and was
never delivered: the loss issue 19 reported). A start above R + 1 is in the range's
future: events from S on are delivered, as etcd does. A resume point needs no new
floor: a progress notification's revision is the lowest *closed* revision of the
answering member's shards (applied, and below any open multi-shard Txn's reserved
revision: ``WatchHub.progress``), so no shard can still commit at or below it.

If the revision the watch needs was compacted (at the start, or while it was
reconnecting) iteration raises :class:`~accord.client.errors.WatchCompacted` with the
oldest revision still available. A stream the server cancels for another reason raises
:class:`~accord.client.errors.WatchError`; no endpoint answering for the client's
``retry_budget_s`` raises :class:`~accord.client.errors.Unavailable`.

Progress: ``await watch.request_progress()`` asks the server to confirm how far the
watch is and returns that revision: every event at or below it has been delivered, and
it is at or above every write acknowledged before the call (the store's current
revision, as one etcd answers; the call reads the range first, so that a server from
before the servers floored idle shards themselves answers no lower either). The server
also sends such notifications by itself while the watch is idle (the stream is always
created with etcd's ``progress_notify``). Both move
:attr:`Watch.progress_revision` and call ``on_progress(revision)``. Filters (``filters=[EventType.DELETE]``) leave event types out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from accord.client.errors import ClientError, Unavailable, WatchCompacted, WatchError
from accord.client.kv import Data, EventType, KeyValue, key_range
from accord.client.transport import EndpointPool
from accord.proto import kv_pb2, rpc_pb2, rpc_pb2_grpc

_rpc: Any = rpc_pb2_grpc

PROGRESS_ASK_EVENTS = 1024
"""Events remembered (above the safe revision) after which the watch asks for progress:
each ask costs the server a progress round over the watch's shards (and floors of the
idle ones), about a millisecond of the cluster's CPU; 1,024 remembered events are
~150 KB."""
PROGRESS_ASK_S = 1.0
"""Seconds after which the watch asks for progress while it remembers any event."""
QUEUE_RESPONSES = 1024
"""Responses buffered ahead of the consumer; beyond it the stream is not read (gRPC's
flow control then holds the server back)."""
_STREAM_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                           grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                           grpc.StatusCode.INTERNAL})
"""Stream errors after which the watch reconnects (a dying member ends streams with any
of these); other codes are answers and end the watch."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change to a watched key."""

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None
    """The key before the change (only for a watch created with ``prev_kv=True``)."""

    @property
    def revision(self) -> int:
        """The revision of the change."""
        return self.kv.mod_revision

    @classmethod
    def from_pb(cls, ev: kv_pb2.Event) -> WatchEvent:
        """From the wire message."""
        return cls(EventType.DELETE if ev.type == kv_pb2.Event.DELETE else EventType.PUT,
                   KeyValue.from_pb(ev.kv),
                   KeyValue.from_pb(ev.prev_kv) if ev.HasField("prev_kv") else None)


_END = object()


class Watch:
    """Events of a key or range from ``start_revision`` on, across member failures."""

    def __init__(
        self, pool: EndpointPool, key: Data, range_end: Data | None = None, *,
        prefix: bool = False, from_key: bool = False, start_revision: int = 0,
        prev_kv: bool = False, filters: Iterable[EventType] = (),
        on_progress: Callable[[int], None] | None = None,
        require_leader: bool = True, on_close: Callable[[Watch], None] | None = None,
    ) -> None:
        if start_revision < 0:
            raise ValueError(f"start_revision must be >= 0 (0: from now), got {start_revision}")
        self._pool = pool
        self._key, self._end = key_range(key, range_end, prefix=prefix, from_key=from_key)
        self._prev_kv = prev_kv
        self._filters = [rpc_pb2.WatchCreateRequest.NODELETE if f is EventType.DELETE
                         else rpc_pb2.WatchCreateRequest.NOPUT for f in set(filters)]
        self._on_progress = on_progress
        self._require_leader = require_leader
        self._on_close = on_close
        self._start = start_revision
        self.progress_revision = max(0, start_revision - 1)
        """The safe revision: every event up to it has been received."""
        self._seen: set[tuple[bytes, int]] = set()
        """``(key, mod_revision)`` of the events received above the safe revision."""
        self._asked_at = 0.0
        self._asking = False
        self._pinned = False
        self._watch_id: int | None = None
        self.endpoint = ""
        """The endpoint the current stream is open on."""
        self.reconnects = 0
        """Streams opened after the first (one per disconnect survived)."""
        self.repeats_dropped = 0
        """Events a reopened stream sent again, dropped as already delivered."""
        self._queue: asyncio.Queue[WatchEvent | BaseException | object] = asyncio.Queue(
            QUEUE_RESPONSES)
        self._call: Any = None
        self._writing = asyncio.Lock()
        """One write at a time on the stream: grpc refuses a second while one is pending
        (TOO_MANY_OPERATIONS), and a caller's progress request can meet the watch's own."""
        self._progress_waiters: list[asyncio.Future[int]] = []
        self._created = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._finished = False
        self._streamed = False

    @property
    def next_revision(self) -> int:
        """The revision a new stream would start from (0 until the watch is pinned)."""
        return self.progress_revision + 1 if self._start or self._pinned else 0


    # --- lifetime ------------------------------------------------------------------------
    def start(self) -> Watch:
        """Open the stream (done on first iteration or ``async with`` if not called)."""
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name="accord-watch")
        return self

    async def created(self, timeout: float | None = None) -> int:
        """Wait until the server confirmed the watch; the revision it starts after."""
        self.start()
        waiter = asyncio.ensure_future(self._created.wait())
        assert self._task is not None
        await asyncio.wait({waiter, self._task}, timeout=timeout or
                                     self._pool.retry_budget_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not self._created.is_set():
            if self._task.done() and not self._queue.empty():
                item = self._queue.get_nowait()
                if isinstance(item, BaseException):
                    raise item
            raise Unavailable(grpc.StatusCode.DEADLINE_EXCEEDED,
                              "the watch was not confirmed by any endpoint in time",
                              endpoint=self.endpoint)
        return self.progress_revision

    async def close(self) -> None:
        """Stop watching (cancels the stream; iteration then ends)."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for f in self._progress_waiters:
            if not f.done():
                f.cancel()
        self._progress_waiters.clear()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_END)
        if self._on_close is not None:
            self._on_close(self)

    async def __aenter__(self) -> Watch:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- iteration -----------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._finished:
            raise StopAsyncIteration
        self.start()
        item = await self._queue.get()
        if isinstance(item, WatchEvent):
            return item
        self._finished = True
        if isinstance(item, BaseException):
            raise item
        raise StopAsyncIteration

    async def request_progress(self, timeout: float | None = None) -> int:
        """Ask the server how far this watch is; the revision it confirms."""
        await self.created(timeout)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._progress_waiters.append(fut)
        try:
            await self._floor(self._pool.channel(self.endpoint))
            await self._send(self._call, rpc_pb2.WatchRequest(
                progress_request=rpc_pb2.WatchProgressRequest()))
            return await asyncio.wait_for(fut, timeout or self._pool.call_timeout_s)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise Unavailable(grpc.StatusCode.UNAVAILABLE,
                              f"progress request failed: {e}", endpoint=self.endpoint) from None
        finally:
            with contextlib.suppress(ValueError):
                self._progress_waiters.remove(fut)

    # --- the stream ----------------------------------------------------------------------
    async def _run(self) -> None:
        failing_since: float | None = None
        attempt = 0
        last_error = ""
        try:
            while True:
                ep = self._pool.current
                self.endpoint = ep
                try:
                    await self._stream(ep)
                    last_error = "stream ended by the server"
                except grpc.aio.AioRpcError as e:
                    if e.code() not in _STREAM_CODES:
                        await self._queue.put(WatchError(e.code(), e.details() or "",
                                                         endpoint=ep))
                        return
                    last_error = f"{e.code().name}: {e.details()}"
                except asyncio.InvalidStateError:
                    last_error = "stream ended while a request was being written"
                except _Done:
                    return
                # the stream broke: resume on the next endpoint
                self._pool.fail_over(ep)
                self._created.clear()
                if self._streamed:
                    failing_since, attempt = None, 0
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self._pool.retry_budget_s:
                    await self._queue.put(Unavailable(
                        grpc.StatusCode.UNAVAILABLE,
                        f"watch: no endpoint of {self._pool.endpoints} took the stream for "
                        f"{self._pool.retry_budget_s:.0f}s; last error: {last_error}",
                        endpoint=ep))
                    return
                await asyncio.sleep(self._pool.policy.backoff.delay(attempt))
                attempt += 1
                self.reconnects += 1
        except ClientError as e:  # the pool was closed
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(e)
        except Exception as e:  # a bug must reach the consumer, not hang it
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(WatchError(grpc.StatusCode.INTERNAL,
                                                  f"watch failed: {e!r}", endpoint=self.endpoint))
            raise

    async def _floor(self, ch: grpc.aio.Channel) -> int:
        """A linearizable count read of the range: its revision (every shard the range
        spans is at or above it afterwards)."""
        req = rpc_pb2.RangeRequest(key=self._key, range_end=self._end, count_only=True)
        r = await _rpc.KVStub(ch).Range(req, timeout=self._pool.call_timeout_s)
        return int(r.header.revision)

    async def _pin(self, ch: grpc.aio.Channel) -> None:
        """Before the first stream: floor the range's shards with a read of the range, so
        that every later write to it gets a revision above the read's; "from now" starts
        after the read's revision (see the module doc)."""
        rev = await self._floor(ch)
        if not self._start:
            self.progress_revision = rev
        self._pinned = True

    async def _stream(self, ep: str) -> None:
        """One stream's life: create, then queue its events until it breaks."""
        self._streamed = False
        ch = self._pool.channel(ep)
        if not self._pinned:
            await self._pin(ch)
        md = (("hasleader", "true"),) if self._require_leader else None
        call = _rpc.WatchStub(ch).Watch(metadata=md)
        self._call = call
        self._asking = False
        try:
            await self._send(call, rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                key=self._key, range_end=self._end, start_revision=self.progress_revision + 1,
                prev_kv=self._prev_kv, filters=self._filters, progress_notify=True)))
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF or resp is None:
                    return
                if await self._handle(resp, ep):
                    return
        finally:
            call.cancel()

    async def _handle(self, resp: rpc_pb2.WatchResponse, ep: str) -> bool:
        """Queue what ``resp`` brings; True when the stream must be reopened."""
        if resp.created:
            self._watch_id = int(resp.watch_id)
            self._streamed = True
            self._created.set()
        if resp.canceled:
            if resp.compact_revision:
                await self._queue.put(WatchCompacted(self.progress_revision + 1,
                                                     int(resp.compact_revision), endpoint=ep))
                raise _Done
            if "too slow" in resp.cancel_reason:
                return True  # the server dropped a slow watcher: resume where we are
            await self._queue.put(WatchError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"watch cancelled by the server: {resp.cancel_reason or 'no reason given'}",
                endpoint=ep))
            raise _Done
        if resp.events:
            for ev in resp.events:
                mark = (bytes(ev.kv.key), int(ev.kv.mod_revision))
                if mark[1] <= self.progress_revision or mark in self._seen:
                    self.repeats_dropped += 1
                    continue  # delivered before the stream was reopened
                self._seen.add(mark)
                await self._queue.put(WatchEvent.from_pb(ev))
            await self._ask_progress_if_due()
            return False
        if not resp.created:
            # this watch's own progress, or the stream's (-1: after every watch's own,
            # at the lowest revision of all shards, so at most this watch's)
            self._progress(int(resp.header.revision), answer=resp.watch_id == -1)
        return False

    def _progress(self, rev: int, *, answer: bool) -> None:
        if rev > self.progress_revision:
            self.progress_revision = rev
            self._seen = {m for m in self._seen if m[1] > rev}
            if self._on_progress is not None:
                self._on_progress(rev)
        if answer:
            self._asking = False
            for f in self._progress_waiters:
                if not f.done():
                    f.set_result(self.progress_revision)

    async def _ask_progress_if_due(self) -> None:
        """Ask for a progress notification so the delivered-events memory stays small."""
        now = time.monotonic()
        if self._asking or not self._seen:
            return
        if len(self._seen) < PROGRESS_ASK_EVENTS and now - self._asked_at < PROGRESS_ASK_S:
            return
        self._asking = True
        self._asked_at = now
        # No read of the range first (as :meth:`request_progress` makes): the server
        # floors the idle shards itself, and the read cost the cluster more than the
        # request (a linearizable count over every shard of the range, once a second
        # per watch; ``bench/README.md``).
        await self._send(self._call, rpc_pb2.WatchRequest(
            progress_request=rpc_pb2.WatchProgressRequest()))

    async def _send(self, call: Any, request: rpc_pb2.WatchRequest) -> None:
        """Write ``request`` on ``call`` once no other write is pending on it."""
        async with self._writing:
            await call.write(request)


class _Done(Exception):
    """The watch ended for good (its error is queued)."""
