"""Watches over the shards of other worker processes of a node (``docs/workers.md``).

On a node of several workers each KV shard's watch hub lives in the worker that hosts the
shard, and a client's Watch stream lands on whichever worker accepted its connection. A
watch over a shard of another worker is a *feed*: a tagged watcher made on the owner's
hub, whose batches the owner hands over in answer to long polls on its forwarding
socket, and a :class:`RemoteWatcher` here that queues them and takes part in the merged
watch (``shardwatch.MergedWatcher``) as a shard hub's own watcher does. So a watch over
any keys is one merged watch: strictly in revision order, every event of one revision
in one response, released up to the closed revision of every shard it spans — exactly
what it is on a node of one process.

The feed protocol (internal methods of the forwarding socket, msgpack bodies):

* ``WatchPoll [feed, open, seen_closed, max_events]`` -> ``[batches, synced, closed,
  store_revision, resume_revision]``: the first poll of a feed carries ``open`` (the
  watch's shard, range, start revision, prev_kv, filters, buffer limit) and creates the
  owner's watcher; each poll waits up to :data:`POLL_WAIT_S` for a batch, the end of the
  watch, or the shard's closed revision to pass ``seen_closed``, then answers every
  batch queued (one per revision, as the owner's watcher queued them) and the owner's
  view of the watch after them;
* ``WatchNudge [feed, progress, advance_to]``: queue a progress batch on the owner's
  watcher (a merged progress round), or floor the shard at ``advance_to`` (the merged
  watch waits on an idle shard) and answer the pending poll when that is done;
* ``WatchClose [feed]``: cancel the owner's watcher;
* ``WatchFloor [shards, revision]`` -> ``[closed revision of each]``: floor the owner's
  shards at ``revision`` (``ShardedWatchHub.close_through``: a progress request answered
  at the store's current revision) and say what they have closed after it.

Feed names are chosen by the watching worker (a random per-process token and a counter),
so a poll can open its feed with no round of its own, and a restarted worker never meets
its previous feeds. A feed nobody polled for :data:`ABANDONED_S` (its worker died) is
closed at the next open; until then its watcher's bounded buffer is all it holds. A feed
whose owner stops answering ends the watch with a cancel saying so, as the end of a
member's connection would.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgpack

from accord.node.forward import ForwardClient, ForwardedError, Handler
from accord.node.forwardgrpc import decode_fields
from accord.node.placement import WorkerPlan
from accord.node.polled import PolledTable
from accord.proto import kv_pb2
from accord.services.kv.errors import EtcdError
from accord.services.kv.shardwatch import ShardedWatchHub, SubWatcher, chase_floor
from accord.services.kv.watchhub import (
    Wake,
    WatchBatch,
    Watcher,
    batch_revision,
    take_batch,
)

WATCH_POLL = "/accord.worker/WatchPoll"
WATCH_NUDGE = "/accord.worker/WatchNudge"
WATCH_CLOSE = "/accord.worker/WatchClose"
WATCH_FLOOR = "/accord.worker/WatchFloor"
POLL_WAIT_S = 1.0
"""The longest a poll waits on the owner with nothing to answer: how stale, at worst, the
watching worker's view of an idle shard's closed revision gets without a nudge."""
ABANDONED_S = 30.0
"""A feed not polled for this long belongs to a worker that died: closed at the next open."""
CALL_TIMEOUT_S = 10.0


def _encode_batch(b: WatchBatch) -> list[Any]:
    return [b.revision, [e.SerializeToString() for e in b.events], b.subs, b.progress,
            b.canceled, b.compact_revision, b.cancel_reason]


def _decode_batch(raw: Any) -> WatchBatch:
    rev, events, subs, progress, canceled, compact_rev, reason = raw
    return WatchBatch(int(rev), [kv_pb2.Event.FromString(e) for e in events],
                      int(compact_rev), bool(canceled), str(reason), bool(progress),
                      None if subs is None else [int(s) for s in subs])


def _bad(message: str) -> ForwardedError:
    return ForwardedError(grpc.StatusCode.INVALID_ARGUMENT, message)


# --- the owner's side --------------------------------------------------------------


@dataclass
class _Feed:
    shard: int
    watcher: Watcher
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    floor_want: int = 0
    floor_task: asyncio.Task[None] | None = None


def _close_feed(feed: _Feed) -> None:
    feed.watcher.close()
    if feed.floor_task is not None:
        feed.floor_task.cancel()


class WatchFeeds:
    """The feeds this worker serves for watches other workers of its node hold over the
    shards it hosts (see the module docstring)."""

    def __init__(self, hub: ShardedWatchHub, hosted: frozenset[int],
                 floor: Any) -> None:
        self._hub = hub
        self._hosted = hosted
        self._floor = floor
        """``async floor(shards, revision)``: the backend's, through the shards' logs."""
        self._feeds: PolledTable[_Feed] = PolledTable("watch feed", ABANDONED_S, _close_feed)

    def __len__(self) -> int:
        return len(self._feeds)

    def handlers(self) -> dict[str, Handler]:
        """The internal methods this worker's forwarding socket serves for feeds."""
        return {WATCH_POLL: self._serve_poll, WATCH_NUDGE: self._serve_nudge,
                WATCH_CLOSE: self._serve_close, WATCH_FLOOR: self._serve_floor}

    def _open(self, spec: Any) -> _Feed:
        if not (isinstance(spec, list) and len(spec) == 7):
            raise _bad("a watch feed opens with [shard, key, end, start, prev_kv, filters, limit]")
        shard, key, end, start, prev_kv, filters, limit = spec
        if type(shard) is not int or shard not in self._hosted:
            raise ForwardedError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"shard {shard} is not hosted by this worker")
        if not (isinstance(key, bytes) and isinstance(end, bytes) and type(start) is int
                and isinstance(filters, list) and (limit is None or type(limit) is int)):
            raise _bad("malformed watch feed opening")
        try:
            w = self._hub.hubs[shard].watch(key, end, start, bool(prev_kv),
                                            [int(f) for f in filters], False, limit, tagged=True)
        except EtcdError as e:
            raise ForwardedError(e.code, e.message) from None
        feed = _Feed(shard, w)
        w.share_wake(feed.wake)
        return feed

    async def _serve_poll(self, body: bytes) -> bytes:
        name, spec, seen, max_events = decode_fields(body, 4)
        if not isinstance(name, str) or type(seen) is not int or type(max_events) is not int:
            raise _bad("malformed watch poll")
        feed = self._feeds.polled(name, spec, self._open)
        w = feed.watcher
        if w.peek() is None and not w.canceled and w.closed_revision() <= seen:
            feed.wake.clear()
            try:
                await asyncio.wait_for(feed.wake.wait(), POLL_WAIT_S)
            except TimeoutError:
                pass
        self._feeds.touch(name)
        batches: list[Any] = []
        count = 0
        while count < max(1, max_events):
            b = w.poll(1)  # one queued batch (one revision) at a time
            if b is None:
                break
            batches.append(_encode_batch(b))
            count += len(b.events)
            if b.canceled:
                self._feeds.forget(name)
                break
        return bytes(msgpack.packb([batches, w.synced, w.closed_revision(),
                                    w.store_revision(), w.resume_revision()]))

    async def _serve_nudge(self, body: bytes) -> bytes:
        name, progress, advance_to = decode_fields(body, 3)
        feed = self._feeds.get(name) if isinstance(name, str) else None
        if feed is None or type(advance_to) is not int:
            return b""  # ended meanwhile: its poll answers the end
        if progress:
            feed.watcher.request_progress()
        if advance_to > max(feed.floor_want, feed.watcher.closed_revision()):
            feed.floor_want = advance_to
            if feed.floor_task is None:
                feed.floor_task = asyncio.get_running_loop().create_task(
                    self._floor_feed(feed), name=f"watch-feed-floor-{feed.shard}")
        return b""

    async def _floor_feed(self, feed: _Feed) -> None:
        """Floor the feed's shard at the highest revision asked, then answer its poll."""
        try:
            await chase_floor(lambda: feed.floor_want,
                              lambda want: self._floor([feed.shard], want), feed.wake.set)
        finally:
            feed.floor_task = None
            feed.floor_want = 0

    async def _serve_floor(self, body: bytes) -> bytes:
        shards, revision = decode_fields(body, 2)
        if not (isinstance(shards, list) and all(type(s) is int for s in shards)
                and type(revision) is int):
            raise _bad("a watch floor is [shards, revision]")
        foreign = [s for s in shards if s not in self._hosted]
        if foreign:
            raise ForwardedError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"shards {foreign} are not hosted by this worker")
        try:
            await self._floor(shards, revision)
        except EtcdError as e:
            raise ForwardedError(e.code, e.message) from None
        return bytes(msgpack.packb([self._hub.hubs[s].progress() for s in shards]))

    async def _serve_close(self, body: bytes) -> bytes:
        (name,) = decode_fields(body, 1)
        if isinstance(name, str):
            self._feeds.close(name)
        return b""


