"""The client library against a real 3-node cluster of `accord serve` daemons.

* a watch resumes across a kill -9 of the member its stream was on, and the events it
  delivered are exactly the store's history (no gap, no duplicate);
* a compacted start revision raises :class:`WatchCompacted`;
* a put whose reply is lost after the server applied it is not sent again (a proxy drops
  the answers on the client's connection): the caller gets :class:`OutcomeUnknown`;
* discovery from one endpoint, each member's status, move leader, a snapshot;
* a scheduling round trip from Python: register, submit, the placement event, finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from accord.client import (
    AccordClient,
    ClientError,
    EventType,
    JobSpec,
    NotFound,
    OutcomeUnknown,
    PlacementEvent,
    Watch,
    WatchCompacted,
    WatchEvent,
)
from accord.client import watch as watch_module
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.scheduling.servicer import node_to_pb
from accord.services.scheduling.topology import make_node
from tests.integration.cluster import HOST, ProcCluster, ProcNode
from tests.integration.proxy import LinkProxies


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("client"), 3) as c:
        c.leader()
        yield c


def live(c: ProcCluster) -> list[ProcNode]:
    return [n for n in c.nodes if n.proc is not None and n.proc.poll() is None]


@pytest.fixture
async def client(cluster: ProcCluster) -> AsyncIterator[AccordClient]:
    async with AccordClient([n.endpoint for n in live(cluster)], call_timeout_s=3.0) as c:
        yield c


Row = tuple[int, bytes, bytes, int]
"""An event as (type, key, value, mod revision)."""


def store_history(node: ProcNode, prefix: bytes, start: int, last: int,
                  timeout: float = 60.0) -> list[Row]:
    """Every event of ``prefix`` from ``start`` to ``last`` as the store keeps them, read
    on one plain etcd Watch stream of a healthy member (no resumption involved): events
    until the watch's own progress notification confirms that everything up to ``last``
    was sent (a linearizable read of the range first raises every shard it spans to at
    least ``last``, so that shards without writes report progress that far too)."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    node.kv().Range(rpc_pb2.RangeRequest(key=prefix, range_end=end, count_only=True),
                    timeout=10.0)
    done = threading.Event()

    def requests() -> Iterator[rpc_pb2.WatchRequest]:
        yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
            key=prefix, range_end=end, start_revision=start, progress_notify=True))
        while not done.wait(0.2):
            yield rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())

    stream = rpc_pb2_grpc.WatchStub(node.channel()).Watch(requests(), timeout=timeout)
    out: list[Row] = []
    try:
        for resp in stream:
            for ev in resp.events:
                out.append((ev.type, ev.kv.key, ev.kv.value, ev.kv.mod_revision))
            if (not resp.events and not resp.created and resp.watch_id != -1
                    and resp.header.revision >= last):
                break
    finally:
        done.set()
        stream.cancel()
    return [r for r in out if r[3] <= last]


def wait_settled(node: ProcNode, timeout: float = 60.0) -> None:
    """Wait until ``node`` serves a linearizable read over the whole key space: it knows
    a leader of every shard again (after a restart), so the next test's writes and reads
    through it are answered."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            node.kv().Range(rpc_pb2.RangeRequest(key=b"\0", range_end=b"\0", count_only=True),
                            timeout=2.0)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def rest_of(watch: Watch, last: int) -> list[WatchEvent]:
    """The events still on their way once the watch's progress confirmed ``last``."""
    while await watch.request_progress(15) < last:
        await asyncio.sleep(0.1)
    # everything up to ``last`` has been received now: take what is still queued
    out: list[WatchEvent] = []
    with contextlib.suppress(TimeoutError):
        while True:
            out.append(await asyncio.wait_for(watch.__anext__(), 0.5))
    return out


def as_row(e: WatchEvent) -> Row:
    return (0 if e.type is EventType.PUT else 1, e.kv.key, e.kv.value, e.kv.mod_revision)


