"""The watch hub of one node: committed changes fanned out to watchers, with replay.

A watcher is *unsynced* while it replays history (from its start revision, in chunks
that fit its buffer, refilled as the consumer drains), then *synced*: the apply loop's
:meth:`WatchHub.publish` appends each committed revision's matching events to its
buffer. Buffers are bounded: a synced watcher whose consumer falls more than
``buffer_limit`` events behind is cancelled with a reason saying the revision to resume
from; memory never grows without bound. All events of one revision travel in one batch.
Event messages are shared between watchers: treat them as read-only (copy them into
the response, as ``repeated.extend`` does). A replay that starts below the compaction revision ends in a cancel carrying
``compact_revision`` (etcd's behaviour). The hub knows nothing of gRPC; the servicer turns
:class:`WatchBatch` objects into ``WatchResponse`` messages.

Threading: ``publish`` and ``next_batch`` must run on the same event loop (the apply loop
runs on it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from accord.proto import kv_pb2, rpc_pb2
from accord.services.kv import errors
from accord.services.kv.limits import Limits
from accord.services.kv.mvcc import SUB, VALUE, MVCCStore, Rec
from accord.services.kv.pbconv import event_pb
from accord.services.kv.ranges import KeyRange
from accord.services.kv.watchindex import WatcherIndex

NOPUT = rpc_pb2.WatchCreateRequest.NOPUT
NODELETE = rpc_pb2.WatchCreateRequest.NODELETE

Change = tuple[bytes, Rec, Rec | None]


class Wake(Protocol):
    """What a watcher rings when it gets a batch or ends: an ``asyncio.Event``, or the
    watch stream's ready list (see ``watchstream.py``)."""

    def set(self) -> None:
        """Note that the watcher has something."""


@dataclass(slots=True)
class WatchBatch:
    """What the servicer sends as one WatchResponse (before fragmenting)."""

    revision: int
    """Header revision: the store revision when the batch was produced."""
    events: list[kv_pb2.Event] = field(default_factory=list)
    compact_revision: int = 0
    canceled: bool = False
    cancel_reason: str = ""
    progress: bool = False
    """An event-less progress notification: every event <= revision was delivered."""
    subs: list[int] | None = None
    """Only for a watcher with ``tagged`` set (a sub-watcher of a merged watch): each
    event's sub-revision, its place in its revision (``shardwatch.py`` orders one
    revision's events from several shards by it); None otherwise."""


def batch_revision(batch: WatchBatch) -> int:
    """The revision a batch is ordered by: its first event's (a replayed batch's header
    revision is the store's, later than its events), or the header's if it has none."""
    return batch.events[0].kv.mod_revision if batch.events else batch.revision


SLOW_PREFIX = "accord: watcher too slow"


def slow_reason(buffer_limit: int, resume_rev: int) -> str:
    """The cancel reason of a watcher whose consumer fell too far behind."""
    return (
        f"{SLOW_PREFIX}, buffer of {buffer_limit} events "
        f"exceeded; re-create the watch from revision {resume_rev}"
    )


def take_batch(queue: deque[WatchBatch], max_events: int,
               until_rev: int | None = None) -> WatchBatch:
    """Pop the first batch of a non-empty ``queue``, with the batches behind it merged in
    up to ``max_events`` events (never a progress batch with an event batch; with
    ``until_rev``, only event batches at revisions up to it)."""
    batch = queue.popleft()
    while queue and len(batch.events) + len(queue[0].events) <= max_events:
        nxt = queue[0]
        if nxt.progress != batch.progress:
            break
        if until_rev is not None and (nxt.progress or batch_revision(nxt) > until_rev):
            break
        queue.popleft()
        batch.events.extend(nxt.events)
        if batch.subs is not None:
            batch.subs.extend(nxt.subs or [0] * len(nxt.events))
        batch.revision = nxt.revision
    return batch


