"""When a group snapshots: every ``snapshot_entries`` entries, unless the state is large.

A snapshot serializes the whole state, so taking one every fixed number of entries makes
each write pay a share of it that grows with the store. A group waits, past
``snapshot_entries``, until the bytes applied since its last snapshot reach
``snapshot_log_percent`` of that snapshot's size, and at most ``SNAPSHOT_STRETCH`` times
``snapshot_entries`` entries (``Group.snapshot_due``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from accord.raft.host.group import SNAPSHOT_STRETCH, Group, HostConfig
from tests.raft.host.test_host import Cluster, running_cluster

EVERY = 20
POLICY = HostConfig(tick_interval=0.02, election_ticks=10, request_timeout=3.0,
                    snapshot_entries=EVERY, snapshot_log_percent=50)


def group(applied: int, last_index: int, last_bytes: int, applied_bytes: int) -> Group:
    g = Group(1, cast(Any, None), cast(Any, None), applied=applied,
              last_snapshot_index=last_index, last_snapshot_bytes=last_bytes)
    g.applied_bytes = applied_bytes
    return g


def test_a_snapshot_waits_for_the_log_to_reach_its_share_of_the_state() -> None:
    cfg = HostConfig(snapshot_entries=100, snapshot_log_percent=50)
    assert not group(99, 0, 0, 10**6).snapshot_due(cfg)  # too few entries, whatever their size
    assert group(100, 0, 0, 0).snapshot_due(cfg)  # no snapshot yet: at the count
    assert not group(1100, 1000, 10_000, 4_999).snapshot_due(cfg)  # 49.99% of the state
    assert group(1100, 1000, 10_000, 5_000).snapshot_due(cfg)  # 50%
    stretch = 1000 + 100 * SNAPSHOT_STRETCH
    assert not group(stretch - 1, 1000, 10**9, 0).snapshot_due(cfg)
    assert group(stretch, 1000, 10**9, 0).snapshot_due(cfg)  # bounded in entries too
    etcd = HostConfig(snapshot_entries=100, snapshot_log_percent=0)
    assert group(1100, 1000, 10**9, 0).snapshot_due(etcd)  # 0: every count, as etcd
    newcomer = group(5, 0, 0, 0)
    newcomer.want_compaction = True
    assert newcomer.snapshot_due(cfg)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in running_cluster(tmp_path, Cluster, POLICY):
        yield c


async def _snapshots(cluster: Cluster, gid: int, at_least: int) -> list[int]:
    """Every replica's last snapshot index once all reach ``at_least`` (or after 10 s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        snaps = [n.host.group(gid).last_snapshot_index for n in cluster.nodes.values()]
        if all(s >= at_least for s in snaps) or loop.time() > deadline:
            return snaps
        await asyncio.sleep(0.05)


async def test_small_writes_over_a_large_state_snapshot_later_but_within_the_stretch(
    cluster: Cluster,
) -> None:
    gid = 1
    lead = await cluster.leader(gid)
    for i in range(EVERY):  # ~80 KB of state in EVERY entries: the first snapshot
        await cluster.put(lead, gid, f"big{i}", "x" * 4096)
    first = await _snapshots(cluster, gid, EVERY)
    assert all(s >= EVERY for s in first), first
    sizes = [n.host.group(gid).last_snapshot_bytes for n in cluster.nodes.values()]
    assert all(s >= (EVERY - 2) * 4096 for s in sizes), sizes  # less an empty entry or two
    # Seven times the count of tiny overwrites: a few KB against ~80 KB of state, so no
    # replica snapshots again (every EVERY entries it would have, six times).
    for i in range(7 * EVERY):
        await cluster.put(lead, gid, "small", str(i))
    await asyncio.sleep(0.3)
    assert [n.host.group(gid).last_snapshot_index for n in cluster.nodes.values()] == first
    # Past SNAPSHOT_STRETCH times the count since the first snapshot, it happens anyway.
    for i in range(SNAPSHOT_STRETCH * EVERY):
        await cluster.put(lead, gid, "small", str(i))
    later = await _snapshots(cluster, gid, max(first) + 1)
    assert all(s > f for s, f in zip(later, first, strict=True)), (first, later)
    assert all(s - f <= SNAPSHOT_STRETCH * EVERY + EVERY for s, f in zip(later, first,
                                                                           strict=True))
    # A restarted replica knows the size of the snapshot it loaded, and goes on by it.
    size = cluster.nodes[3].host.group(gid).last_snapshot_bytes
    await cluster.stop_node(3)
    restarted = await cluster.start_node(3)
    assert restarted.host.group(gid).last_snapshot_bytes == size > 0