async def watch_while_writing(cluster: ProcCluster, prefix: bytes, key: Callable[[int], bytes],
                              *, kill: bool) -> tuple[list[Row], list[Row]]:
    """Watch ``prefix`` while 150 keys are written (with ``kill``: kill -9 the watch's
    member after 40 events); (the events the watch delivered, the store's history), both
    up to the last write's revision."""
    total, kill_after = 150, 40
    async with AccordClient([n.endpoint for n in live(cluster)], call_timeout_s=2.0) as c:
        start = (await c.put(key(-1), b"start")).revision
        watch = c.watch(prefix, prefix=True, start_revision=start)
        await watch.created(20)
        victim = next(n for n in cluster.nodes if n.endpoint == watch.endpoint)
        others = [n for n in live(cluster) if n is not victim]
        revisions: list[int] = []

        def write() -> None:
            for i in range(total):
                revisions.append(cluster.put(key(i), str(i).encode(), via=others))

        writer = asyncio.create_task(asyncio.to_thread(write))
        got: list[WatchEvent] = []
        try:
            async with asyncio.timeout(240):
                while not writer.done() or len(got) < total:
                    try:
                        got.append(await asyncio.wait_for(watch.__anext__(), 1.0))
                    except TimeoutError:  # what it waits for, should it time out
                        print(f"waiting: {len(got)} events, writer done {writer.done()}, "
                              f"{len(revisions)} written, reconnects {watch.reconnects}, "
                              f"safe {watch.progress_revision}, on {watch.endpoint}, "
                              f"repeats dropped {watch.repeats_dropped}")
                        continue
                    if kill and len(got) == kill_after:
                        cluster.kill(victim)  # kill -9 the member the stream is on
                await writer
                last = max(revisions)
                got += await rest_of(watch, last)
        finally:
            await watch.close()
            if victim.proc is not None and victim.proc.poll() is not None:
                cluster.start(victim)
                cluster.wait_serving(victim)
                wait_settled(victim)
        if kill:
            assert watch.reconnects >= 1 and watch.endpoint != victim.endpoint
        delivered = [as_row(e) for e in got if e.kv.mod_revision <= last]
        return delivered, store_history(others[0], prefix, start, last)


async def test_watch_resumes_across_a_kill_9_of_its_member_without_gap_or_duplicate(
    cluster: ProcCluster,
) -> None:
    prefix = b"/resume/w/"  # one partition: one shard, events in revision order
    delivered, history = await watch_while_writing(
        cluster, prefix, lambda i: prefix + f"k{i:03d}".encode(), kill=True)
    assert delivered == history
    assert len(set(delivered)) == len(delivered) and len(delivered) > 150


async def test_a_watch_over_many_shards_resumes_across_a_kill_9_without_gap_or_duplicate(
        cluster: ProcCluster) -> None:
    """Shards number their revisions apart, so a lagging shard's revision 4 can come after
    another's 5: the watch must deliver both. On the module's cluster, after the kill -9
    test, the shards' counters are far apart (that test's shard ran ahead): without the
    watch's first read of the range, which floors every shard, writes to the lagging
    shards got revisions below the start and were lost (issue 19: 3 runs of 3 failed)."""
    prefix = b"/spread/"  # /spread/p0 ... /spread/p6: partitions on different shards
    delivered, history = await watch_while_writing(
        cluster, prefix, lambda i: prefix + f"p{i % 7}/k{i:03d}".encode(), kill=True)
    # shards deliver in their own order; each key's events keep theirs
    assert sorted(delivered) == sorted(history)
    assert len(set(delivered)) == len(delivered) and len(delivered) > 150
    for k in {r[1] for r in history}:
        assert [r for r in delivered if r[1] == k] == [r for r in history if r[1] == k]


