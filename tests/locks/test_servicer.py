"""etcd's v3lock and v3election services over gRPC, served from the lock recipes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from accord.locks import keys
from accord.proto import (
    rpc_pb2,
    rpc_pb2_grpc,
    v3election_pb2,
    v3election_pb2_grpc,
    v3lock_pb2,
    v3lock_pb2_grpc,
)
from accord.services.kv.local import LocalBackend
from tests.locks.inproc import serve_local

_lock: Any = v3lock_pb2_grpc
_elect: Any = v3election_pb2_grpc
_rpc: Any = rpc_pb2_grpc


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.lock = _lock.LockStub(channel)
        self.election = _elect.ElectionStub(channel)
        self.lease = _rpc.LeaseStub(channel)
        self.kv = _rpc.KVStub(channel)

    async def grant(self, ttl: int = 30) -> int:
        return int((await self.lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=ttl))).ID)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Stubs, LocalBackend]]:
    async with serve_local() as (endpoint, backend):
        async with grpc.aio.insecure_channel(endpoint) as channel:
            yield Stubs(channel), backend


async def test_lock_returns_etcd_key_and_unlock_hands_over(served: tuple[Stubs, LocalBackend]) -> None:
    s, backend = served
    a, b = await s.grant(), await s.grant()
    got = await s.lock.Lock(v3lock_pb2.LockRequest(name=b"gw", lease=a), timeout=5)
    assert got.key == b"gw/" + format(a, "x").encode()
    assert got.header.revision >= 2 and got.header.member_id == backend.member_id
    waiter = asyncio.ensure_future(s.lock.Lock(v3lock_pb2.LockRequest(name=b"gw", lease=b), timeout=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await s.lock.Unlock(v3lock_pb2.UnlockRequest(key=got.key), timeout=5)
    second = await waiter
    assert second.key == b"gw/" + format(b, "x").encode()
    # the grant record now names the second holder's key's create revision
    kv = (await s.kv.Range(rpc_pb2.RangeRequest(key=second.key))).kvs[0]
    rec = (await s.kv.Range(rpc_pb2.RangeRequest(key=keys.grant_key(b"gw")))).kvs[0]
    assert keys.decode_grant(rec.value, rec.mod_revision).token == kv.create_revision  # type: ignore[union-attr]


async def test_lock_errors_are_clear_and_change_nothing(served: tuple[Stubs, LocalBackend]) -> None:
    s, backend = served
    rev = backend.revision
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.lock.Lock(v3lock_pb2.LockRequest(name=b"gw", lease=0x77), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "etcdserver: requested lease not found"
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.lock.Lock(v3lock_pb2.LockRequest(name=b"", lease=1), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.lock.Unlock(v3lock_pb2.UnlockRequest(key=b"gw/abc"), timeout=5)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not held" in (e.value.details() or "")
    assert backend.revision == rev


async def test_cancelled_lock_call_leaves_the_queue(served: tuple[Stubs, LocalBackend]) -> None:
    s, _backend = served
    a, b = await s.grant(), await s.grant()
    await s.lock.Lock(v3lock_pb2.LockRequest(name=b"cx", lease=a), timeout=5)
    call = s.lock.Lock(v3lock_pb2.LockRequest(name=b"cx", lease=b), timeout=10)
    await asyncio.sleep(0.2)
    call.cancel()
    for _ in range(50):
        r = await s.kv.Range(rpc_pb2.RangeRequest(key=b"cx/", range_end=b"cx0"))
        if r.count == 1:
            break
        await asyncio.sleep(0.05)
    assert [kv.lease for kv in r.kvs] == [a]


async def test_election_campaign_proclaim_leader_observe_resign(
    served: tuple[Stubs, LocalBackend],
) -> None:
    s, _backend = served
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.election.Leader(v3election_pb2.LeaderRequest(name=b"el"), timeout=5)
    assert e.value.details() == "election: no leader"
    a, b = await s.grant(), await s.grant()
    won = await s.election.Campaign(v3election_pb2.CampaignRequest(name=b"el", lease=a, value=b"A"), timeout=5)
    assert won.leader.key == b"el/" + format(a, "x").encode() and won.leader.lease == a
    observed: list[bytes] = []
    stream = s.election.Observe(v3election_pb2.LeaderRequest(name=b"el"), timeout=20)

    async def watch() -> None:
        async for resp in stream:
            observed.append(resp.kv.value)
            if len(observed) == 3:
                return

    watcher = asyncio.ensure_future(watch())
    second = asyncio.ensure_future(s.election.Campaign(
        v3election_pb2.CampaignRequest(name=b"el", lease=b, value=b"B"), timeout=10,
    ))
    await asyncio.sleep(0.2)
    assert not second.done()
    await s.election.Proclaim(v3election_pb2.ProclaimRequest(leader=won.leader, value=b"A2"), timeout=5)
    leader = await s.election.Leader(v3election_pb2.LeaderRequest(name=b"el"), timeout=5)
    assert leader.kv.value == b"A2"
    await s.election.Resign(v3election_pb2.ResignRequest(leader=won.leader), timeout=5)
    won_b = await second
    assert won_b.leader.rev > won.leader.rev
    await asyncio.wait_for(watcher, 10)
    assert observed == [b"A", b"A2", b"B"]
    # the resigned leader can no longer proclaim or resign
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.election.Proclaim(v3election_pb2.ProclaimRequest(leader=won.leader, value=b"x"), timeout=5)
    assert e.value.details() == "election: not leader"
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.election.Resign(v3election_pb2.ResignRequest(), timeout=5)
    assert e.value.details() == '"leader" field must be provided'