class Watcher:
    """One watch: its range, options, position and bounded buffer."""

    __slots__ = (
        "_final",
        "_hub",
        "_queue",
        "_queued_events",
        "_wake",
        "_want_progress",
        "buffer_limit",
        "id",
        "kr",
        "min_rev",
        "next_rev",
        "no_delete",
        "no_put",
        "prev_kv",
        "progress_notify",
        "synced",
        "tagged",
    )

    def __init__(
        self,
        hub: WatchHub,
        wid: int,
        kr: KeyRange,
        prev_kv: bool,
        filters: Iterable[int],
        progress_notify: bool,
        buffer_limit: int,
    ) -> None:
        self._hub = hub
        self.id = wid
        self.kr = kr
        self.prev_kv = prev_kv
        fs = set(filters)
        self.no_put = NOPUT in fs
        self.no_delete = NODELETE in fs
        self.progress_notify = progress_notify
        self.buffer_limit = buffer_limit
        self.min_rev = 0
        """Revisions below this are not delivered (a start revision in the future)."""
        self.next_rev = 0
        """While unsynced: the next revision to replay from history."""
        self.synced = False
        self._queue: deque[WatchBatch] = deque()
        self._queued_events = 0
        self._wake: Wake | None = None
        self._final: WatchBatch | None = None
        self._want_progress = False
        self.tagged = False
        """Its batches carry each event's sub-revision (``WatchBatch.subs``): set on the
        sub-watchers of a merged watch, never on a watch of one shard (no cost there)."""

    @property
    def canceled(self) -> bool:
        """Whether the watch has ended (its last batch may still be queued)."""
        return self._final is not None

    def _events(self, changes: list[Change]) -> list[kv_pb2.Event]:
        out = []
        for key, rec, prev in changes:
            if not self.kr.contains(key):
                continue
            if (self.no_delete if rec[VALUE] is None else self.no_put):
                continue
            out.append(event_pb(key, rec, prev, self.prev_kv))
        return out

    def _batch(self, revision: int, changes: list[Change]) -> WatchBatch | None:
        """The batch of a replayed revision's ``changes`` (None if none matches), with
        the sub-revisions when :attr:`tagged`."""
        if not self.tagged:
            events = self._events(changes)
            return WatchBatch(revision, events) if events else None
        picked = [c for c in changes if self.kr.contains(c[0])
                  and not (self.no_delete if c[1][VALUE] is None else self.no_put)]
        if not picked:
            return None
        events = [event_pb(k, rec, prev, self.prev_kv) for k, rec, prev in picked]
        return WatchBatch(revision, events, subs=[rec[SUB] for _k, rec, _p in picked])

    def _wants(self, rec: Rec) -> bool:
        return not (self.no_delete if rec[VALUE] is None else self.no_put)

    def _push(self, batch: WatchBatch) -> None:
        self._queue.append(batch)
        self._queued_events += len(batch.events)
        if self._wake is not None:
            self._wake.set()

    def _end(self, batch: WatchBatch) -> None:
        if self._final is None:
            self._final = batch
            self._hub._forget(self)
            if self._wake is not None:
                self._wake.set()

    def poll(self, max_events: int = 1000, until_rev: int | None = None) -> WatchBatch | None:
        """The next batch if one is ready (queued revisions merged up to ``max_events``).

        With ``until_rev`` (used by a merged watcher to interleave shards in revision
        order) only batches whose revision is at most ``until_rev`` are merged into the
        first one, and progress batches are never merged.
        """
        if not self._queue and not self.synced and self._final is None:
            self._hub._refill(self)
        if self._queue:
            batch = take_batch(self._queue, max_events, until_rev)
            self._queued_events -= len(batch.events)
            if not self._queue and not self.synced and self._final is None:
                self._hub._refill(self)
            return batch
        return self._final

    def peek(self) -> WatchBatch | None:
        """The next queued batch without taking it (replaying history first if none is
        queued); ``None`` when nothing is queued, even if the watch has ended."""
        if not self._queue and not self.synced and self._final is None:
            self._hub._refill(self)
        return self._queue[0] if self._queue else None

    def resume_revision(self) -> int:
        """The lowest revision whose events this watcher has not handed out yet: a watch
        re-created from it misses nothing. After a slow-consumer cancel that is the
        revision the cancel names, after a compaction the compaction revision. Not
        meaningful after :meth:`close` (which drops what was queued)."""
        for b in self._queue:
            if b.events:
                return batch_revision(b)
        if self._final is not None:
            return self._final.compact_revision or self._final.revision
        if self.synced:
            return max(self._hub.progress() + 1, self.min_rev)
        return self.next_rev

    def closed_revision(self) -> int:
        """Every event of this watcher up to this revision is queued or was handed out,
        and none at or below it can come later: its shard's closed revision once it is
        live (:meth:`WatchHub.progress`), the revision it has replayed to before."""
        if self.synced:
            return self._hub.progress()
        return self.next_rev - 1

    def store_revision(self) -> int:
        """Its shard's current revision (the header of a cancel)."""
        return self._hub.store.rev

    def advance(self, revision: int) -> bool:
        """A shard hub's watcher cannot close a revision itself: False, and a merged
        watcher asks the backend to floor its shard (``shardwatch.Advance``)."""
        return False

    def share_wake(self, wake: Wake) -> None:
        """Set ``wake`` whenever this watcher gets a batch or ends, so that one task can
        wait on several watchers at once (``shardwatch.MergedWatcher``, the watch
        stream); ``next_batch`` then waits on an event of its own instead."""
        self._wake = wake
        if self._queue or self._final is not None:
            wake.set()

    async def next_batch(self, max_events: int = 1000) -> WatchBatch:
        """Wait for the next batch; after a cancel, returns the cancel batch again."""
        while True:
            batch = self.poll(max_events)
            if batch is not None:
                return batch
            if not isinstance(self._wake, asyncio.Event):
                self._wake = asyncio.Event()
            self._wake.clear()
            await self._wake.wait()

    def request_progress(self) -> None:
        """Queue a progress notification behind the events already queued; an unsynced
        watcher gets it as soon as its replay has caught up."""
        if self._final is not None:
            return
        if self.synced:
            self._push(WatchBatch(self._hub.progress(), progress=True))
        else:
            self._want_progress = True

    def close(self) -> None:
        """Cancel the watch (client request); its next batch is an empty cancel."""
        self._queue.clear()
        self._queued_events = 0
        self._end(WatchBatch(self._hub.store.rev, canceled=True))


