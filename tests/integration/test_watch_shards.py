"""A client watch over keys on every shard, against real daemons (``--shards 8``).

The watch's range spans all 8 KV shards (keys under ``/ms/p<j>/``, whose partitions hash
to every shard), writers spread puts and deletes over them at random (seeded: the seed
is printed, ``ACCORD_TEST_SEED`` replays it), and the events the watch delivered are
compared with the store's history read afterwards, partition by partition, on plain
single-shard etcd watches of a healthy member (no merging, no resumption involved):
the same ``(revision, key, type, value)`` set, no duplicate, each key's events in order,
and every write a writer saw acknowledged among them. And the one revision order
(``docs/txn.md``): the events came in revision order, every acknowledged put has a
revision of its own, and a put acknowledged before another started has the lower one.

* the watch resumes across a kill -9 of the member its stream was on, killed while the
  writers write;
* with one member down (killed -9 before the watch starts) the watch runs against the
  other two and still delivers every event once.

Each on nodes of one process and on nodes of two worker processes (``--workers 2``: the
watch merges its worker's shards with the other worker's, fed over the node's
forwarding socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accord.client import AccordClient, WatchEvent
from accord.client.errors import OutcomeUnknown
from accord.proto import rpc_pb2
from accord.services.kv import sharding
from tests.integration.cluster import ProcCluster, ProcNode
from tests.integration.test_client_cluster import (
    Row,
    as_row,
    live,
    rest_of,
    store_history,
    wait_settled,
)

SHARDS = 8
PREFIX = b"/ms/"
WRITERS = 3
LEAD = 60
"""Writes to one shard before the watch starts: how far its revision runs ahead."""


def _partitions() -> list[bytes]:
    """Prefixes ``/ms/p<j>/``, at least two on each of the 8 shards."""
    out: list[bytes] = []
    per: dict[int, int] = {}
    j = 0
    while min(per.get(s, 0) for s in range(SHARDS)) < 2:
        p = PREFIX + f"p{j}/".encode()
        s = sharding.shard_of(p + b"k", SHARDS)
        if per.get(s, 0) < 2:
            out.append(p)
            per[s] = per.get(s, 0) + 1
        j += 1
    return out


PARTS = _partitions()


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    """Three members; with two workers, a watch through a member is merged from both of
    its workers' shards (``node/workerwatch.py``)."""
    c = ProcCluster(tmp_path, 3, workers=request.param, extra=("--shards", str(SHARDS)))
    try:
        for n in c.nodes:  # start_all, with the longer waits a loaded machine needs
            c.start(n)
        for n in c.nodes:
            c.wait_serving(n, 60)
        c.wait_published(90)
        c.leader(timeout=60)
        yield c
    finally:
        c.stop_all()


def _seed() -> int:
    seed = int(os.environ.get("ACCORD_TEST_SEED") or random.randrange(1 << 32))
    print(f"seed {seed} (ACCORD_TEST_SEED={seed} replays it)")
    return seed


def _delete(nodes: list[ProcNode], key: bytes, timeout: float = 30.0) -> int:
    """Delete ``key`` through any of ``nodes``, retrying transient errors; the revision."""
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        n = nodes[i % len(nodes)]
        i += 1
        try:
            r = n.kv().DeleteRange(rpc_pb2.DeleteRangeRequest(key=key), timeout=2.0)
            return int(r.header.revision)
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _history(node: ProcNode, start: int, last: int) -> list[Row]:
    """The store's events of every partition from ``start`` to ``last``: one single-shard
    watch per partition (after a read over all of ``/ms/`` floors every shard at it), each
    partition's in revision order."""
    end = PREFIX[:-1] + bytes([PREFIX[-1] + 1])
    node.kv().Range(rpc_pb2.RangeRequest(key=PREFIX, range_end=end, count_only=True),
                    timeout=10.0)
    return [r for p in PARTS for r in store_history(node, p, start, last)]


