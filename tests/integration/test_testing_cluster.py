"""``accord.testing``: the in-process cluster users' tests get, driven as they would."""

from __future__ import annotations

import asyncio
import socket

import pytest

import accord.testing
from accord.proto import rpc_pb2
from accord.testing import TestCluster, cluster


async def test_a_killed_leader_is_replaced_and_catches_up_after_restart() -> None:
    async with accord.testing.cluster(nodes=3) as c:  # as the README writes it
        assert len(c.endpoints) == 3 and len(set(c.endpoints)) == 3
        client = c.client()
        await client.put("/cfg/a", "1")
        leader = await c.wait_leader()
        await c.kill(leader)
        assert not c.nodes[leader].running
        # A write the dead leader may have taken is answered OutcomeUnknown (never sent
        # twice); once a new leader serves, the client's next write fails over to it.
        assert (await c.wait_leader()) != leader
        await client.put("/cfg/a", "2")
        await c.restart(leader)
        node = c.nodes[leader].node
        assert node is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline:  # the restarted member catches up on its own
            r = node.kv.range(rpc_pb2.RangeRequest(key=b"/cfg/a"))
            if r.kvs and r.kvs[0].value == b"2":
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the restarted node never applied the write it missed")


async def test_the_pytest_fixture_gives_a_running_cluster(accord_cluster: TestCluster) -> None:
    client = accord_cluster.client()
    put = await client.put("k", "v")
    kv = await client.get("k")
    assert kv is not None and kv.value == b"v" and kv.mod_revision == put.revision
    assert all(n.running for n in accord_cluster.nodes)


async def test_a_node_that_is_down_cannot_be_killed_again() -> None:
    async with cluster(nodes=1) as c:
        await c.kill(0)
        with pytest.raises(ValueError, match="not running"):
            await c.kill(0)
        await c.restart(0)
        with pytest.raises(ValueError, match="is running"):
            await c.restart(0)


def test_free_ports_lie_below_the_ephemeral_range_and_bind() -> None:
    """Ports handed to daemons come from below the kernel's ephemeral range, so no
    outgoing connection (a node dialing its peers while the next node starts) can take
    one before its daemon binds it; blocks are consecutive, apart, and bindable."""
    lo, hi = accord.testing._listen_range()
    ports = accord.testing.free_ports(20)
    assert len(set(ports)) == 20 and all(lo <= p < hi for p in ports)
    bases = accord.testing.free_port_blocks(5, 3, avoid=ports)
    blocks = [set(range(b, b + 3)) for b in bases]
    assert all(lo <= b and b + 3 <= hi for b in bases)
    assert not set().union(*blocks) & set(ports)
    assert sum(len(b) for b in blocks) == len(set().union(*blocks))
    for p in [*ports, *set().union(*blocks)]:
        with socket.socket() as s:
            s.bind((accord.testing.HOST, p))