async def test_a_watch_over_many_shards_keeps_what_it_remembers_bounded_while_one_shard_writes(
        client: AccordClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events a watch remembers to drop repeats after a resume are released by its
    own progress requests, without a read of the range before each (the idle shards of
    the range close behind the delivered events: the server floors them to deliver in
    revision order): while 600 writes land on one shard of a range over every shard,
    the watch's safe revision follows the writes and its memory stays near
    :data:`watch.PROGRESS_ASK_EVENTS` (without the requests it would keep all 600)."""
    monkeypatch.setattr(watch_module, "PROGRESS_ASK_EVENTS", 32)
    revs: list[int] = []
    remembered: list[int] = []
    async with client.watch("/mem/", prefix=True) as watch:
        await watch.created()

        async def consume() -> None:
            async for ev in watch:
                remembered.append(len(watch._seen))
                if len(revs) == 600 and ev.revision == revs[-1]:
                    return

        reader = asyncio.create_task(consume())
        for i in range(600):  # one partition: one shard of the eight
            revs.append((await client.put(f"/mem/p/k{i % 50}", str(i))).revision)
        async with asyncio.timeout(30):
            await reader
    assert len(remembered) == 600
    assert max(remembered) <= 200, f"remembered up to {max(remembered)} events"
    assert watch.progress_revision >= revs[400]


async def test_a_compacted_start_revision_raises_watch_compacted(client: AccordClient) -> None:
    old = (await client.put("/compact/w/a", "1")).revision
    now = (await client.put("/compact/w/a", "2")).revision
    await client.compact(now, physical=True)
    async with client.watch("/compact/w/", prefix=True, start_revision=old) as watch:
        with pytest.raises(WatchCompacted) as e:
            async with asyncio.timeout(20):
                await watch.__anext__()
    assert e.value.compact_revision >= now and e.value.requested == old
    # from the compact revision on, the same watch works
    async with client.watch("/compact/w/", prefix=True, start_revision=now) as watch:
        async with asyncio.timeout(20):
            ev = await watch.__anext__()
    assert ev.kv.value == b"2" and ev.revision == now


async def test_a_put_whose_reply_is_lost_is_never_sent_again(cluster: ProcCluster) -> None:
    first, second = live(cluster)[:2]
    proxies = LinkProxies()
    try:
        port = proxies.add("client", first.name, first.client_port)
        eps = [f"{HOST}:{port}", second.endpoint]
        async with AccordClient(eps, call_timeout_s=2.0, retry_budget_s=20.0) as c:
            await c.get("/lost/reply/warm")  # the channel through the proxy is connected
            assert c.pool.current == eps[0]
            before = (await c.range("/lost/reply/", prefix=True, serializable=False)).revision
            proxies.blocked.add((first.name, "client"))  # answers dropped, requests pass
            retries = c.pool.retries
            with pytest.raises(OutcomeUnknown) as e:
                await c.put("/lost/reply/k", "once")
            assert e.value.endpoint == eps[0] and "read the keys back" in e.value.hint
            assert c.pool.retries == retries  # not sent to the other endpoint either
            # the server applied it, exactly once
            deadline = time.monotonic() + 20
            kv = None
            while kv is None and time.monotonic() < deadline:
                kv = await c.get("/lost/reply/k")  # a read: fails over to the next endpoint
                await asyncio.sleep(0.1)
            assert kv is not None and kv.value == b"once" and kv.version == 1
            assert kv.mod_revision > before
            await asyncio.sleep(1.0)
            again = await c.get("/lost/reply/k")
            assert again is not None and again.version == 1
            # reads were retried past the black hole; a new write goes to the live endpoint
            assert c.pool.current == eps[1]
            assert (await c.put("/lost/reply/k", "twice")).revision > kv.mod_revision
    finally:
        proxies.close()


async def test_discovery_status_move_leader_and_snapshot(cluster: ProcCluster,
                                                         tmp_path: Path) -> None:
    one = live(cluster)[0]
    async with await AccordClient.connect([one.endpoint], call_timeout_s=3.0) as c:
        assert sorted(c.endpoints) == sorted(n.endpoint for n in cluster.nodes)
        reports = await c.cluster.statuses()
        assert all(r.status is not None for r in reports), [r.error for r in reports]
        assert sum(r.status.is_leader for r in reports if r.status) == 1
        leader = await c.cluster.leader()
        target = next(m for m in await c.cluster.members() if m.id != leader.id)
        await c.cluster.move_leader(target.id)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if (await c.cluster.leader()).id == target.id:
                    break
            await asyncio.sleep(0.1)
        assert (await c.cluster.leader()).id == target.id
        chunks: list[int] = []
        snap = await c.cluster.snapshot(tmp_path / "n.snap", endpoint=one.endpoint,
                                        progress=lambda got, total: chunks.append(got))
        assert snap.size > 0 and chunks[-1] == snap.size and snap.revision > 0


async def _heartbeats(c: AccordClient, node: str) -> None:
    while True:
        with contextlib.suppress(Exception):
            await c.scheduler.heartbeat(node)
        await asyncio.sleep(0.3)


async def test_scheduling_round_trip_from_python(client: AccordClient) -> None:
    c = client
    name = await c.scheduler.register_node(node_to_pb(make_node("gpu-rt", gpus=8)))
    assert name == "gpu-rt"
    beats = asyncio.create_task(_heartbeats(c, name))
    try:
        async with c.scheduler.watch_placements() as events:
            job_id = await c.scheduler.submit(JobSpec(tasks=2, devices_per_task=4,
                                                      selector="vendor == nvidia",
                                                      tenant="research"))

            async def next_of(kind: str) -> PlacementEvent:
                async for ev in events:
                    if ev.job_id == job_id and ev.kind == kind:
                        return ev
                raise AssertionError("placement stream ended")

            placed = await asyncio.wait_for(next_of("placed"), 30)
            assert [t.rank for t in placed.tasks] == [0, 1]
            assert {t.host for t in placed.tasks} == {"gpu-rt"}
            assert all(len(t.devices) == 4 and t.env["WORLD_SIZE"] for t in placed.tasks)
            job = await c.scheduler.get(job_id)
            assert job.status == "running" and job.spec.tenant == "research"
            assert job_id in [j.id for j in await c.scheduler.jobs(status="running")]
            nodes = {n.name: n for n in await c.scheduler.nodes()}
            assert nodes["gpu-rt"].alive and job_id in nodes["gpu-rt"].running_jobs
            assert nodes["gpu-rt"].orphan_timeout is None  # registered with no promise
            await c.scheduler.job_finished(job_id)
            finished = await asyncio.wait_for(next_of("finished"), 30)
            assert finished.index > placed.index
        assert (await c.scheduler.get(job_id)).status == "succeeded"
        # An agent of one's own promises to stop its tasks (the scheduler's fence then
        # waits for it); the listing shows the promise, and a promise out of range is
        # refused with nothing registered.
        own = await c.scheduler.register_node(node_to_pb(make_node("gpu-own", gpus=1)),
                                              agent_endpoint="127.0.0.1:7001",
                                              orphan_timeout=7.5)
        listed = {n.name: n for n in await c.scheduler.nodes()}[own]
        assert (listed.orphan_timeout, listed.agent_endpoint) == (7.5, "127.0.0.1:7001")
        assert listed.to_pb().orphan_timeout == 7.5
        with pytest.raises(ClientError) as refused:
            await c.scheduler.register_node(node_to_pb(make_node("gpu-bad", gpus=1)),
                                            orphan_timeout=-1.0)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "orphan_timeout" in refused.value.message
        assert "gpu-bad" not in {n.name for n in await c.scheduler.nodes()}
        assert await c.scheduler.drain(name) == []
        assert (await c.scheduler.undrain(name)) == []
        with pytest.raises(NotFound, match="does not exist"):
            await c.scheduler.get("no-such-job")
        # A watch delivers what was placed after it was entered, even before its first
        # read (the docs' example submits inside the `async with`, then reads).
        async with c.scheduler.watch_placements() as later:
            quick = await c.scheduler.submit(JobSpec(tasks=1, devices_per_task=1))
            await c.scheduler.wait_placed(quick)

            async def placed_event() -> PlacementEvent:
                async for ev in later:
                    if ev.job_id == quick and ev.kind == "placed":
                        return ev
                raise AssertionError("placement stream ended")

            assert (await asyncio.wait_for(placed_event(), 30)).tasks
        await c.scheduler.job_finished(quick)
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
