"""Membership changes through the Multi-Raft host (``MultiRaftHost.propose_conf_change``).

Real WAL, snapshot store and TCP transport in one process: a change proposed on a
follower is forwarded and answered with the membership applied; a node started with
an empty membership joins as a learner from a snapshot (every replica compacts a
log that still starts at index 1 once a node is added), is promoted, and a node is
removed; bad changes are refused and change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from accord.raft.core.confchange import (
    ConfChange,
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeType,
)
from accord.raft.host.multiraft import MultiRaftHost
from accord.raft.storage.snapshot import SnapshotStore
from accord.raft.storage.wal import WriteAheadLog
from accord.raft.transport.links import PeerTransport
from tests.raft.host.test_host import GROUPS, Cluster, Node, Register, running_cluster


def change(kind: ConfChangeType, node: int) -> ConfChange:
    return ConfChange((ConfChangeSingle(kind, node),))


class JoinCluster(Cluster):
    """The host test cluster, with nodes that may start knowing no membership."""

    async def start_node(self, nid: int, voters: Sequence[int] = (1, 2, 3)) -> Node:
        d = self.root / f"n{nid}"
        d.mkdir(exist_ok=True)
        wal, recovered = WriteAheadLog.open(d / "wal")
        holder: list[MultiRaftHost] = []
        transport = PeerTransport(
            nid, "127.0.0.1", self.ports.get(nid, 0),
            on_messages=lambda frm, batch: holder[0].deliver(frm, batch),
            on_snapshot_chunk=lambda frm, piece: holder[0].receive_snapshot_chunk(frm, piece),
            on_heartbeats=lambda frm, hbs, resps: holder[0].deliver_heartbeats(frm, hbs, resps),
            backoff_max=0.2,
        )
        host = MultiRaftHost(nid, wal, SnapshotStore(d / "snap"), transport, self.config,
                             boot_nonce=nid)
        holder.append(host)
        sms = {}
        for gid in GROUPS:
            sms[gid] = Register()
            host.add_group(gid, sms[gid], recovered.get(gid), voters=voters)
        await transport.start()
        self.ports[nid] = transport.listen_port
        node = Node(nid, d, wal, transport, host, sms)
        self.nodes[nid] = node
        return node


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[JoinCluster]:
    async for c in running_cluster(tmp_path, JoinCluster):
        yield c


async def test_a_change_proposed_on_a_follower_is_forwarded_and_applied(
        cluster: JoinCluster) -> None:
    lead = await cluster.leader(1)
    follower = next(n for n in (1, 2, 3) if n != lead)
    host = cluster.nodes[follower].host
    cs = await host.propose_conf_change(1, change(ConfChangeType.ADD_LEARNER, 9), timeout=10)
    assert cs.voters == (1, 2, 3) and cs.learners == (9,)
    # Already in force: answered at once, nothing proposed.
    last = cluster.nodes[lead].host.group(1).core.last_index
    assert (await host.propose_conf_change(1, change(ConfChangeType.ADD_LEARNER, 9))).learners == (9,)
    assert cluster.nodes[lead].host.group(1).core.last_index == last
    cs = await host.propose_conf_change(1, change(ConfChangeType.REMOVE_NODE, 9), timeout=10)
    assert cs.learners == () and cs.voters == (1, 2, 3)
    await asyncio.sleep(0.2)
    for n in cluster.nodes.values():
        assert n.host.group(1).core.conf_state.learners == ()


async def test_a_bad_change_is_refused_on_the_leader_and_changes_nothing(
        cluster: JoinCluster) -> None:
    lead = await cluster.leader(2)
    host = cluster.nodes[lead].host
    before = host.group(2).core.conf_state
    last = host.group(2).core.last_index
    with pytest.raises(ConfChangeError, match="node id must be > 0"):
        await host.propose_conf_change(2, change(ConfChangeType.ADD_VOTER, 0))
    # A change the membership does not allow: refused by the leader's core.
    every = ConfChange(tuple(ConfChangeSingle(ConfChangeType.REMOVE_NODE, n) for n in (1, 2, 3)))
    with pytest.raises(ConfChangeError, match="removes every voter"):
        await host.propose_conf_change(2, every)
    # Removing a node that is not there is already in force: nothing is proposed.
    await host.propose_conf_change(2, change(ConfChangeType.REMOVE_NODE, 9))
    follower = next(n for n in (1, 2, 3) if n != lead)
    with pytest.raises(ConfChangeError, match="node id must be > 0"):
        await cluster.nodes[follower].host.propose_conf_change(
            2, change(ConfChangeType.ADD_LEARNER, -1))
    assert host.group(2).core.conf_state == before
    assert host.group(2).core.last_index == last


async def test_compact_now_compacts_a_log_that_starts_at_index_one(cluster: JoinCluster) -> None:
    lead = await cluster.leader(3)
    await cluster.put(lead, 3, "a", "1")
    host = cluster.nodes[lead].host
    assert host.group(3).core.log.snapshot_index == 0
    index = await host.compact_now(3)
    assert index > 0 and host.group(3).core.log.snapshot_index == index
    assert await host.compact_now(3) == index  # once is enough


async def test_a_node_with_no_membership_joins_from_a_snapshot_then_votes(
        cluster: JoinCluster) -> None:
    for gid in GROUPS:
        await cluster.leader(gid)
    for i in range(10):
        await cluster.put(1 + i % 3, 2, f"before{i}", str(i))
    joiner = await cluster.start_node(4, voters=())
    await cluster.connect_and_run()
    # The replicas learn node 4's address the way accord's nodes do from the meta group.
    for n in cluster.nodes.values():
        if n.id != 4:
            n.transport.set_peer(4, "127.0.0.1", cluster.ports[4])
    assert joiner.host.group(2).core.conf_state.voters == ()

    # Added as a learner through a follower: no leader compacted beforehand, the
    # replicas do it once they applied the change, and node 4 starts from a snapshot.
    lead = await cluster.leader(2)
    via = next(n for n in (1, 2, 3) if n != lead)
    await cluster.nodes[via].host.propose_conf_change(
        2, change(ConfChangeType.ADD_LEARNER, 4), timeout=10)
    await cluster.put(via, 2, "after", "x")
    await joiner.host.read_barrier(2, timeout=10)
    expected = {f"before{i}": str(i) for i in range(10)} | {"after": "x"}
    assert joiner.sms[2].data == expected
    assert joiner.host.group(2).core.conf_state.learners == (4,)
    assert joiner.host.group(2).core.log.snapshot_index > 0

    cs = await cluster.nodes[via].host.propose_conf_change(
        2, change(ConfChangeType.ADD_VOTER, 4), timeout=10)
    assert cs.voters == (1, 2, 3, 4)
    # Remove a voter that is not the leader: three voters remain, writes go on.
    gone = next(n for n in (1, 2, 3) if n not in (lead, via))
    cs = await cluster.nodes[via].host.propose_conf_change(
        2, change(ConfChangeType.REMOVE_NODE, gone), timeout=10)
    assert gone not in cs.voters and len(cs.voters) == 3
    await cluster.put(4, 2, "last", "y")
    await joiner.host.read_barrier(2, timeout=10)
    assert joiner.sms[2].data["last"] == "y"
    assert joiner.host.group(2).core.conf_state.voters == cs.voters
