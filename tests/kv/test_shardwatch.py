"""The sharded watch hub: merged watchers over real shard state machines.

Each test builds 2-4 real :class:`KVStateMachine` shards, applies real commands (a
revision floor is simulated with ``min_revision``) and watches through a
:class:`ShardedWatchHub` over their hubs.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.proto import kv_pb2
from accord.proto import rpc_pb2 as pb
from accord.services.kv.backend import Backend, HeaderInfo
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.shardwatch import MergedWatcher, ShardedWatchHub
from accord.services.kv.statemachine import KVStateMachine as SM
from accord.services.kv.watchhub import WatchBatch, Watcher
from accord.services.kv.watchstream import WatchStream

PUT, DELETE = kv_pb2.Event.PUT, kv_pb2.Event.DELETE
KEYS = [b"k%d" % i for i in range(8)]
ALL = (b"\x00", b"\x00")
RESUME = re.compile(rb"re-create the watch from revision (\d+)")

Ev = tuple[bytes, int, int]  # key, type, mod_revision


class Cluster:
    """``n`` shard state machines; a key's shard is its last byte mod ``n`` (``k0`` on
    shard 0, ``k1`` on shard 1, ...)."""

    def __init__(self, n: int, limits: Limits | None = None) -> None:
        self.sms = [SM(limits=limits) for _ in range(n)]
        self.hub = ShardedWatchHub([sm.watch_hub for sm in self.sms], self.shards_of_range)
        self.floor = 0
        self.log: list[tuple[int, Ev]] = []
        """Every change applied: (sequence number, event)."""

    def shard(self, key: bytes) -> int:
        return key[-1] % len(self.sms)

    def shards_of_range(self, key: bytes, range_end: bytes) -> list[int]:
        return [self.shard(key)] if not range_end else list(range(len(self.sms)))

    def put(self, key: bytes, value: bytes = b"v") -> int:
        resp = self.sms[self.shard(key)].apply(
            SM.encode_put(pb.PutRequest(key=key, value=value), min_revision=self.floor + 1)
        )
        assert isinstance(resp, pb.PutResponse)
        self.log.append((len(self.log), (key, PUT, resp.header.revision)))
        return resp.header.revision

    def delete(self, key: bytes) -> int | None:
        resp = self.sms[self.shard(key)].apply(
            SM.encode_delete_range(pb.DeleteRangeRequest(key=key), min_revision=self.floor + 1)
        )
        assert isinstance(resp, pb.DeleteRangeResponse)
        if not resp.deleted:
            return None
        self.log.append((len(self.log), (key, DELETE, resp.header.revision)))
        return resp.header.revision

    def raise_floor(self) -> int:
        """A cross-shard read: later writes on every shard get a higher revision."""
        self.floor = max(self.floor, max(sm.revision for sm in self.sms))
        return self.floor

    def compact(self, shard: int, rev: int) -> None:
        self.sms[shard].apply(SM.encode_compact(pb.CompactionRequest(revision=rev)))

    def lens(self) -> list[int]:
        return [len(sm.watch_hub) for sm in self.sms]


def evs(batches: list[WatchBatch]) -> list[Ev]:
    return [(e.kv.key, e.type, e.kv.mod_revision) for b in batches for e in b.events]


def drain(w: Watcher | MergedWatcher, max_events: int = 1000) -> list[WatchBatch]:
    out: list[WatchBatch] = []
    for _ in range(10_000):
        b = w.poll(max_events)
        if b is None:
            return out
        out.append(b)
        if b.canceled:
            return out
    raise AssertionError("watcher never ran dry")


# --- property: exactly once, per-key order, resume after a slow-consumer cancel ----------


@dataclass
class Watch:
    w: Watcher | MergedWatcher
    key: bytes
    end: bytes
    start: int
    created: int
    got: list[WatchBatch] = field(default_factory=list)

    def expected(self, c: Cluster) -> list[Ev]:
        def inside(k: bytes) -> bool:
            return k == self.key if not self.end else self.key <= k  # ranges here are "all"

        return [
            ev for seq, ev in c.log
            if inside(ev[0]) and (ev[2] >= self.start if self.start > 0 else seq >= self.created)
        ]


OPS = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 7)),
    st.tuples(st.just("del"), st.integers(0, 7)),
    st.tuples(st.just("floor")),
    st.tuples(st.just("watch"), st.sampled_from(["all", "key"]), st.integers(-1, 30),
              st.sampled_from([2, 3, 1000])),
    st.tuples(st.just("poll"), st.integers(0, 7), st.sampled_from([1, 2, 1000])),
)


@given(n=st.integers(2, 4), ops=st.lists(OPS, max_size=45))
def test_every_change_after_the_start_is_delivered_exactly_once(
    n: int, ops: list[tuple[Any, ...]]
) -> None:
    c = Cluster(n)
    watches: list[Watch] = []
    for op in ops:
        if op[0] == "put":
            c.put(KEYS[op[1]])
        elif op[0] == "del":
            c.delete(KEYS[op[1]])
        elif op[0] == "floor":
            c.raise_floor()
        elif op[0] == "watch":
            _, kind, start, limit = op
            key, end = (KEYS[3], b"") if kind == "key" else ALL
            # -1: from now; else a revision that may be past on some shards, future on others
            s = 0 if start == -1 else start + 1
            w = c.hub.watch(key, end, start_revision=s, buffer_limit=limit)
            assert isinstance(w, Watcher) == (kind == "key")
            watches.append(Watch(w, key, end, s, len(c.log)))
        elif op[0] == "poll" and watches:
            wa = watches[op[1] % len(watches)]
            b = wa.w.poll(op[2])
            if b is not None:
                wa.got.append(b)
    for wa in watches:
        if not (wa.got and wa.got[-1].canceled):
            wa.got += drain(wa.w)
        got, want = evs(wa.got), wa.expected(c)
        assert len(set(got)) == len(got), "an event was delivered twice"
        for b in wa.got:
            revs = [e.kv.mod_revision for e in b.events]
            assert revs == sorted(revs), "a batch mixes revisions out of order"
        for k in KEYS:  # per-key order is the commit order
            mine = [e for e in got if e[0] == k]
            assert mine == [e for e in want if e[0] == k][: len(mine)]
        last = wa.got[-1] if wa.got else None
        if last is not None and last.canceled:
            m = RESUME.search(last.cancel_reason.encode())
            assert m is not None, last.cancel_reason
            resume = int(m.group(1))
            assert set(got) <= set(want)
            assert [e for e in want if e[2] < resume and e not in set(got)] == []
        else:
            assert sorted(got) == sorted(want)
        wa.w.close()
    assert len(c.hub) == 0 and c.lens() == [0] * n


# --- shape --------------------------------------------------------------------------------


def test_single_shard_range_is_the_shards_own_watcher() -> None:
    c = Cluster(3)
    w = c.hub.watch(b"k1", prev_kv=True)
    assert type(w) is Watcher
    lens = c.lens()
    assert lens[c.shard(b"k1")] == 1 and sum(lens) == 1 and len(c.hub) == 1
    c.put(b"k1")
    assert [e[0] for e in evs(drain(w))] == [b"k1"]
    m = c.hub.watch(*ALL)
    assert isinstance(m, MergedWatcher) and c.lens() == [x + 1 for x in lens]
    assert len(c.hub) == 2


def test_ready_batches_go_lowest_revision_first_and_keep_header_revisions() -> None:
    c = Cluster(2)
    k0, k1 = b"k0", b"k1"  # shards 0 and 1
    assert (c.shard(k0), c.shard(k1)) == (0, 1)
    c.put(k0)  # shard 0 @2
    c.put(k0)  # shard 0 @3
    c.raise_floor()
    c.put(k1)  # shard 1 @4
    c.raise_floor()
    c.put(k0)  # shard 0 @5
    c.raise_floor()
    c.put(k1)  # shard 1 @6
    m = c.hub.watch(*ALL, start_revision=2)
    batches = drain(m)
    assert [[e.kv.mod_revision for e in b.events] for b in batches] == [[2, 3], [4], [5], [6]]
    # a replayed batch's header is its shard's revision when it was replayed
    assert [b.revision for b in batches] == [5, 6, 5, 6]
    c.put(k1)  # live: shard 1 @7
    c.put(k0)  # live: shard 0 @6
    live = drain(m)
    assert [(b.revision, evs([b])) for b in live] == [(6, [(k0, PUT, 6)]), (7, [(k1, PUT, 7)])]


def test_bad_shards_of_range_and_bad_options_change_nothing() -> None:
    c = Cluster(2)
    bad = ShardedWatchHub([sm.watch_hub for sm in c.sms], lambda k, e: [0, 5])
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        bad.watch(*ALL)
    empty = ShardedWatchHub([sm.watch_hub for sm in c.sms], lambda k, e: [])
    with pytest.raises(ValueError, match="no shard"):
        empty.watch(*ALL)
    with pytest.raises(EtcdError, match="buffer_limit must be positive"):
        c.hub.watch(*ALL, buffer_limit=0)
    with pytest.raises(ValueError, match="at least one shard"):
        ShardedWatchHub([], c.shards_of_range)
    assert c.lens() == [0, 0]


def test_watcher_limit_counts_a_merged_watcher_once_per_shard_all_or_nothing() -> None:
    c = Cluster(2, Limits(max_watchers=2))
    c.hub.watch(b"k1")
    m = c.hub.watch(*ALL)
    assert c.lens() == [1, 2]
    with pytest.raises(EtcdError, match="too many watchers"):
        c.hub.watch(*ALL)  # shard 0 accepts, shard 1 refuses
    assert c.lens() == [1, 2]  # shard 0's new sub-watcher was not left behind
    m.close()
    assert c.lens() == [0, 1]
    c.hub.watch(*ALL)
    assert c.lens() == [1, 2]


# --- progress -----------------------------------------------------------------------------


def test_progress_is_the_minimum_over_shards_and_follows_queued_events() -> None:
    c = Cluster(3)
    for _ in range(4):
        c.put(b"k0")  # shard 0 -> 5
    c.put(b"k1")  # shard 1 -> 2
    assert [sm.revision for sm in c.sms] == [5, 2, 1]
    assert c.hub.progress() == 1
    m = c.hub.watch(*ALL, start_revision=2)
    m.request_progress()
    out = drain(m)
    assert [b.progress for b in out] == [False, False, False, True]
    assert [e[2] for e in evs(out)] == [2, 2, 3, 4, 5] and out[-1].revision == 1
    c.put(b"k2")  # shard 2 -> 2
    assert c.hub.progress() == 2
    m.request_progress()
    assert [(b.progress, b.revision) for b in drain(m)] == [(False, 2), (True, 2)]


def test_progress_waits_for_an_unsynced_shard_and_a_request_during_a_round_runs_again() -> None:
    c = Cluster(2)
    for _ in range(6):
        c.put(b"k1")  # shard 1 -> 7
    c.put(b"k0")  # shard 0 -> 2
    m = c.hub.watch(*ALL, start_revision=2, buffer_limit=2)  # shard 1 replays 2 at a time
    assert not m.synced
    m.request_progress()
    m.request_progress()  # arrives while the first round is in flight
    out = drain(m, max_events=1)
    kinds = [("P", b.revision) if b.progress else ("E", evs([b])[0][2]) for b in out]
    # all 7 events first (shard 1 answers only once its replay caught up), then the round's
    # answer (min of 2 and 7), then the second round's
    assert kinds[:7] == [("E", 2), ("E", 2), ("E", 3), ("E", 4), ("E", 5), ("E", 6), ("E", 7)]
    assert kinds[7:] == [("P", 2), ("P", 2)]
    assert m.synced


def test_notify_progress_reaches_idle_merged_watchers_only() -> None:
    c = Cluster(2)
    c.put(b"k0")
    quiet = c.hub.watch(*ALL, progress_notify=True)
    busy = c.hub.watch(*ALL, progress_notify=True)
    deaf = c.hub.watch(*ALL)
    single = c.hub.watch(b"k0", progress_notify=True)
    c.put(b"k1")
    assert [b.progress for b in drain(quiet)] == [False]
    assert c.hub.notify_progress() == 2  # quiet and single; busy has an event queued
    assert [(b.progress, b.revision) for b in drain(quiet)] == [(True, 2)]
    assert [(b.progress, b.revision) for b in drain(single)] == [(True, 2)]
    assert [b.progress for b in drain(busy)] == [False]
    assert drain(deaf)[0].progress is False and drain(deaf) == []


# --- cancels and cleanup ------------------------------------------------------------------


def test_compaction_of_one_shard_cancels_the_merged_watcher_and_closes_the_others() -> None:
    c = Cluster(3)
    for _ in range(5):
        c.put(b"k1")  # shard 1 -> 6
        c.put(b"k0")  # shard 0 -> 6
    c.compact(1, 4)
    m = c.hub.watch(*ALL, start_revision=2)
    assert m.canceled
    (b,) = drain(m)
    assert b.canceled and b.compact_revision == 4 and b.revision == 0 and not b.events
    assert m.poll() is b
    assert c.lens() == [0, 0, 0] and len(c.hub) == 0


def test_compaction_during_replay_cancels_after_what_was_delivered() -> None:
    c = Cluster(2)
    for _ in range(6):
        c.put(b"k0")  # shard 0 -> 7
    c.put(b"k1")  # shard 1 -> 2
    m = c.hub.watch(*ALL, start_revision=2, buffer_limit=2)
    first = [m.poll(1), m.poll(1)]
    c.compact(0, 6)
    rest = drain(m)
    assert evs([b for b in first if b is not None]) == [(b"k0", PUT, 2), (b"k1", PUT, 2)]
    assert evs(rest) == [(b"k0", PUT, 3)]
    assert rest[-1].canceled and rest[-1].compact_revision == 6
    assert c.lens() == [0, 0]


def test_slow_consumer_on_one_shard_cancels_with_the_lowest_undelivered_revision() -> None:
    c = Cluster(2)
    m = c.hub.watch(*ALL, buffer_limit=2)
    c.put(b"k1")  # shard 1 @2
    c.raise_floor()
    for _ in range(3):
        c.put(b"k0")  # shard 0 @3, @4, then @5 overflows the buffer of 2
    assert m.canceled and c.lens() == [0, 1]
    out = drain(m)
    assert evs(out[:-1]) == [(b"k1", PUT, 2), (b"k0", PUT, 3), (b"k0", PUT, 4)]
    final = out[-1]
    assert final.canceled and final.revision == 5
    # shard 1 is at 2: with no floor since, its next write may get revision 3, which a
    # watch re-created from 5 would miss
    assert "re-create the watch from revision 3" in final.cancel_reason
    assert c.lens() == [0, 0] and len(c.hub) == 0
    c.put(b"k1")  # shard 1 @3
    again = drain(c.hub.watch(*ALL, start_revision=3))
    assert (b"k1", PUT, 3) in evs(again) and (b"k0", PUT, 5) in evs(again)


def test_shutdown_of_one_shard_hub_cancels_the_merged_watcher() -> None:
    c = Cluster(2)
    m = c.hub.watch(*ALL)
    c.sms[1].watch_hub.close()
    (b,) = drain(m)
    assert b.canceled and not b.cancel_reason and not b.compact_revision
    assert c.lens() == [0, 0]


def test_close_cleans_up_every_sub_watcher() -> None:
    c = Cluster(4)
    c.put(b"k0")
    m = c.hub.watch(*ALL, start_revision=1)
    assert c.lens() == [1, 1, 1, 1] and len(c.hub) == 1
    m.close()
    assert c.lens() == [0, 0, 0, 0] and len(c.hub) == 0
    (b,) = drain(m)
    assert b.canceled and not b.events
    m.request_progress()  # after close: a no-op, not an error
    ws = [c.hub.watch(*ALL), c.hub.watch(b"k2"), c.hub.watch(*ALL, start_revision=1)]
    assert len(c.hub) == 3
    c.hub.close()
    assert all(w.canceled for w in ws) and c.lens() == [0, 0, 0, 0] and len(c.hub) == 0


# --- waiting --------------------------------------------------------------------------------


async def test_next_batch_wakes_on_any_shard_without_a_task_per_shard() -> None:
    c = Cluster(3)
    m = c.hub.watch(*ALL)
    before = asyncio.all_tasks()
    waiter = asyncio.create_task(m.next_batch())
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == {waiter}
    assert not waiter.done()
    c.put(b"k2")  # shard 2 only
    b = await asyncio.wait_for(waiter, 5)
    assert evs([b]) == [(b"k2", PUT, 2)]
    waiter = asyncio.create_task(m.next_batch())
    await asyncio.sleep(0)
    c.put(b"k1")
    b = await asyncio.wait_for(waiter, 5)
    assert evs([b]) == [(b"k1", PUT, 2)]
    waiter = asyncio.create_task(m.next_batch())
    await asyncio.sleep(0)
    c.sms[0].watch_hub.close()  # a cancel wakes it too
    final = await asyncio.wait_for(waiter, 5)
    assert final.canceled and c.lens() == [0, 0, 0]


# --- the small Watcher additions the merged watcher relies on --------------------------------


def test_watcher_resume_revision_peek_and_until_rev() -> None:
    c = Cluster(2)
    for _ in range(5):
        c.put(b"k0")  # shard 0 -> 6
    hub0 = c.sms[0].watch_hub
    w = hub0.watch(*ALL, start_revision=2, buffer_limit=2)
    assert not w.synced and w.resume_revision() == 2
    head = w.peek()
    assert head is not None and evs([head]) == [(b"k0", PUT, 2)] and head.revision == 6
    assert w.peek() is head  # peeking takes nothing
    b = w.poll(1000, until_rev=2)  # the batch at 3 is not merged in
    assert b is not None and [e[2] for e in evs([b])] == [2]
    assert w.resume_revision() == 3  # a replayed batch's header (6) is not its revision
    assert [e[2] for e in evs(drain(w))] == [3, 4, 5, 6]
    assert w.synced and w.resume_revision() == 7
    future = hub0.watch(*ALL, start_revision=10)
    assert future.resume_revision() == 10
    c.put(b"k0")  # 7
    c.put(b"k0")  # 8
    both = w.poll(1000)  # without until_rev queued revisions merge as before
    assert both is not None and [e[2] for e in evs([both])] == [7, 8]
    w.request_progress()
    w.request_progress()
    first = w.poll(1000, until_rev=100)  # progress batches are never merged
    assert first is not None and first.progress and w.poll(1000) is not None


# --- through the Watch servicer's stream ---------------------------------------------------


class _Backend:
    """Just what ``WatchStream`` reads from a backend."""

    def __init__(self, hub: ShardedWatchHub) -> None:
        self.watch_hub = hub

    def header_info(self) -> HeaderInfo:
        return HeaderInfo(cluster_id=1, member_id=1, raft_term=1, leader=1)

    @property
    def revision(self) -> int:
        return self.watch_hub.progress()

    def latest_revision(self) -> int:
        return self.watch_hub.progress()

    async def settle(self, revision: int) -> None:
        return None  # one clock: no commit-wait


async def test_watch_stream_serves_a_merged_watcher() -> None:
    c = Cluster(3)
    for i in range(6):
        c.put(KEYS[i % 3])
        c.raise_floor()
    assert [sm.revision for sm in c.sms] == [5, 6, 7]
    stream = WatchStream(cast(Backend, _Backend(c.hub)), max_response_bytes=1 << 20,
                         require_leader=False)
    requests: asyncio.Queue[pb.WatchRequest | None] = asyncio.Queue()

    async def feed() -> AsyncIterator[pb.WatchRequest]:
        while (req := await requests.get()) is not None:
            yield req

    out = stream.run(feed()).__aiter__()

    async def read() -> pb.WatchResponse:
        return pb.WatchResponse.FromString(await asyncio.wait_for(out.__anext__(), 5))

    try:
        requests.put_nowait(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=b"\x00", range_end=b"\x00", start_revision=3)))
        created = await read()
        assert created.created and created.header.revision == 5  # the minimum shard
        requests.put_nowait(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
        got: list[int] = []
        while True:
            resp = await read()
            if resp.watch_id == -1:
                break
            got += [e.kv.mod_revision for e in resp.events]
        assert got == [3, 4, 5, 6, 7] and resp.header.revision == 5
        c.put(b"k2")  # shard 2 @8 (the floor is 7)
        live = await read()
        assert [(e.kv.key, e.kv.mod_revision) for e in live.events] == [(b"k2", 8)]
        assert live.header.revision == 8
        requests.put_nowait(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(
            watch_id=created.watch_id)))
        assert (await read()).canceled
        assert c.lens() == [0, 0, 0] and len(c.hub) == 0
    finally:
        await stream.close()
