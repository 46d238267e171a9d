"""A watch hub over many shards: one watch, one stream of batches, whatever the shards.

When the key space is split over N shards (Raft groups), each shard's
:class:`~accord.services.kv.statemachine.KVStateMachine` has its own
:class:`~accord.services.kv.watchhub.WatchHub`. :class:`ShardedWatchHub` puts them behind
the surface the Watch servicer uses on a single hub:

* a watch whose range lives on one shard (``shards_of_range`` says so) is that shard's
  own :class:`~accord.services.kv.watchhub.Watcher`, with no overhead at all;
* any other watch is a :class:`MergedWatcher` over one sub-watcher per shard.

On a worker of a node of several (:attr:`ShardedWatchHub.remote` set) a shard another
worker hosts is watched there: its sub-watcher is a :class:`SubWatcher` fed by that
worker (``accord/node/workerwatch.py``), and a watch of such a shard alone is a merged
watcher of one, so that it too is released up to that shard's closed revision.

Why this is correct: revisions are comparable across shards. Each shard's counter only
grows, and a cross-shard read at revision R first raises every shard's counter to at
least R (the *revision floor*), so no shard ever produces an event at a revision <= R
after that read. Hence a start revision can be handed to every shard unchanged, and a
revision that *every* shard has passed is one below which nothing can ever appear.

The rule for start revisions: a watch from S misses nothing committed after it was
created only if S - 1 is *closed*, i.e. every shard of its range has passed S - 1. A
revision taken from one shard's write is not: another shard whose counter is still
below S can commit a later change below S, and no sub-watcher delivers it (it is before
the start). So a client reads the range (linearizable) before it creates such a watch,
and starts at most one past that read's revision, as ``accord/client/watch.py`` does
and as etcd's list-then-watch pattern does anyway. A progress revision is always
closed (every shard of the member had closed it: ``WatchHub.progress``), so resuming
from one + 1 is safe.
The hub does not floor on its own: creating a watch is local and needs no quorum.

Ordered mode (the backends' hubs: an ``advance`` callback given): a merged watcher
delivers strictly in revision order, every event of one revision in one batch, released
only up to the lowest closed revision of its shards (``SubWatcher.closed_revision``); an idle
shard behind is asked to advance (the backend floors it) and the watchers are woken when
it has. The header revision of such a batch is that closed revision. The events of one
revision from several shards (a multi-shard Txn, a lease revoke) come in the Txn's
operation order, as one etcd gives them: the sub-watchers are *tagged* (their batches
carry each event's sub-revision, which a multi-shard Txn's share sets to its operation's
place in the whole Txn) and the merge sorts such a revision by sub-revision, then key (a
DeleteRange's keys, as etcd deletes them). ``docs/txn.md``, "Watches over several
shards". Without ``advance`` (a hub over shards nobody floors) the per-batch rules below
apply.

Rules of a merged watcher (per-batch mode):

* Each shard's events keep their order. Among the batches ready at once the lowest
  revision goes first: the sub-watcher with the lowest head is taken, merging its queued
  revisions only up to the next-lowest head of another shard. Every change after the start
  revision is delivered exactly once (each shard's own watcher guarantees that for its
  keys, and the merged watcher takes each of their batches exactly once). Revisions are
  *not* globally sorted across batches that become ready at different times: a lagging
  shard may deliver revision 11 after another shard delivered 100.
* A batch's header revision is that batch's own (its shard's).
* Progress: a merged progress notification is produced only once every sub-watcher has
  produced one for the same request, with the **minimum** of their revisions. Each
  sub-watcher's notification says "every event of mine <= my revision was delivered"; only
  the minimum is true of all of them at once, so only it keeps the promise "every event
  <= revision was delivered" for the merged watch. For the same reason
  :meth:`ShardedWatchHub.progress` is the minimum over the shard hubs. At most one
  request is in flight per sub-watcher; requests made meanwhile are folded into one
  follow-up round, which starts after the current one completes (so a request is always
  answered by a round that started after it).
* A cancel of any sub-watcher (compaction, slow consumer, node shutdown) cancels the
  merged watcher and closes the others. A compaction cancel carries that shard's
  ``compact_revision``. A slow-consumer cancel names the revision to re-create the watch
  from: the lowest revision that some sub-watcher has not handed out yet (the shard that
  overflowed may be ahead of the others; re-creating from its revision would lose events
  still queued on a slower shard). Re-creating from it can repeat events of the faster
  shards, never lose one.
* Waiting: :meth:`MergedWatcher.next_batch` waits on one :class:`asyncio.Event` shared by
  all its sub-watchers (:meth:`Watcher.share_wake`), so no task per sub-watcher.
* Memory: a merged watcher buffers nothing of its own beyond one progress revision per
  sub-watcher; each sub-watcher keeps its own bound (``buffer_limit`` events), so a merged
  watcher over k shards holds at most k times that.
* Watcher limit: each shard hub enforces its ``limits.max_watchers`` on its own watchers,
  so a merged watcher over k shards takes one slot on each of those k shards (that is
  where the memory is). Creation is all or nothing: if one shard refuses, the
  sub-watchers already made are closed and the error is raised.

Watcher ids: a merged watcher's id comes from this hub's own counter; a passthrough
watcher keeps its shard's id. Ids are therefore unique per hub, not across shards; the
Watch servicer assigns the ids clients see and does not use these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from accord.services.kv.errors import EtcdError
from accord.services.kv.watchhub import (
    SLOW_PREFIX,
    Wake,
    WatchBatch,
    Watcher,
    WatchHub,
    batch_revision,
    slow_reason,
)

ShardsOfRange = Callable[[bytes, bytes], list[int]]
Advance = Callable[[list[int], int], None]
"""``advance(shards, revision)``: have the given shards' closed revisions reach
``revision`` (a backend proposes revision floors there) and wake the merged watchers
once they did; called by an ordered merged watcher whose events wait on idle shards."""
Floor = Callable[[list[int], int], Awaitable[None]]
"""``await floor(shards, revision)``: the shards raised to ``revision`` through their logs
and applied here (``StateMachineBackend.floor``); raises ``EtcdError`` without a quorum."""


class SubWatcher(Protocol):
    """What a merged watcher needs of each of its parts: a shard hub's own
    :class:`~accord.services.kv.watchhub.Watcher`, or a watcher of a shard another worker
    process of the node hosts (``accord/node/workerwatch.py``)."""

    buffer_limit: int

    @property
    def synced(self) -> bool:
        """Whether it has replayed its history and is live."""

    @property
    def canceled(self) -> bool:
        """Whether it has ended (its last batch may still be queued)."""

    def peek(self) -> WatchBatch | None:
        """The next queued batch without taking it."""

    def poll(self, max_events: int = 1000, until_rev: int | None = None) -> WatchBatch | None:
        """The next batch (``Watcher.poll``'s merging rules)."""

    def closed_revision(self) -> int:
        """Every event up to it is queued or was handed out; none at or below can come."""

    def store_revision(self) -> int:
        """Its shard's current revision, as far as it knows."""

    def resume_revision(self) -> int:
        """The lowest revision whose events it has not handed out yet."""

    def share_wake(self, wake: Wake) -> None:
        """Set ``wake`` whenever it gets something or ends."""

    def request_progress(self) -> None:
        """Queue a progress batch behind what is queued."""

    def advance(self, revision: int) -> bool:
        """Have its shard close ``revision`` itself (False: ask the backend)."""

    def close(self) -> None:
        """Cancel it."""


class RemoteShards(Protocol):
    """The shards of a node's key space that another worker process hosts
    (``docs/workers.md``): their watchers are made there and fed here."""

    def hosts(self, shard: int) -> bool:
        """Whether ``shard`` is hosted by this process (False: by another worker)."""

    def watch(self, shard: int, key: bytes, range_end: bytes, start_revision: int,
              prev_kv: bool, filters: list[int], buffer_limit: int | None) -> SubWatcher:
        """A tagged sub-watcher of ``shard``, made on its worker (raises its refusal)."""

    def closed(self, shard: int) -> int | None:
        """The closed revision of ``shard`` last heard from its worker (None: never)."""

    async def floor(self, shards: list[int], revision: int) -> None:
        """Have the workers hosting ``shards`` floor them at ``revision`` and note their
        closed revisions after it (best effort: a worker that does not answer is left
        as last heard)."""


class MergedWatcher:
    """One watch spread over several shards; see the module docstring for its rules."""

    broken_shard_order = False
    """A deliberately broken variant for tests (the behaviour before the sub-revision
    order): one revision's events from several shards in shard order, not the Txn's
    operation order. Never set outside tests."""

    __slots__ = (
        "_advance",
        "_again",
        "_final",
        "_got",
        "_on_end",
        "_round",
        "_shards",
        "_subs",
        "_wake",
        "buffer_limit",
        "id",
        "progress_notify",
    )

    def __init__(
        self,
        wid: int,
        subs: Sequence[SubWatcher],
        progress_notify: bool,
        on_end: Callable[[MergedWatcher], None],
        advance: Advance | None = None,
        shards: Sequence[int] = (),
    ) -> None:
        if not subs:
            raise ValueError("a merged watcher needs at least one sub-watcher")
        self.id = wid
        self._subs = list(subs)
        self.progress_notify = progress_notify
        self.buffer_limit = subs[0].buffer_limit
        self._on_end = on_end
        self._advance = advance
        """Given: the *ordered* merge (strictly by revision, one revision never split,
        released up to every shard's closed revision); None: the per-batch merge."""
        self._shards = list(shards) if shards else list(range(len(self._subs)))
        self._final: WatchBatch | None = None
        self._round = False
        """A progress round is in flight: every sub-watcher was asked once."""
        self._again = False
        """A progress request arrived during the round: run another one after it."""
        self._got: list[int | None] = [None] * len(self._subs)
        """Per sub-watcher: the revision of its answer to the current round."""
        self._wake: Wake = asyncio.Event()
        for s in self._subs:
            s.share_wake(self._wake)

    # --- state ----------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        """Whether every sub-watcher has replayed its history and is live."""
        return all(s.synced for s in self._subs)

    @property
    def canceled(self) -> bool:
        """Whether the watch has ended (or will end at the next poll: a sub-watcher has)."""
        return self._final is not None or any(s.canceled for s in self._subs)

    @property
    def idle(self) -> bool:
        """Live, synced, nothing queued and no progress round in flight."""
        return (
            self._final is None
            and not self._round
            and all(s.synced and not s.canceled and s.peek() is None for s in self._subs)
        )

    def open_subs(self) -> int:
        """How many sub-watchers are still registered with this process's shard hubs (a
        sub-watcher of another worker's shard is registered there)."""
        return sum(1 for s in self._subs if isinstance(s, Watcher) and not s.canceled)

    # --- delivery -------------------------------------------------------------------------
    def poll(self, max_events: int = 1000) -> WatchBatch | None:
        """The next batch if one is ready: the lowest-revision head among the shards, a
        completed progress round, or the final cancel (returned again on every call)."""
        if self._final is not None:
            return self._final
        while True:
            best = -1
            best_rev = 0
            second: int | None = None  # lowest head revision of the other shards
            took_progress = False
            for i, s in enumerate(self._subs):
                head = s.peek()
                if s.canceled and head is None:
                    return self._finish(i)
                if head is None:
                    continue
                if head.progress:
                    s.poll(max_events, until_rev=0)  # exactly this one batch
                    took_progress = True
                    done = self._answered(i, head.revision)
                    if done is not None:
                        return done
                    continue
                rev = batch_revision(head)
                if best < 0 or rev < best_rev:
                    if best >= 0:
                        second = best_rev
                    best, best_rev = i, rev
                elif second is None or rev < second:
                    second = rev
            if best >= 0:
                if self._advance is not None:
                    got = self._ordered(best_rev, max_events)
                    if got is not None or not any(
                            (h := s.peek()) is not None and h.progress for s in self._subs):
                        return got
                    continue  # a progress answer came to a head: take it first
                return self._subs[best].poll(max_events, until_rev=second)
            if not took_progress:
                return None

    def _ordered(self, low: int, max_events: int) -> WatchBatch | None:
        """The ordered merge: the events of every revision from ``low`` (the lowest queued)
        up to the closed revision of all shards, each revision whole, in one batch (whole
        revisions up to ``max_events``, at least one); None while ``low`` is not closed
        on some shard (those are asked to advance)."""
        closed = [s.closed_revision() for s in self._subs]
        top = min(closed)
        if events_waiting := [batch_revision(h) for s in self._subs
                              if (h := s.peek()) is not None and not h.progress]:
            low = min(low, *events_waiting)
        if low > top:
            if self._advance is not None:  # (the backend asks each shard once per revision)
                # Up to the highest closed revision: what is queued goes in one round.
                want = max(max(closed), low)
                behind = [i for i, c in enumerate(closed) if c < want]
                asked = [self._shards[i] for i in behind if not self._subs[i].advance(want)]
                if asked:
                    self._advance(asked, want)
            return None
        events: list[Any] = []
        while True:
            peeked = [s.peek() for s in self._subs]
            if any(h is not None and h.progress for h in peeked):
                break  # a progress answer first: the events behind it are not visible
            heads = [(batch_revision(h), i) for i, h in enumerate(peeked) if h is not None]
            if not heads:
                break
            rev = min(r for r, _i in heads)
            if rev > top:
                break
            take = [i for r, i in heads if r == rev]
            size = sum(_events_at(self._subs[i].peek(), rev) for i in take)
            if events and len(events) + size > max_events:
                break
            if len(take) == 1:
                got = self._subs[take[0]].poll(1 << 30, until_rev=rev)
                if got is not None:
                    events.extend(got.events)
                continue
            events.extend(self._in_txn_order([self._subs[i].poll(1 << 30, until_rev=rev)
                                              for i in take]))
        return WatchBatch(top, events) if events else None

    def _in_txn_order(self, batches: list[WatchBatch | None]) -> list[Any]:
        """The events of one revision from several shards (a multi-shard Txn, a lease
        revoke), as one etcd delivers them: by sub-revision, which each shard's share set
        to its operation's place in the Txn (``xtxn.run_share``), and by key within one
        operation (a DeleteRange over several shards deletes in key order, as etcd)."""
        tagged: list[tuple[int, bytes, int, Any]] = []
        for b in batches:
            if b is None:
                continue
            subs = b.subs if b.subs is not None else [0] * len(b.events)
            for ev, sub in zip(b.events, subs, strict=True):
                tagged.append((sub, ev.kv.key, len(tagged), ev))
        if not self.broken_shard_order:
            tagged.sort(key=lambda t: t[:3])
        return [t[3] for t in tagged]

    def share_wake(self, wake: Wake) -> None:
        """Set ``wake`` whenever any sub-watcher gets something or the watch ends (the
        watch stream's ready list); ``next_batch`` then waits on an event of its own."""
        self._wake = wake
        for s in self._subs:
            s.share_wake(wake)
        if self._final is not None:
            wake.set()

    async def next_batch(self, max_events: int = 1000) -> WatchBatch:
        """Wait for the next batch; wakes when any sub-watcher gets something. After a
        cancel, returns the cancel batch again."""
        while True:
            batch = self.poll(max_events)
            if batch is not None:
                return batch
            if not isinstance(self._wake, asyncio.Event):
                self.share_wake(asyncio.Event())
            assert isinstance(self._wake, asyncio.Event)
            self._wake.clear()
            await self._wake.wait()

    def request_progress(self) -> None:
        """Ask every sub-watcher for a progress notification; the merged one (minimum
        revision) is queued once all have answered, behind the events before it."""
        if self._final is not None:
            return
        if self._round:
            self._again = True
            return
        self._round = True
        self._got = [None] * len(self._subs)
        for s in self._subs:
            s.request_progress()

    def close(self) -> None:
        """Cancel the watch (client request): every sub-watcher is closed; the next batch
        is an empty cancel."""
        if self._final is not None:
            return
        rev = min(s.store_revision() for s in self._subs)
        self._end(WatchBatch(rev, canceled=True))

    # --- internals ------------------------------------------------------------------------
    def _answered(self, i: int, revision: int) -> WatchBatch | None:
        """Record sub-watcher ``i``'s progress answer; the merged notification once all
        have answered."""
        if not self._round or self._got[i] is not None:
            return None  # not asked by us (cannot happen: sub-watchers never self-notify)
        self._got[i] = revision
        got = [g for g in self._got if g is not None]
        if len(got) < len(self._subs):
            return None
        self._round = False
        if self._again:
            self._again = False
            self.request_progress()
        return WatchBatch(min(got), progress=True)

    def _finish(self, i: int) -> WatchBatch:
        """Sub-watcher ``i`` ended: end the merged watch with a cancel saying why."""
        sub = self._subs[i]
        cause = sub.poll() or WatchBatch(sub.store_revision(), canceled=True)  # always a cancel
        if cause.compact_revision:
            final = WatchBatch(
                cause.revision,
                compact_revision=cause.compact_revision,
                canceled=True,
                cancel_reason=cause.cancel_reason,
            )
        elif cause.cancel_reason and not cause.cancel_reason.startswith(SLOW_PREFIX):
            final = WatchBatch(cause.revision, canceled=True, cancel_reason=cause.cancel_reason)
        elif cause.cancel_reason:
            resume = min(s.resume_revision() for s in self._subs)
            final = WatchBatch(
                cause.revision, canceled=True, cancel_reason=slow_reason(sub.buffer_limit, resume)
            )
        else:
            final = WatchBatch(cause.revision, canceled=True)
        self._end(final)
        return final

    def _end(self, final: WatchBatch) -> None:
        self._final = final
        for s in self._subs:
            s.close()
        self._round = False
        self._again = False
        self._on_end(self)
        self._wake.set()


AnyWatcher = Watcher | MergedWatcher
"""What :meth:`ShardedWatchHub.watch` returns; both have the surface ``WatchStream`` uses."""


class ShardedWatchHub:
    """The watch hub of a node whose key space is split over shards (one hub each).

    Every shard hub must publish on the event loop that consumes the watchers (as for a
    single :class:`WatchHub`).
    """

    def __init__(self, hubs: Sequence[WatchHub], shards_of_range: ShardsOfRange,
                 advance: Advance | None = None, floor: Floor | None = None) -> None:
        if not hubs:
            raise ValueError("a sharded watch hub needs at least one shard hub")
        self.hubs = list(hubs)
        self._advance = advance
        """Given: merged watchers deliver in revision order (see :data:`Advance`)."""
        self._floor = floor
        """Given: :meth:`close_through` can raise idle shards (see :data:`Floor`)."""
        self._shards_of_range = shards_of_range
        self._next_id = 0
        self._merged: dict[int, MergedWatcher] = {}
        self.remote: RemoteShards | None = None
        """Set on a worker of a node of several (``docs/workers.md``): the shards it does
        not host are watched on their worker; their hubs here are never used."""

    def __len__(self) -> int:
        """Open watches: plain watchers of every shard hub plus merged watchers, a merged
        watcher counting once (its sub-watchers are not counted)."""
        n = sum(len(h) for h in self.hubs)
        for m in self._merged.values():
            n -= m.open_subs()
            if not m.canceled:
                n += 1
        return n

    def progress(self) -> int:
        """The minimum of the shard hubs' revisions: every event up to it was published on
        every shard (a higher revision could still appear on a lagging shard). On a worker
        (:attr:`remote`): over the shards it hosts and the others' closed revisions last
        heard from their workers (a lower bound of theirs now)."""
        remote = self.remote
        if remote is None:
            return min(h.progress() for h in self.hubs)
        known = [h.progress() if remote.hosts(i) else remote.closed(i)
                 for i, h in enumerate(self.hubs)]
        return min(c for c in known if c is not None)

    async def close_through(self, revision: int) -> None:
        """Have :meth:`progress` reach ``revision`` (a revision of the store, e.g. the
        current one): every shard whose closed revision on this member is below it is
        floored there, this process's through :data:`Floor`, another worker's through
        that worker (:meth:`RemoteShards.floor`, which notes their closed revisions: from
        then on :meth:`progress` counts them). A watch stream does this before it
        answers a progress request, so that the answer is the store's current revision,
        as one etcd's is, and not the revision of its idlest shard: a client that read
        at R and then waits for a progress notification at or above R (Kubernetes'
        consistent reads from its watch cache do) would otherwise wait for a write to
        every shard. Raises ``EtcdError`` without a quorum (the progress answered is
        then what the shards have closed). A shard held below an open multi-shard Txn
        (``WatchHub.held_from``) stays held until the Txn is resolved."""
        floor = self._floor
        if floor is None:
            return
        remote = self.remote
        mine: list[int] = []
        theirs: list[int] = []
        for i, h in enumerate(self.hubs):
            if remote is not None and not remote.hosts(i):
                known = remote.closed(i)
                if known is None or known < revision:
                    theirs.append(i)  # (never heard of: heard of from now on)
            elif h.progress() < revision:
                mine.append(i)
        parts: list[Awaitable[None]] = []
        if mine:
            parts.append(floor(mine, revision))
        if theirs and remote is not None:
            parts.append(remote.floor(theirs, revision))
        if parts:
            await asyncio.gather(*parts)
            self.wake()

    def shards(self, key: bytes, range_end: bytes = b"") -> list[int]:
        """The shards a range spans, sorted, checked against the number of shards."""
        picked = sorted(set(self._shards_of_range(key, range_end)))
        if not picked:
            raise ValueError(f"shards_of_range({key!r}, {range_end!r}) returned no shard")
        n = len(self.hubs)
        bad = [i for i in picked if not 0 <= i < n]
        if bad:
            raise ValueError(
                f"shards_of_range({key!r}, {range_end!r}) returned shard indexes {bad} "
                f"outside 0..{n - 1}"
            )
        return picked

    def watch(
        self,
        key: bytes,
        range_end: bytes = b"",
        start_revision: int = 0,
        prev_kv: bool = False,
        filters: Iterable[int] = (),
        progress_notify: bool = False,
        buffer_limit: int | None = None,
    ) -> AnyWatcher:
        """Create a watch (arguments as :meth:`WatchHub.watch`): the shard's own watcher
        if the range lives on one shard hosted here, else a :class:`MergedWatcher` (over
        one shard of another worker: a merged watcher of one). Raises the shard
        hub's error (too many watchers, bad buffer limit) and then creates nothing."""
        picked = self.shards(key, range_end)
        fs = list(filters)
        remote = self.remote
        if len(picked) == 1 and (remote is None or remote.hosts(picked[0])):
            return self.hubs[picked[0]].watch(
                key, range_end, start_revision, prev_kv, fs, progress_notify, buffer_limit
            )
        subs: list[SubWatcher] = []
        # A feed opens on its worker a round trip from now: "from the next revision"
        # there must mean from the revision after the watch's creation here.
        remote_start = start_revision if start_revision > 0 else self.progress() + 1
        try:
            for i in picked:
                # Sub-watchers never notify progress on their own: the merged watcher asks
                # them, so that every answer belongs to one of its rounds.
                # Tagged: one revision's events from several shards (a multi-shard Txn)
                # are put in the Txn's operation order by their sub-revisions.
                if remote is not None and not remote.hosts(i):
                    subs.append(remote.watch(i, key, range_end, remote_start, prev_kv, fs,
                                             buffer_limit))
                    continue
                subs.append(
                    self.hubs[i].watch(key, range_end, start_revision, prev_kv, fs, False,
                                       buffer_limit, tagged=True)
                )
        except BaseException:
            for s in subs:
                s.close()
            raise
        self._next_id += 1
        m = MergedWatcher(self._next_id, subs, progress_notify, self._forget,
                          self._advance, picked)
        self._merged[m.id] = m
        return m

    def notify_progress(self) -> int:
        """Queue a progress notification to idle watchers that asked for them: each shard
        hub's own watchers, and every idle merged watcher (as a round over its shards)."""
        n = sum(h.notify_progress() for h in self.hubs)
        for m in list(self._merged.values()):
            if m.progress_notify and m.idle:
                m.request_progress()
                n += 1
        return n

    def wake(self) -> None:
        """Wake every merged watcher (shards' closed revisions moved: see :data:`Advance`)."""
        for m in list(self._merged.values()):
            m._wake.set()

    def close(self) -> None:
        """Cancel every watcher of every shard (node shutdown)."""
        for m in list(self._merged.values()):
            m.close()
        for h in self.hubs:
            h.close()

    def _forget(self, m: MergedWatcher) -> None:
        self._merged.pop(m.id, None)


async def chase_floor(want: Callable[[], int], floor: Callable[[int], Awaitable[None]],
                      woke: Callable[[], None]) -> None:
    """Floor a shard at the highest revision its merged watchers want (``want()``, which
    may rise while a floor is in flight) until it has caught up, calling ``woke`` after
    each try; no quorum (an ``EtcdError``) ends it after a short pause: the watchers,
    woken then, ask again (the caller forgets the want as this returns, before a woken
    watcher runs). Used by the backend for its own merged watchers and by a worker for
    the feeds other workers' watchers poll."""
    done = 0
    while (wanted := want()) > done:
        try:
            await floor(wanted)
        except EtcdError:
            await asyncio.sleep(0.2)
            return
        finally:
            woke()
        done = wanted


def _events_at(batch: WatchBatch | None, rev: int) -> int:
    """How many events of ``batch`` are at ``rev`` (a replayed batch may hold several)."""
    if batch is None:
        return 0
    return sum(1 for e in batch.events if e.kv.mod_revision == rev)
