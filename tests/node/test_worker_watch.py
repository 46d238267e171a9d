"""Watches over the shards of several workers (``accord/node/workerwatch.py``): two
workers' backends in one process, linked by real forwarding sockets, as in
``test_workers_router.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest

from accord.node.workerwatch import WATCH_POLL, RemoteWatcher
from accord.proto import rpc_pb2 as pb
from accord.services.kv.errors import EtcdError
from accord.services.kv.sharding import shard_of
from accord.services.kv.shardwatch import MergedWatcher, ShardedWatchHub
from accord.services.kv.watchhub import WatchBatch
from tests.kv.test_watch_idle_shards import progress_answer, stream_answers
from tests.node.test_workers_router import (
    PLAN,
    SHARDS,
    Worker,
    cas_both,
    keys_of,
    record_worker_and_keys,
    settled,
    stop,
    two_workers,
)


def hub_of(w: Worker) -> ShardedWatchHub:
    hub = w.backend.watch_hub
    assert isinstance(hub, ShardedWatchHub)
    return hub


async def events_until(watcher: Any, count: int, timeout: float = 5.0) -> list[WatchBatch]:
    """The batches of ``watcher`` until ``count`` events came (or it ended)."""
    out: list[WatchBatch] = []
    seen = 0
    async with asyncio.timeout(timeout):
        while seen < count:
            b = await watcher.next_batch()
            out.append(b)
            if b.canceled:
                break
            seen += len(b.events)
    return out


def revisions(batches: list[WatchBatch]) -> list[int]:
    """The revisions of every event, in delivery order."""
    return [e.kv.mod_revision for b in batches for e in b.events]


def check_order(batches: list[WatchBatch]) -> None:
    """Non-decreasing across batches, every event of one revision in one batch."""
    flat = revisions(batches)
    assert flat == sorted(flat), f"out of revision order: {flat}"
    per_batch = [{e.kv.mod_revision for e in b.events} for b in batches]
    for i, revs in enumerate(per_batch):
        for later in per_batch[i + 1:]:
            assert not revs & later, f"a revision split over batches: {per_batch}"


@pytest.fixture
async def workers(tmp_path: Path) -> Any:
    ws = await two_workers(tmp_path)
    yield ws
    await stop(ws)


@pytest.mark.parametrize("broken", [False, True])
async def test_a_watch_over_every_shard_sees_both_workers_writes_in_revision_order(
        tmp_path: Path, broken: bool) -> None:
    """A watch through worker 0 over the whole key space gets worker 1's shards' events
    from worker 1, merged with its own, in revision order; a Txn over both workers comes
    as one revision in one batch. The broken variant watches worker 1's shards on worker
    0's own empty hubs (no feeds: the hub before this change) and misses their events."""
    ws = await two_workers(tmp_path)
    try:
        if broken:
            hub_of(ws[0]).remote = None
        w = hub_of(ws[0]).watch(b"k", b"l")
        written: list[int] = []
        for i in range(3):
            for k, owner in enumerate(ws):
                resp = await owner.backend.put(pb.PutRequest(key=keys_of(k, 3)[i], value=b"v"))
                written.append(int(resp.header.revision))
        home, keys = record_worker_and_keys()
        txn = await ws[home].backend.txn(cas_both(keys, [0, 0], [b"a", b"b"]))
        assert txn.succeeded is False  # both keys exist: the failure branch, a read
        deleted = await ws[home].backend.delete_range(pb.DeleteRangeRequest(key=b"k", range_end=b"l"))
        await settled(ws)
        if broken:
            with pytest.raises(TimeoutError):
                await events_until(w, len(written) + 6, timeout=2.0)
            return
        batches = await events_until(w, len(written) + deleted.deleted)
        check_order(batches)
        assert revisions(batches) == written + [deleted.header.revision] * 6
        gone = [e.kv.key for b in batches for e in b.events][len(written):]
        assert gone == sorted(gone)  # a DeleteRange's keys in key order, as etcd
        w.close()
    finally:
        await stop(ws)