# --- the watching side -------------------------------------------------------------


class RemoteWatcher:
    """A sub-watcher of a merged watch over a shard another worker hosts: the batches of
    its feed there, queued here (``shardwatch.SubWatcher``)."""

    def __init__(self, links: WatchLinks, client: ForwardClient, shard: int, name: str,
                 spec: list[Any], buffer_limit: int) -> None:
        self._links = links
        self._client = client
        self.shard = shard
        self.name = name
        self.buffer_limit = buffer_limit
        self.synced = False
        self._queue: deque[WatchBatch] = deque()
        self._queued_events = 0
        self._final: WatchBatch | None = None
        self._wake: Wake | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._closed = 0
        self._store_rev = 0
        self._resume = 0
        self._advanced = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poller = asyncio.get_running_loop().create_task(
            self._run(spec), name=f"watch-feed-{name}")

    # --- SubWatcher -----------------------------------------------------------------
    @property
    def canceled(self) -> bool:
        """Whether the watch has ended here (its last batch may still be queued)."""
        return self._final is not None

    def peek(self) -> WatchBatch | None:
        """The next queued batch without taking it."""
        return self._queue[0] if self._queue else None

    def poll(self, max_events: int = 1000, until_rev: int | None = None) -> WatchBatch | None:
        """The next batch, merged as ``Watcher.poll`` merges; the cancel once ended."""
        if not self._queue:
            return self._final
        batch = take_batch(self._queue, max_events, until_rev)
        self._queued_events -= len(batch.events)
        if self._queued_events < self.buffer_limit:
            self._room.set()
        return batch

    def closed_revision(self) -> int:
        """The owner's closed revision for this watch, as of its last answer."""
        return self._closed

    def store_revision(self) -> int:
        """The owner's shard revision, as of its last answer."""
        return self._store_rev

    def resume_revision(self) -> int:
        """The lowest revision not handed out: the first queued here, else the owner's."""
        for b in self._queue:
            if b.events:
                return batch_revision(b)
        if self._final is not None:
            return self._final.compact_revision or self._final.revision
        return self._resume

    def share_wake(self, wake: Wake) -> None:
        """Set ``wake`` whenever a batch comes or the watch ends."""
        self._wake = wake
        if self._queue or self._final is not None:
            wake.set()

    def request_progress(self) -> None:
        """Have the owner queue a progress batch behind what it has queued."""
        if self._final is None:
            self._send(WATCH_NUDGE, [self.name, True, 0])

    def advance(self, revision: int) -> bool:
        """Have the owner floor the shard at ``revision``; its next answer says so."""
        if self._final is None and revision > self._advanced:
            self._advanced = revision
            self._send(WATCH_NUDGE, [self.name, False, revision])
        return True

    def close(self) -> None:
        """Cancel the watch here and on the owner."""
        if self._final is not None:
            return
        self._queue.clear()
        self._queued_events = 0
        self._end(WatchBatch(self._store_rev, canceled=True))
        self._send(WATCH_CLOSE, [self.name])

    # --- internals ------------------------------------------------------------------
    def _send(self, method: str, body: list[Any]) -> None:
        async def send() -> None:
            try:
                await self._client.call(method, msgpack.packb(body), CALL_TIMEOUT_S)
            except (ForwardedError, OSError):
                pass  # the owner is gone: the poll ends the watch

        task = asyncio.get_running_loop().create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _end(self, batch: WatchBatch) -> None:
        if self._final is None:
            self._final = batch
            self._poller.cancel()
            self._links.forget(self)
            if self._wake is not None:
                self._wake.set()

    async def _run(self, spec: list[Any]) -> None:
        opening: list[Any] | None = spec  # the first poll opens the feed
        try:
            while self._final is None:
                await self._room.wait()
                raw = await self._client.call(
                    WATCH_POLL, msgpack.packb([self.name, opening, self._closed,
                                               self.buffer_limit]),
                    POLL_WAIT_S + CALL_TIMEOUT_S)
                opening = None
                self._take(msgpack.unpackb(raw))
        except asyncio.CancelledError:
            raise
        except ForwardedError as e:
            reason = (e.message if opening is not None  # the owner refused the watch
                      else f"accord: the worker that hosts shard {self.shard} of this watch "
                      f"stopped serving it ({e.message}); re-create the watch")
            self._end(WatchBatch(self._store_rev, canceled=True, cancel_reason=reason))
        except (OSError, ValueError, TypeError, msgpack.UnpackException) as e:
            self._end(WatchBatch(self._store_rev, canceled=True, cancel_reason=(
                f"accord: the worker that hosts shard {self.shard} of this watch stopped "
                f"answering ({e}); re-create the watch")))

    def _take(self, answer: Any) -> None:
        batches, synced, closed, store_rev, resume = answer
        got = [_decode_batch(b) for b in batches]
        moved = bool(got) or closed != self._closed or bool(synced) != self.synced
        self.synced = bool(synced)
        self._closed = int(closed)
        self._store_rev = int(store_rev)
        self._resume = int(resume)
        self._links.heard(self.shard, self._closed)
        if not got and self._advanced > self._closed:
            # An answer of nothing but the state (the owner's floor ended, or the poll's
            # wait did) and the shard is still not floored there (no quorum): let the
            # merged watcher, woken now, nudge again (the owner ignores a floor in flight).
            self._advanced = self._closed
            moved = True
        final = None
        for b in got:
            if b.canceled:
                final = b
                break
            self._queue.append(b)
            self._queued_events += len(b.events)
        if self._queued_events >= self.buffer_limit:
            self._room.clear()  # the owner's buffer takes the rest, or cancels it as slow
        if final is not None:
            self._final = final
            self._links.forget(self)
        if (moved or final is not None) and self._wake is not None:
            self._wake.set()


