"""Lease checkpoints on a real in-process node: logged while a lease exists, not when
there is none (an idle cluster must not write a Raft entry every interval for nothing)."""

from __future__ import annotations

import asyncio

import pytest

import accord.node.server as server
from accord.node.backend import KV_GROUP
from accord.testing import TestCluster, cluster


def _last_index(c: TestCluster) -> int:
    node = c.nodes[0].node
    assert node is not None
    return int(node.host.group(KV_GROUP).core.log.last_index())


async def test_checkpoints_are_logged_while_a_lease_lives_and_not_without_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "LEASE_CHECK_INTERVAL", 0.05)
    monkeypatch.setattr(server, "LEASE_CHECKPOINT_INTERVAL", 0.1)
    async with cluster(nodes=1) as c:
        client = c.client()
        await client.put("/warm", "1")
        await asyncio.sleep(0.3)  # the loop's first rounds after the election
        quiet = _last_index(c)
        await asyncio.sleep(1.0)  # ten checkpoint intervals
        assert _last_index(c) == quiet, "entries logged on a store without leases"

        lease = await client.lease_grant(60)
        granted = _last_index(c)
        await asyncio.sleep(1.0)
        assert _last_index(c) >= granted + 3, "no checkpoints while a lease lives"
        assert await client.lease_ttl(lease.id) > 50  # the checkpoints kept its TTL

        await client.lease_revoke(lease.id)
        await asyncio.sleep(0.3)
        revoked = _last_index(c)
        await asyncio.sleep(1.0)
        assert _last_index(c) == revoked, "checkpoints went on after the last lease"
