"""A lease revoke and expiry across shards at one revision, in process (no Raft).

A lease whose keys lie on several shards is revoked through intents that also hold the
lease id (``accord/services/kv/xlease.py``): every key goes at one revision R on every
shard (a Range at R-1 sees them all, at R none), a watcher over all shards sees every
delete at R, a Put with the lease during the revoke either lands before and goes at R or
fails with lease-not-found after, and a coordinator that dies after any step leaves
all-or-nothing once the recovery pass ran. The deliberately broken variants (each shard
deleting at its own revision; Puts not held back) are caught by the same checks.
"""

from __future__ import annotations

import asyncio

import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.xcoord import TXN_TIMEOUT_MS
from tests.kv.test_xshard import SHARDS, Shards, hold_commits, spread_keys


async def _leased(b: Shards, ttl: int = 60) -> tuple[int, list[bytes]]:
    lease = (await b.lease_grant(pb.LeaseGrantRequest(TTL=ttl))).ID
    keys = spread_keys(8)
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v", lease=lease))
    assert len({b.shard_of(k) for k in keys}) == SHARDS
    return lease, keys


async def _count(b: Shards, rev: int = 0) -> int:
    return (await b.range(pb.RangeRequest(key=b"k", range_end=b"l", revision=rev))).count


async def _one_revision(b: Shards, rev: int, n: int) -> bool:
    return await _count(b, rev - 1) == n and await _count(b, rev) == 0


async def test_a_revoke_deletes_every_key_on_every_shard_at_one_revision() -> None:
    b = Shards()
    lease, keys = await _leased(b)
    rev = (await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))).header.revision
    assert await _one_revision(b, rev, len(keys))
    assert all(lease not in m.leases.leases for m in b.machines)
    assert all(not m.intents for m in b.machines)
    with pytest.raises(errors.EtcdError) as e:
        await b.put(pb.PutRequest(key=keys[0], value=b"x", lease=lease))
    assert e.value.message == errors.LEASE_NOT_FOUND.message
    with pytest.raises(errors.EtcdError) as e:
        await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))
    assert e.value.message == errors.LEASE_NOT_FOUND.message


async def test_the_broken_variant_deleting_at_each_shards_own_revision_is_caught() -> None:
    b = Shards()
    lease, keys = await _leased(b)
    b.broken_lease_own_revisions = True
    rev = (await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))).header.revision
    assert await _count(b) == 0  # every key went, but not at one revision
    assert not await _one_revision(b, rev, len(keys))


async def test_a_lease_on_one_shard_keeps_the_plain_path() -> None:
    b = Shards()
    lease = (await b.lease_grant(pb.LeaseGrantRequest(TTL=60))).ID
    keys = [f"/one/x/{i}".encode() for i in range(3)]
    assert len({b.shard_of(k) for k in keys}) == 1
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v", lease=lease))
    sent = b.x_sent
    await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))
    assert b.x_sent == sent, "no cross-shard command for a one-shard lease"
    assert (await b.range(pb.RangeRequest(key=b"/one/x/", range_end=b"/one/x0"))).count == 0


async def test_a_watch_over_all_shards_sees_every_delete_at_one_revision() -> None:
    b = Shards()
    lease, keys = await _leased(b)
    w = b.watch_hub.watch(b"k", b"l", start_revision=b.revision + 1)
    rev = (await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))).header.revision
    events = []
    for _ in range(100):
        batch = w.poll()
        if batch is None:
            break
        events.extend(batch.events)
    assert sorted(e.kv.key for e in events) == keys
    assert {e.kv.mod_revision for e in events} == {rev}
    assert all(e.type == e.DELETE for e in events)


