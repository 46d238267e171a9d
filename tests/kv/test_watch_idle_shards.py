"""Watches over several shards whose answers wait on idle shards.

A progress request on a watch stream over several shards is answered at the store's
current revision, as one etcd answers it (``WatchStream._close_through``,
``ShardedWatchHub.close_through``): a client that wrote or read at R and then waits for
a progress notification at or above R gets one without a write to every shard. The
broken variant (``WatchStream.broken_at_idlest_shard``: the answer is the idlest
shard's closed revision, the behaviour before) leaves such a client waiting.

A merged watcher whose event waits on idle shards gets it once the backend's floor of
those shards failed (no quorum) and then succeeded: the failed try does not swallow the
watcher's ask (``shardwatch.chase_floor``; on a worker, ``RemoteWatcher`` nudges again)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import sharding, watchstream
from accord.services.kv.backend import Backend
from accord.services.kv.codec import Kind, decode
from accord.services.kv.errors import EtcdError
from accord.services.kv.shardwatch import MergedWatcher
from accord.services.kv.watchstream import WatchStream
from tests.kv.test_xshard import SHARDS, Shards


def key_on(shard: int) -> bytes:
    return next(k for i in range(1000)
                if sharding.shard_of(k := b"p%d" % i, SHARDS) == shard)


@dataclass
class Answers:
    """What one watch stream answered: its created revision, its events, the revision
    of the progress answer."""

    created: int = 0
    events: list[tuple[bytes, int]] = field(default_factory=list)
    progress: int = 0


async def stream_answers(b: Backend, create: pb.WatchCreateRequest,
                         between: Callable[[], Awaitable[None]] | None = None) -> Answers:
    """Open a stream on ``b`` with one watch, (once it is created, run ``between``,) ask
    for progress; what it answered until the progress answer."""
    done = asyncio.Event()
    created = asyncio.Event()
    out = Answers()

    async def requests() -> AsyncIterator[pb.WatchRequest]:
        yield pb.WatchRequest(create_request=create)
        await created.wait()
        if between is not None:
            await between()
        yield pb.WatchRequest(progress_request=pb.WatchProgressRequest())
        await done.wait()

    stream = WatchStream(b, max_response_bytes=1 << 20, require_leader=False)
    try:
        async with asyncio.timeout(10):
            async for raw in stream.run(requests()):
                resp = pb.WatchResponse.FromString(raw)
                if resp.created:
                    out.created = int(resp.header.revision)
                    created.set()
                out.events += [(e.kv.key, int(e.kv.mod_revision)) for e in resp.events]
                if resp.watch_id == -1 and not resp.created:
                    out.progress = int(resp.header.revision)
                    return out
    finally:
        done.set()
        await stream.close()
    raise AssertionError("the stream ended without a progress answer")


async def progress_answer(b: Backend, create: pb.WatchCreateRequest,
                          between: Callable[[], Awaitable[None]] | None = None) -> int:
    """The revision of the progress answer of :func:`stream_answers`."""
    return (await stream_answers(b, create, between)).progress


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", "broken"])
async def test_a_progress_request_is_answered_at_the_current_revision_not_the_idlest_shard(
        broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WatchStream, "broken_at_idlest_shard", broken)
    b = Shards()
    for i in range(5):  # shard 0 runs ahead; the others stay idle
        await b.put(pb.PutRequest(key=key_on(0), value=b"%d" % i))
    last = (await b.put(pb.PutRequest(key=key_on(0), value=b"last"))).header.revision
    idle = [m.revision for m in b.machines[1:]]
    assert max(idle) < last  # the precondition: the other shards are behind the write
    everything = pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00")
    answer = await progress_answer(b, everything)
    if broken:
        assert answer < last, "the broken variant should answer at the idlest shard"
        return
    assert answer >= last
    assert min(m.revision for m in b.machines) >= last  # the idle shards were floored
    # Now a write on an idle shard lands above the confirmed revision: a watcher told
    # "everything up to answer was delivered" cannot be handed a change below it.
    later = (await b.put(pb.PutRequest(key=key_on(2), value=b"x"))).header.revision
    assert later > answer
    one = pb.WatchCreateRequest(key=key_on(1))
    assert sharding.shards_of_range(one.key, one.range_end, SHARDS) == [1]
    assert await progress_answer(b, one) >= later  # a stream of one shard's watch too


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", "broken"])
async def test_a_watch_from_now_starts_at_the_current_revision_and_sees_every_change_after(
        broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch without a start revision is created at the store's current revision, at
    or above a write acknowledged before (one etcd's created answer), and delivers every
    change above that revision and none below: a write on an idle shard, after it."""
    monkeypatch.setattr(WatchStream, "broken_at_idlest_shard", broken)
    b = Shards()
    mine = (await b.put(pb.PutRequest(key=key_on(0), value=b"before"))).header.revision
    later: list[int] = []

    async def write() -> None:
        later.append((await b.put(pb.PutRequest(key=key_on(3), value=b"after"))).header.revision)

    got = await stream_answers(b, pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00"), write)
    if broken:  # created below the client's own write: the revision is not the store's
        assert got.created < mine
        return
    assert got.events == [(key_on(3), later[0])]  # the write after, not the one before
    assert mine <= got.created < later[0] <= got.progress


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", "broken"])
async def test_a_watch_with_a_start_revision_is_created_at_the_current_revision(
        broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The created answer of a watch from a past revision names the store's current
    revision (one etcd's ``header.revision``), and the watch delivers the history from
    its start revision, the idle shards' later writes included."""
    monkeypatch.setattr(WatchStream, "broken_at_idlest_shard", broken)
    b = Shards()
    first = (await b.put(pb.PutRequest(key=key_on(1), value=b"old"))).header.revision
    for i in range(4):  # shard 0 runs ahead of the others
        await b.put(pb.PutRequest(key=key_on(0), value=b"%d" % i))
    last = (await b.put(pb.PutRequest(key=key_on(0), value=b"last"))).header.revision
    got = await stream_answers(b, pb.WatchCreateRequest(key=key_on(1), range_end=b"\x00",
                                                        start_revision=first))
    if broken:
        assert got.created < last, "the broken variant should name the idlest shard's revision"
        return
    assert got.created >= last
    assert (key_on(1), first) in got.events
    assert [r for _, r in got.events] == sorted(r for _, r in got.events)


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", "broken"])
async def test_periodic_progress_notifications_name_the_current_revision(
        broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd's periodic progress notifications (``notify_progress_now``, the server's
    loop) tell idle watchers over several shards, and watchers of one idle shard, the
    store's current revision: at or above a write acknowledged before."""
    monkeypatch.setattr(WatchStream, "broken_at_idlest_shard", broken)
    b = Shards()
    put = await b.put(pb.PutRequest(key=key_on(0), value=b"v"))
    merged = b.watch_hub.watch(b"\x00", b"\x00", progress_notify=True)
    one = b.watch_hub.watch(key_on(3), progress_notify=True)
    assert isinstance(merged, MergedWatcher) and not isinstance(one, MergedWatcher)
    async with asyncio.timeout(5):
        assert await watchstream.notify_progress_now(b) == 2
        told_merged = await merged.next_batch()
        told_one = await one.next_batch()
    assert told_merged.progress and told_one.progress
    if broken:
        assert told_merged.revision < put.header.revision
        assert told_one.revision < put.header.revision
        return
    assert told_merged.revision >= put.header.revision
    assert told_one.revision >= put.header.revision
    merged.close()
    one.close()


async def test_a_progress_request_needs_no_floor_when_every_shard_is_current() -> None:
    """No floor proposal when the shards have closed the current revision already."""
    b = Shards()
    for s in range(SHARDS):
        await b.put(pb.PutRequest(key=key_on(s), value=b"v"))
    top = max(m.revision for m in b.machines)
    await b.floor(list(range(SHARDS)), top)
    before = [m.revision for m in b.machines]
    answer = await progress_answer(b, pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00"))
    assert answer == top
    assert [m.revision for m in b.machines] == before


class CountedFloors(Shards):
    """Counts the floor entries proposed per shard; each takes a few loop turns."""

    def __init__(self) -> None:
        super().__init__()
        self.floor_entries = [0] * SHARDS

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        if _is_floor(command):
            self.floor_entries[shard] += 1
            for _ in range(3):
                await asyncio.sleep(0)
        return await super().commit(command, shard)


def _is_floor(command: bytes) -> bool:
    try:
        return decode(command).kind == Kind.FLOOR
    except EtcdError:  # another format (a multi-shard Txn's, a stamped one)
        return False


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", "broken"])
async def test_progress_requests_of_many_streams_at_once_share_one_floor_per_idle_shard(
        broken: bool) -> None:
    """Twenty streams ask for progress at once while seven shards are idle: each idle
    shard gets one floor entry, not one per stream (``floor`` shares a floor in flight);
    every answer is still at or above the write. The broken variant (every floor its
    own entries) proposes one per stream."""
    b = CountedFloors()
    b.broken_floors_unshared = broken
    last = (await b.put(pb.PutRequest(key=key_on(0), value=b"v"))).header.revision
    everything = pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00")
    b.floor_entries = [0] * SHARDS
    created = await asyncio.gather(*(b.watch_hub.close_through(last) for _ in range(20)))
    assert created == [None] * 20
    if broken:
        assert max(b.floor_entries) > 1, "the broken variant should propose one per caller"
        return
    assert b.floor_entries == [0] + [1] * (SHARDS - 1)
    later = (await b.put(pb.PutRequest(key=key_on(0), value=b"w"))).header.revision
    answers = await asyncio.gather(*(progress_answer(b, everything) for _ in range(20)))
    assert min(answers) >= later
    assert max(b.floor_entries) <= 3  # shared again (two more rounds at most: create, ask)


class FailingFloors(Shards):
    """The first ``failures`` floors fail as without a quorum."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.floors = 0

    async def floor(self, shards: Sequence[int], revision: int) -> None:
        self.floors += 1
        if self.floors <= self.failures:
            raise EtcdError(grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
        await super().floor(shards, revision)


async def test_an_event_waiting_on_idle_shards_comes_after_a_failed_floor() -> None:
    b = FailingFloors(failures=1)
    w = b.watch_hub.watch(b"\x00", b"\x00")
    assert isinstance(w, MergedWatcher)
    put = await b.put(pb.PutRequest(key=key_on(0), value=b"v"))
    async with asyncio.timeout(5):
        got = await w.next_batch()
    assert [e.kv.mod_revision for e in got.events] == [put.header.revision]
    assert b.floors >= 2  # the failed floor was tried again
    w.close()


class NoQuorum(Shards):
    """A member cut off from its peers: a floor never completes."""

    async def floor(self, shards: Sequence[int], revision: int) -> None:
        await asyncio.Event().wait()


async def test_without_a_quorum_a_watch_from_now_is_created_at_once_and_progress_after_the_bounded_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The floors of idle shards never complete: a watch from now is still created at
    once, at the store's current revision (no floor before a created answer), and the
    progress request is answered after ``_PROGRESS_CLOSE_S``, at what the shards have
    closed (the idlest shard's revision: lower, never wrong)."""
    monkeypatch.setattr(watchstream, "_PROGRESS_CLOSE_S", 0.2)
    b = NoQuorum()
    last = (await b.put(pb.PutRequest(key=key_on(0), value=b"v"))).header.revision
    started = asyncio.get_running_loop().time()
    got = await stream_answers(b, pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00"))
    assert got.created >= last
    assert got.progress == min(m.revision for m in b.machines) < last
    assert got.events == []
    assert asyncio.get_running_loop().time() - started < 5