@pytest.mark.parametrize("broken", [False, True])
async def test_a_later_local_write_waits_for_the_other_workers_earlier_one(
        tmp_path: Path, broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 1's feed answers slowly; a write on worker 1's shard, then one on worker
    0's: the watch through worker 0 delivers them in revision order, holding its own
    until worker 1 has closed the later revision. The broken variant takes worker 1's
    closed revision as passed (``RemoteWatcher.closed_revision`` unbounded) and
    delivers worker 0's write first."""
    ws = await two_workers(tmp_path)
    try:
        served: Any = ws[1].server._handlers  # a slow owner, for the test
        fast: Callable[[bytes], Awaitable[bytes]] = served[WATCH_POLL]

        async def slow(body: bytes) -> bytes:
            answer = await fast(body)
            await asyncio.sleep(0.3)
            return answer

        served[WATCH_POLL] = slow
        if broken:
            monkeypatch.setattr(RemoteWatcher, "closed_revision", lambda self: 1 << 62)
        w = hub_of(ws[0]).watch(b"k", b"l")
        await asyncio.sleep(0.5)  # the feed opened: its polls are waiting on worker 1
        first = await ws[1].backend.put(pb.PutRequest(key=keys_of(1, 1)[0], value=b"1"))
        second = await ws[0].backend.put(pb.PutRequest(key=keys_of(0, 1)[0], value=b"0"))
        assert second.header.revision > first.header.revision
        got = revisions(await events_until(w, 2))
        want = [first.header.revision, second.header.revision]
        if broken:
            assert got != want
            return
        assert got == want
    finally:
        await stop(ws)


async def test_a_watch_of_one_key_on_the_other_worker_replays_and_follows_it(
        workers: list[Worker]) -> None:
    """A key of worker 1's shard watched through worker 0 from a past revision: its
    history replayed by worker 1, then its live writes; a progress request answered at a
    revision past them; a cancel closes the owner's feed."""
    key = keys_of(1, 1)[0]
    owner = workers[1].backend
    past = [int((await owner.put(pb.PutRequest(key=key, value=f"{i}".encode()))).header.revision)
            for i in range(3)]
    w = hub_of(workers[0]).watch(key, b"", start_revision=past[1])
    assert isinstance(w, MergedWatcher)  # a merged watcher of one remote shard
    got = await events_until(w, 2)
    assert revisions(got) == past[1:]
    live = await owner.put(pb.PutRequest(key=key, value=b"live"))
    got = await events_until(w, 1)
    assert revisions(got) == [live.header.revision] and got[0].events[0].kv.value == b"live"
    w.request_progress()
    async with asyncio.timeout(5):
        note = await w.next_batch()
    assert note.progress and note.revision >= live.header.revision
    feeds = workers[1].router.feeds
    assert len(feeds) == 1
    w.close()
    async with asyncio.timeout(5):
        while len(feeds):
            await asyncio.sleep(0.01)
    assert not workers[0].router.links.open


async def test_a_watch_ends_with_a_reason_when_the_other_worker_goes(
        workers: list[Worker]) -> None:
    """Worker 1 stops serving its forwarding socket: the watch through worker 0 ends
    with a cancel naming the shard's worker, not silently."""
    w = hub_of(workers[0]).watch(b"k", b"l")
    await asyncio.sleep(0.2)
    await workers[1].server.stop()
    async with asyncio.timeout(15):
        b = await w.next_batch()
        while not b.canceled:
            b = await w.next_batch()
    assert "worker that hosts shard" in b.cancel_reason


async def test_a_feed_refuses_a_shard_its_worker_does_not_host(workers: list[Worker]) -> None:
    """An opening poll for a shard of another worker is refused, nothing created."""
    mine = shard_of(keys_of(0, 1)[0], SHARDS)
    client = workers[0].router.clients[1]
    with pytest.raises(Exception) as e:
        await client.call(WATCH_POLL, msgpack.packb(
            ["x.1", [mine, b"k", b"l", 0, False, [], 10], 0, 10]), 5.0)
    assert "not hosted" in str(getattr(e.value, "message", e.value))
    assert len(workers[1].router.feeds) == 0
    assert PLAN.worker_of_shard(mine) == 0


async def test_a_progress_request_through_one_worker_floors_the_other_workers_idle_shards(
        workers: list[Worker]) -> None:
    """A stream on worker 0 watching every shard; a write to worker 0's shards only; the
    progress request is answered at or above it: worker 1's idle shards (known to worker
    0 through the watch's feeds) floored there through ``WatchFloor``, not left below."""
    hub = hub_of(workers[0])
    assert hub.remote is not None
    theirs = [s for s in range(SHARDS) if PLAN.worker_of_shard(s) == 1]
    written: list[int] = []

    async def write() -> None:
        async with asyncio.timeout(5):  # the feeds told worker 0 where worker 1's shards are
            while any(hub.remote.closed(s) is None for s in theirs):
                await asyncio.sleep(0.01)
        for i in range(5):
            r = await workers[0].backend.put(pb.PutRequest(key=keys_of(0, 1)[0], value=b"%d" % i))
            written.append(int(r.header.revision))

    answer = await progress_answer(
        workers[0].backend, pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00"), write)
    assert answer >= written[-1]
    assert min(int(workers[1].backend.machines[s].revision) for s in theirs) >= written[-1]


async def test_an_event_waiting_on_the_other_workers_idle_shards_comes_after_a_failed_floor(
        workers: list[Worker]) -> None:
    """Worker 1's first floor for a feed fails (no quorum): the watch through worker 0,
    whose event waits on worker 1's idle shards, nudges again and gets it."""
    feeds = workers[1].router.feeds
    real = feeds._floor
    calls: list[int] = []

    async def failing_once(shards: list[int], revision: int) -> None:
        calls.append(revision)
        if len(calls) == 1:
            raise EtcdError(grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
        await real(shards, revision)

    feeds._floor = failing_once
    w = hub_of(workers[0]).watch(b"\x00", b"\x00")
    await asyncio.sleep(0.2)  # the feeds are open
    put = await workers[0].backend.put(pb.PutRequest(key=keys_of(0, 1)[0], value=b"v"))
    got = await events_until(w, 1, timeout=10)
    assert revisions(got) == [put.header.revision]
    assert len(calls) >= 2
    w.close()


async def test_a_watch_from_now_through_one_worker_starts_above_the_other_workers_write(
        workers: list[Worker]) -> None:
    """A write on worker 1's shard, then a watch from now through worker 0 (which has
    never heard of worker 1's shards): created at or above the write (worker 1's shards
    floored through ``WatchFloor``), and the write is not handed back as an event."""
    key = keys_of(1, 1)[0]
    mine = int((await workers[1].backend.put(pb.PutRequest(key=key, value=b"v"))).header.revision)
    got = await stream_answers(workers[0].backend,
                               pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00"))
    assert got.created >= mine and got.progress >= mine
    assert (key, mine) not in got.events