class WatchHub:
    """All watchers of one node over one store."""

    def __init__(self, store: MVCCStore, limits: Limits | None = None) -> None:
        self.store = store
        self.limits = limits or Limits()
        self._next_id = 0
        self._watchers: dict[int, Watcher] = {}
        self._index: WatcherIndex[Watcher] = WatcherIndex()
        self.slow_cancels = 0
        """Watchers cancelled because their buffer overflowed (metrics)."""
        self.held_from = 0
        """The lowest revision an open multi-shard Txn reserved on this shard (0: none):
        from it on, publications are held back by the state machine until it is resolved,
        so history replays stop below it too (``docs/txn.md``)."""

    def __len__(self) -> int:
        return len(self._watchers)

    @property
    def unsynced(self) -> int:
        """Watchers still replaying history (etcd's "slow watchers"); O(watchers)."""
        return sum(1 for w in self._watchers.values() if not w.synced)

    def progress(self) -> int:
        """The closed revision: every event up to it has been published (the current
        revision, or just below an open multi-shard Txn's reserved one)."""
        held = self.held_from
        if held:
            return min(self.store.rev, held - 1)
        return self.store.rev

    def watch(
        self,
        key: bytes,
        range_end: bytes = b"",
        start_revision: int = 0,
        prev_kv: bool = False,
        filters: Iterable[int] = (),
        progress_notify: bool = False,
        buffer_limit: int | None = None,
        tagged: bool = False,
    ) -> Watcher:
        """Create a watcher; ``start_revision`` 0 means "from the next revision"
        (``tagged``: its batches carry the sub-revisions, :attr:`Watcher.tagged`).

        As in etcd an empty key is accepted (with a ``range_end`` it means "from the
        smallest key"); a single empty key simply never matches.
        """
        if len(self._watchers) >= self.limits.max_watchers:
            raise errors.too_many_watchers(self.limits.max_watchers)
        limit = buffer_limit if buffer_limit is not None else self.limits.watch_buffer_events
        if limit <= 0:
            raise errors.bad_request(f"watch buffer_limit must be positive, got {limit}")
        self._next_id += 1
        w = Watcher(self, self._next_id, KeyRange.of(key, range_end), prev_kv, filters,
                    progress_notify, limit)
        w.tagged = tagged
        self._watchers[w.id] = w
        if start_revision <= 0 or start_revision > self.progress():
            w.min_rev = start_revision
            self._sync(w)
        else:
            w.next_rev = start_revision
            self._refill(w)
        return w

    def publish(self, rev: int, changes: list[Change]) -> None:
        """Deliver one committed revision's changes to the synced watchers that match."""
        if not changes or not self._watchers:
            return
        targets: dict[Watcher, list[int]] = {}
        for i, (key, rec, _prev) in enumerate(changes):
            for w in self._index.matching(key):
                if w._wants(rec):
                    targets.setdefault(w, []).append(i)
        shared: dict[tuple[int, bool], kv_pb2.Event] = {}  # one message per change and shape
        for w, picked in targets.items():
            if rev < w.min_rev:
                continue
            events = []
            for i in picked:
                ev = shared.get((i, w.prev_kv))
                if ev is None:
                    key, rec, prev = changes[i]
                    ev = shared[(i, w.prev_kv)] = event_pb(key, rec, prev, w.prev_kv)
                events.append(ev)
            if w._queue and w._queued_events + len(events) > w.buffer_limit:
                self.slow_cancels += 1
                w._end(
                    WatchBatch(
                        rev,
                        canceled=True,
                        cancel_reason=slow_reason(w.buffer_limit, rev),
                    )
                )
                continue
            if w.tagged:
                w._push(WatchBatch(rev, events, subs=[changes[i][1][SUB] for i in picked]))
            else:
                w._push(WatchBatch(rev, events))

    def notify_progress(self) -> int:
        """Queue a progress notification to idle synced watchers that asked for them."""
        n = 0
        for w in self._watchers.values():
            if w.progress_notify and w.synced and not w._queue:
                w._push(WatchBatch(self.progress(), progress=True))
                n += 1
        return n

    def rebind(self, store: MVCCStore, held_from: int = 0) -> None:
        """Switch to a restored store (``held_from``: its lowest open intent's revision):
        every watcher catches up from history."""
        old_next = self.progress() + 1
        self.store = store
        self.held_from = held_from
        for w in list(self._watchers.values()):
            if w.synced:
                self._unsync(w, max(old_next, w.min_rev))
            if not w._queue:
                self._refill(w)

    def close(self) -> None:
        """Cancel every watcher (node shutdown)."""
        for w in list(self._watchers.values()):
            w.close()

    # --- internals -----------------------------------------------------------------------
    def _sync(self, w: Watcher) -> None:
        w.synced = True
        self._index.add(w)
        if w._want_progress:
            w._want_progress = False
            w._push(WatchBatch(self.progress(), progress=True))

    def _unsync(self, w: Watcher, next_rev: int) -> None:
        self._detach(w)
        w.synced = False
        w.next_rev = next_rev

    def _detach(self, w: Watcher) -> None:
        self._index.discard(w)

    def _forget(self, w: Watcher) -> None:
        self._detach(w)
        self._watchers.pop(w.id, None)

    def _refill(self, w: Watcher) -> None:
        """Replay history into an unsynced watcher's buffer; sync it once caught up."""
        store = self.store
        if w.next_rev < store.compact_rev:
            w._queue.clear()
            w._queued_events = 0
            w._end(WatchBatch(0, compact_revision=store.compact_rev, canceled=True))
            return
        space = max(1, w.buffer_limit - w._queued_events)
        closed = self.progress()
        while True:
            chunks, next_rev = store.changes_since(w.next_rev, w.kr, space, closed)
            for _rev, changes in chunks:
                batch = w._batch(closed, changes)
                if batch is not None:
                    w._push(batch)
                    space -= len(batch.events)
            w.next_rev = next_rev
            if next_rev > closed:
                self._sync(w)
                return
            if space <= 0 or w._queue:
                return
