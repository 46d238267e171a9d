"""The ordered merged watch (``shardwatch.py``, an ``advance`` given): strictly by
revision, every event of one revision in one batch, never a revision twice, released only
up to every shard's closed revision, resumable from any revision without a gap.

Shards are real state machines in one stripe layout (``revorder.py``); writes carry
ordered stamps from a shared logical clock, and a write may be *in flight*: stamped, then
applied later (as a proposal waits in a shard's log), so a lagging shard can still write
a revision below another shard's latest. The advance callback floors the shards it is
asked to (what the backend does through Raft) when the test lets it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv.shardwatch import MergedWatcher, ShardedWatchHub
from accord.services.kv.statemachine import KVStateMachine as SM
from accord.services.kv.watchhub import WatchBatch

ALL = (b"\x00", b"\x00")


class Store:
    """``n`` striped shards; key ``k<i>`` lives on shard ``i % n``."""

    def __init__(self, n: int, ordered: bool = True) -> None:
        self.n = n
        self.sms = [SM(stripe=(n, i)) for i in range(n)]
        self.asked: list[tuple[list[int], int]] = []
        self.hub = ShardedWatchHub(
            [sm.watch_hub for sm in self.sms],
            lambda k, e: [int(k[1:]) % n] if not e else list(range(n)),
            self.asked_to_advance if ordered else None)
        self.clock = 10
        self.writes: list[tuple[bytes, int]] = []
        """Every applied write: (key, revision)."""

    def asked_to_advance(self, shards: list[int], rev: int) -> None:
        self.asked.append((shards, rev))

    def stamp(self) -> int:
        self.clock += 1
        return -(self.clock * self.n)

    def apply(self, key: bytes, stamp: int) -> int:
        sm = self.sms[int(key[1:]) % self.n]
        r = sm.apply(SM.encode_put(pb.PutRequest(key=key, value=b"v"), min_revision=stamp))
        assert isinstance(r, pb.PutResponse)
        self.writes.append((key, r.header.revision))
        return int(r.header.revision)

    def advance(self) -> None:
        """Do what was asked: floor those shards (the backend's floor proposals)."""
        for shards, rev in self.asked:
            for s in shards:
                self.sms[s].apply(SM.encode_floor(rev))
        self.asked.clear()


def take(w: MergedWatcher) -> list[WatchBatch]:
    out = []
    for _ in range(10_000):
        b = w.poll()
        if b is None:
            return out
        out.append(b)
    raise AssertionError("never ran dry")


def problems(batches: list[WatchBatch]) -> list[str]:
    """Revisions not strictly increasing, one revision split over two batches."""
    out = []
    last = 0
    for b in batches:
        revs = [e.kv.mod_revision for e in b.events]
        if revs != sorted(revs):
            out.append(f"a batch out of order: {revs}")
        if revs and revs[0] <= last:
            out.append(f"revision {revs[0]} after {last}")
        if revs:
            last = revs[-1]
    return out


def test_a_lagging_shards_write_is_delivered_before_a_higher_revision() -> None:
    st_ = Store(2)
    w = st_.hub.watch(*ALL)
    assert isinstance(w, MergedWatcher)
    late = st_.stamp()  # a write to shard 1, stamped now and still in its log
    high = st_.apply(b"k0", st_.stamp())
    assert take(w) == []  # shard 1 has not closed `high`: held back, and asked to advance
    assert st_.asked == [([1], high)]
    low = st_.apply(b"k1", late)
    assert low < high
    st_.advance()
    got = take(w)
    assert [[e.kv.mod_revision for e in b.events] for b in got] == [[low, high]]
    assert problems(got) == []


def test_the_broken_variant_releasing_before_the_closed_revision_is_caught() -> None:
    st_ = Store(2, ordered=False)  # the per-batch merge: releases what is queued
    w = st_.hub.watch(*ALL)
    late = st_.stamp()
    st_.apply(b"k0", st_.stamp())
    first = take(w)
    st_.apply(b"k1", late)
    assert problems(first + take(w)) != []


def test_one_revision_of_a_txn_on_several_shards_comes_in_one_batch() -> None:
    st_ = Store(3)
    w = st_.hub.watch(*ALL, start_revision=1)
    rev = st_.apply(b"k0", st_.stamp())
    # A multi-shard Txn's revision R on shards 1 and 2 (both reserved it, then wrote it).
    r = st_.sms[1].store.striped(rev + 1, 1)
    for s in (1, 2):
        st_.sms[s].apply(SM.encode_put(pb.PutRequest(key=b"k%d" % s, value=b"t"),
                                       min_revision=r))
    st_.advance()
    take(w)
    st_.advance()
    got = take(w)
    batches = [[e.kv.mod_revision for e in b.events] for b in got]
    assert [r, r] in batches or any(b.count(r) == 2 for b in batches)
    assert sum(b.count(r) for b in batches) == 2


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 1 << 30), n=st.integers(2, 4), small=st.booleans())
def test_random_writers_watched_in_order_exactly_once_and_resumed_without_a_gap(
    seed: int, n: int, small: bool
) -> None:
    rnd = random.Random(seed)
    st_ = Store(n)
    w = st_.hub.watch(*ALL, start_revision=1)
    assert isinstance(w, MergedWatcher)
    inflight: list[tuple[bytes, int]] = []
    got: list[WatchBatch] = []
    resumed: MergedWatcher | None = None
    resume_from = 0
    resumed_got: list[WatchBatch] = []
    for _step in range(60):
        x = rnd.random()
        if x < 0.4:
            inflight.append((b"k%d" % rnd.randrange(8), st_.stamp()))
        elif x < 0.7 and inflight:
            st_.apply(*inflight.pop(rnd.randrange(len(inflight))))
        elif x < 0.8:
            st_.advance()
        else:
            got += [b for b in take(w) if not b.progress]
            if resumed is None and got and rnd.random() < 0.5:
                # A client reconnects, resuming after the last revision it saw.
                last = max(e.kv.mod_revision for b in got for e in b.events) if any(
                    b.events for b in got) else 0
                resume_from = last + 1
                resumed = st_.hub.watch(*ALL, start_revision=resume_from)  # type: ignore[assignment]
            if resumed is not None:
                resumed_got += take(resumed)
    for key, stamp in inflight:
        st_.apply(key, stamp)
    for _ in range(5):
        st_.advance()
        got += take(w)
        if resumed is not None:
            resumed_got += take(resumed)
    assert problems(got) == []
    delivered = [(e.kv.key, e.kv.mod_revision) for b in got for e in b.events]
    assert sorted(delivered, key=lambda d: d[1]) == sorted(st_.writes, key=lambda d: d[1])
    assert len({r for _k, r in delivered}) == len(delivered)  # (one write per revision here)
    if resumed is not None:
        assert problems(resumed_got) == []
        again = [(e.kv.key, e.kv.mod_revision) for b in resumed_got for e in b.events]
        assert again == [d for d in delivered if d[1] >= resume_from]


def test_a_merged_watch_without_events_waiting_asks_nothing() -> None:
    st_ = Store(2)
    w = st_.hub.watch(*ALL)
    assert take(w) == [] and st_.asked == []
    with pytest.raises(ValueError):
        SM(stripe=(2, 2))