async def _put_during_revoke(broken: bool) -> tuple[Shards, bytes, BaseException | None]:
    b = Shards()
    lease, _keys = await _leased(b)
    for m in b.machines:
        m.broken_lease_puts = broken
    new = next(k for k in spread_keys(40) if b.shard_of(k) == SHARDS - 1
               and k not in _keys)
    gate = hold_commits(b)
    revoking = asyncio.create_task(b.lease_revoke(pb.LeaseRevokeRequest(ID=lease)))
    for _ in range(50):
        await asyncio.sleep(0)
    assert all(m.intents for m in b.machines), "prepared everywhere, undecided"
    put = asyncio.create_task(b.put(pb.PutRequest(key=new, value=b"late", lease=lease)))
    for _ in range(50):
        await asyncio.sleep(0)
    gate.set()
    await revoking
    outcome = (await asyncio.gather(put, return_exceptions=True))[0]
    return b, new, outcome if isinstance(outcome, BaseException) else None


async def test_a_put_with_the_lease_during_the_revoke_fails_after_it() -> None:
    b, new, failed = await _put_during_revoke(broken=False)
    assert isinstance(failed, errors.EtcdError)
    assert failed.message == errors.LEASE_NOT_FOUND.message
    assert (await b.range(pb.RangeRequest(key=new))).count == 0


async def test_the_broken_variant_letting_a_put_attach_mid_revoke_is_caught() -> None:
    b, new, failed = await _put_during_revoke(broken=True)
    assert failed is None
    (kv,) = (await b.range(pb.RangeRequest(key=new))).kvs
    assert all(kv.lease not in m.leases.leases for m in b.machines), \
        "the key outlives its lease: what the intent's lease hold prevents"


X_STEPS = SHARDS + 1 + (SHARDS - 1)
"""The revoke's format-3 proposals: a prepare per shard, the decision, the commits."""


@pytest.mark.parametrize("stall_after", range(X_STEPS))
async def test_a_coordinator_dying_after_any_step_leaves_all_or_nothing(stall_after: int) -> None:
    b = Shards()
    lease, keys = await _leased(b)
    w = b.watch_hub.watch(b"k", b"l", start_revision=b.revision + 1)
    b.stall_after = b.x_sent + stall_after
    t = asyncio.create_task(b.lease_revoke(pb.LeaseRevokeRequest(ID=lease)))
    for _ in range(100):
        await asyncio.sleep(0)
    assert not t.done()
    t.cancel()
    b.stall_after = None
    b.clock += TXN_TIMEOUT_MS + 1
    await b.resolve_stale_intents()
    assert all(not m.intents for m in b.machines), "every intent is resolved"
    left = await _count(b)
    holders = [m for m in b.machines if lease in m.leases.leases]
    events = []
    while (batch := w.poll()) is not None:
        events.extend(batch.events)
    if left:
        assert left == len(keys) and len(holders) == SHARDS and not events, "nothing happened"
        await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))  # and the lease is not stuck
        assert await _count(b) == 0
    else:
        assert not holders
        assert len(events) == len(keys) and len({e.kv.mod_revision for e in events}) == 1
        assert await _one_revision(b, events[0].kv.mod_revision, len(keys))


async def test_an_expiry_deletes_every_key_on_every_shard_at_one_revision() -> None:
    b = Shards()
    lease, keys = await _leased(b, ttl=5)
    w = b.watch_hub.watch(b"k", b"l", start_revision=b.revision + 1)
    assert await b.expire_leases() == []
    b.clock += 5_001
    assert await b.expire_leases() == [lease]
    events = []
    while (batch := w.poll()) is not None:
        events.extend(batch.events)
    assert sorted(e.kv.key for e in events) == keys
    (rev,) = {e.kv.mod_revision for e in events}
    assert await _one_revision(b, rev, len(keys))
    assert all(lease not in m.leases.leases for m in b.machines)


async def test_the_broken_variant_expiring_at_each_shards_own_revision_is_caught() -> None:
    b = Shards()
    lease, keys = await _leased(b, ttl=5)
    b.broken_lease_own_revisions = True
    w = b.watch_hub.watch(b"k", b"l", start_revision=b.revision + 1)
    b.clock += 5_001
    assert await b.expire_leases() == [lease]
    events = []
    while (batch := w.poll()) is not None:
        events.extend(batch.events)
    assert events, "shard 0's share at the decision's revision"
    assert await _count(b) == 0  # every key went, but not at one revision
    assert not await _one_revision(b, events[0].kv.mod_revision, len(keys))
