"""The client library against an in-process server: KV, sessions, locks, elections, failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from accord.client import (
    AccordClient,
    FencedWriteRejected,
    LeaseNotFound,
    NotHeld,
    NotLeader,
    Unavailable,
)
from accord.proto import rpc_pb2
from accord.services.kv.local import LocalBackend
from tests.integration.cluster import free_ports
from tests.locks.inproc import serve_local


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, LocalBackend]]:
    async with serve_local() as served:
        yield served


async def test_kv_helpers_and_failover_past_a_dead_endpoint(server: tuple[str, LocalBackend]) -> None:
    endpoint, _ = server
    (dead,) = free_ports(1)
    async with AccordClient([f"127.0.0.1:{dead}", endpoint], call_timeout_s=1.0) as c:
        rev = (await c.put("cfg/a", "1")).revision
        kv = await c.get("cfg/a")
        assert kv is not None and kv.value == b"1" and kv.mod_revision == rev
        assert c.pool.current == endpoint
        await c.put("cfg/b", b"2")
        assert [kv.key for kv in await c.get_prefix("cfg/")] == [b"cfg/a", b"cfg/b"]
        assert (await c.delete("cfg/a")).deleted == 1
        assert await c.get("cfg/a") is None


async def test_no_endpoint_answering_is_a_clear_error() -> None:
    (dead,) = free_ports(1)
    async with AccordClient([f"127.0.0.1:{dead}"], call_timeout_s=0.3, retry_budget_s=1.0) as c:
        with pytest.raises(Unavailable, match="no endpoint of"):
            await c.get("x")
    with pytest.raises(ValueError, match="no endpoints"):
        AccordClient([])


async def test_lock_context_manager_token_guarded_put_and_release(
    server: tuple[str, LocalBackend],
) -> None:
    endpoint, backend = server
    async with AccordClient([endpoint]) as c:
        async with c.lock("jobs/7", ttl=2) as lock:
            token = lock.token
            await lock.guarded_put("state/jobs-7", "running")
            contender = asyncio.create_task(c.lock("jobs/7", ttl=2).acquire())
            # the session keeps the 2 s lease alive well past its TTL
            await asyncio.sleep(3.0)
            assert not lock.lost.is_set() and not contender.done()
            await lock.guarded_put("state/jobs-7", "still-mine")
        second = await asyncio.wait_for(contender, 5)
        assert second.token > token
        with pytest.raises(FencedWriteRejected, match=f"fencing token {token} is stale"):
            await lock.guarded_put("state/jobs-7", "too-late")
        assert (await c.get("state/jobs-7")).value == b"still-mine"  # type: ignore[union-attr]
        await second.release()
        with pytest.raises(NotHeld):
            await second.release()
        # the session of each lock was revoked on release: no lease is left behind
        assert list((await backend.lease_leases()).leases) == []


async def test_lost_is_set_when_the_lease_is_revoked(server: tuple[str, LocalBackend]) -> None:
    endpoint, backend = server
    async with AccordClient([endpoint], recheck_s=0.5) as c:
        lock = await c.lock("jobs/8", ttl=5).acquire()
        assert lock.session is not None
        await backend.lease_revoke(rpc_pb2.LeaseRevokeRequest(ID=lock.session.id))
        await asyncio.wait_for(lock.lost.wait(), 5)
        with pytest.raises(FencedWriteRejected, match="not held by anyone"):
            await lock.guarded_put("state/jobs-8", "x")
        await lock.release()  # releasing a lost lock is quiet: lost already told the holder


async def test_session_of_unknown_lease_and_bad_ttl(server: tuple[str, LocalBackend]) -> None:
    endpoint, _ = server
    async with AccordClient([endpoint]) as c:
        with pytest.raises(LeaseNotFound, match="requested lease not found"):
            await c.put("k", "v", lease=0xABC)
        with pytest.raises(ValueError, match="positive"):
            c.lease(0)
        async with c.lease(2) as session:
            assert session.id and session.ttl >= 2
        assert session.lost.is_set()


async def test_election_campaign_observe_and_resign(server: tuple[str, LocalBackend]) -> None:
    endpoint, _ = server
    async with AccordClient([endpoint], recheck_s=0.5) as c:
        a, b = c.election("svc", ttl=2), c.election("svc", ttl=2)
        assert await a.leader() is None
        with pytest.raises(NotLeader):
            await a.proclaim("x")
        await a.campaign("node-a")
        seen: list[bytes] = []

        async def observe() -> None:
            async for kv in a.observe():
                seen.append(kv.value)
                if len(seen) == 3:
                    return

        observer = asyncio.create_task(observe())
        b_campaign = asyncio.create_task(b.campaign("node-b"))
        await asyncio.sleep(0.3)
        assert not b_campaign.done()
        await a.proclaim("node-a:v2")
        await a.resign()
        await asyncio.wait_for(b_campaign, 5)
        leader = await b.leader()
        assert leader is not None and leader.value == b"node-b"
        await asyncio.wait_for(observer, 5)
        assert seen == [b"node-a", b"node-a:v2", b"node-b"]
        await b.resign()


async def test_lock_delay_holds_the_lock_back_after_a_holder_is_lost(
    server: tuple[str, LocalBackend],
) -> None:
    endpoint, backend = server
    async with AccordClient([endpoint], recheck_s=0.5) as c:
        lost = await c.lock("jobs/10", ttl=5, lock_delay=2.0).acquire()
        contender = asyncio.create_task(c.lock("jobs/10", ttl=5).acquire())
        await asyncio.sleep(0.2)
        assert lost.session is not None
        await backend.lease_revoke(rpc_pb2.LeaseRevokeRequest(ID=lost.session.id))
        await asyncio.wait_for(lost.lost.wait(), 5)
        await asyncio.sleep(1.0)
        assert not contender.done()  # at least 2 s of lock-delay after the loss
        nxt = await asyncio.wait_for(contender, 10)
        assert nxt.token > lost.token
        await nxt.release()
        await lost.release()
    with pytest.raises(ValueError, match="lock_delay"):
        AccordClient([endpoint]).lock("x", lock_delay=-1)