class WatchLinks:
    """This worker's side of feeds: which shards are another worker's, and their
    watchers (``shardwatch.RemoteShards``)."""

    def __init__(self, plan: WorkerPlan, index: int,
                 clients: Mapping[int, ForwardClient], default_limit: int) -> None:
        self.plan = plan
        self.index = index
        self.clients = clients
        self.default_limit = default_limit
        self._token = f"{index}.{secrets.token_hex(6)}"
        self._next = 0
        self._known: dict[int, int] = {}
        self.open: dict[str, RemoteWatcher] = {}
        """The feeds this worker holds open (for tests and shutdown)."""

    def hosts(self, shard: int) -> bool:
        """Whether this worker hosts ``shard``."""
        return self.plan.worker_of_shard(shard) == self.index

    def closed(self, shard: int) -> int | None:
        """The closed revision of ``shard`` last heard from its worker."""
        return self._known.get(shard)

    def heard(self, shard: int, closed: int) -> None:
        """Note a closed revision of ``shard`` heard from its worker."""
        if closed > self._known.get(shard, 0):
            self._known[shard] = closed

    async def floor(self, shards: list[int], revision: int) -> None:
        """Have each owner floor its ``shards`` at ``revision`` (``WatchFloor``) and note
        the closed revisions it answers; an owner that refuses or does not answer is
        left as last heard (the progress answered is then lower, never wrong)."""
        by_owner: dict[int, list[int]] = {}
        for s in shards:
            by_owner.setdefault(self.plan.worker_of_shard(s), []).append(s)

        async def ask(owner: int, theirs: list[int]) -> None:
            try:
                raw = await self.clients[owner].call(
                    WATCH_FLOOR, msgpack.packb([theirs, revision]), CALL_TIMEOUT_S)
                closed = msgpack.unpackb(raw)
            except (ForwardedError, OSError, ValueError, msgpack.UnpackException):
                return
            if isinstance(closed, list) and len(closed) == len(theirs):
                for s, c in zip(theirs, closed, strict=True):
                    if type(c) is int:
                        self.heard(s, c)

        await asyncio.gather(*(ask(o, ss) for o, ss in by_owner.items()))

    def watch(self, shard: int, key: bytes, range_end: bytes, start_revision: int,
              prev_kv: bool, filters: list[int], buffer_limit: int | None) -> SubWatcher:
        """A feed of ``shard``'s worker for this watch (opened by its first poll)."""
        limit = buffer_limit if buffer_limit is not None else self.default_limit
        if limit <= 0:
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT,
                            f"watch buffer_limit must be positive, got {limit}")
        self._next += 1
        name = f"{self._token}.{self._next}"
        owner = self.plan.worker_of_shard(shard)
        spec = [shard, key, range_end, start_revision, prev_kv, filters, limit]
        w = RemoteWatcher(self, self.clients[owner], shard, name, spec, limit)
        self.open[name] = w
        return w

    def forget(self, w: RemoteWatcher) -> None:
        """A feed ended."""
        self.open.pop(w.name, None)