async def _watch_while_writing(cluster: ProcCluster, seed: int, *, kill: bool,
                               total: int = 240, kill_after: int = 60) -> None:
    """Watch ``/ms/`` on every live member's endpoint while ``WRITERS`` threads write
    ``total`` changes at random partitions (with ``kill``: kill -9 the watch's member
    once it delivered ``kill_after`` events); then compare with the store's history."""
    rng = random.Random(seed)
    plans = [[(rng.choice(PARTS) + f"k{rng.randrange(12)}".encode(), rng.random() < 0.2)
              for _ in range(total // WRITERS)] for _ in range(WRITERS)]
    nodes = live(cluster)
    async with AccordClient([n.endpoint for n in nodes], call_timeout_s=2.0,
                            retry_budget_s=60.0) as c:
        # The start partition's shard runs ahead of the others (as after any burst of
        # writes to one partition): a write to another shard may then get a revision
        # below the start unless that shard was floored first.
        for i in range(LEAD):
            # Setup writes before the start: one whose answer was lost (a loaded
            # machine) is not an error here, only one fewer revision ahead.
            with contextlib.suppress(OutcomeUnknown):
                await c.put(PARTS[0] + b"lead", str(i).encode())
        start = (await c.put(PARTS[0] + b"start", b"0")).revision
        watch = c.watch(PREFIX, prefix=True, start_revision=start)
        await watch.created(30)
        victim = next(n for n in nodes if n.endpoint == watch.endpoint)
        writers_via = [n for n in nodes if n is not victim] if kill else nodes
        acked: list[tuple[int, bytes, int]] = []  # (type, key, revision) acknowledged
        timed: list[tuple[float, float, int, int]] = []  # puts: (start, ack, revision, writer)
        lock = threading.Lock()

        def write(plan: list[tuple[bytes, bool]], w: int) -> None:
            for i, (key, is_delete) in enumerate(plan):
                if is_delete:
                    rev = _delete(writers_via, key)
                    row = (1, key, rev)
                else:
                    t0 = time.monotonic()
                    rev = cluster.put(key, f"{w}.{i}".encode(), via=writers_via)
                    row = (0, key, rev)
                    with lock:
                        timed.append((t0, time.monotonic(), rev, w))
                with lock:
                    acked.append(row)

        writers = [asyncio.create_task(asyncio.to_thread(write, p, w))
                   for w, p in enumerate(plans)]
        got: list[WatchEvent] = []
        killed = False
        try:
            async with asyncio.timeout(300):
                while not all(t.done() for t in writers):
                    try:
                        got.append(await asyncio.wait_for(watch.__anext__(), 1.0))
                    except TimeoutError:
                        print(f"waiting: {len(got)} events, {len(acked)} written, "
                              f"reconnects {watch.reconnects}, safe {watch.progress_revision},"
                              f" on {watch.endpoint}")
                        continue
                    if kill and not killed and len(got) >= kill_after:
                        cluster.kill(victim)  # kill -9 the member the stream is on
                        killed = True
                await asyncio.gather(*writers)
                last = max(r for _t, _k, r in acked)
                got += await rest_of(watch, last)
        finally:
            await watch.close()
        if kill:
            assert killed and watch.reconnects >= 1 and watch.endpoint != victim.endpoint
        # One revision order (docs/txn.md): the watch delivered in revision order, across
        # the reconnect too; every acknowledged put has a revision of its own; one writer's
        # puts, one after another over many shards, got increasing revisions; and a put
        # acknowledged before another started (any writer) has the lower revision.
        order = [e.kv.mod_revision for e in got]
        assert order == sorted(order), f"seed {seed}: the watch delivered out of order"
        revs = [r for _t0, _t1, r, _w in timed]
        assert len(set(revs)) == len(revs), f"seed {seed}: puts shared a revision"
        for w in range(WRITERS):
            mine = [r for _t0, _t1, r, ww in sorted(timed) if ww == w]
            assert mine == sorted(mine), f"seed {seed}: writer {w}'s puts went back"
        by_ack = sorted(timed, key=lambda x: x[1])
        top, j = 0, 0
        for t0, _t1, r, _w in sorted(timed):
            while j < len(by_ack) and by_ack[j][1] < t0:
                top = max(top, by_ack[j][2])
                j += 1
            assert r > top, f"seed {seed}: a put started after {top} was acknowledged got {r}"
        delivered = [as_row(e) for e in got if e.kv.mod_revision <= last]
        history = _history(writers_via[0], start, last)
        print(f"delivered {len(delivered)}, history {len(history)}, "
              f"reconnects {watch.reconnects}, repeats dropped {watch.repeats_dropped}")
        missing = sorted(set(history) - set(delivered))
        extra = sorted(set(delivered) - set(history))
        assert not missing and not extra, f"seed {seed}: missing {missing[:10]} " \
            f"({len(missing)}), not in the history {extra[:10]} ({len(extra)})"
        assert len(set(delivered)) == len(delivered), f"seed {seed}: duplicates"
        for k in {r[1] for r in history}:
            assert [r for r in delivered if r[1] == k] == [r for r in history if r[1] == k]
        # Every put acknowledged after the watch was created was delivered: none got a
        # revision below the start on a shard that was behind it.
        puts = {a for a in acked if a[0] == 0}
        lost = sorted(puts - {(t, k, r) for t, k, _v, r in delivered})
        assert not lost, f"seed {seed}: acknowledged puts not delivered (start {start}): " \
            f"{lost[:10]} ({len(lost)})"


async def test_a_watch_over_every_shard_resumes_across_a_kill_9_of_its_member(
        cluster: ProcCluster) -> None:
    await _watch_while_writing(cluster, _seed(), kill=True)


async def test_a_watch_over_every_shard_with_a_member_down_delivers_every_event_once(
        cluster: ProcCluster) -> None:
    seed = _seed()
    cluster.kill(cluster.nodes[seed % len(cluster.nodes)])
    cluster.leader(among=live(cluster), timeout=60)
    for n in live(cluster):
        wait_settled(n)  # every shard led again among the two (the KV group alone is not)
    await _watch_while_writing(cluster, seed, kill=False)
