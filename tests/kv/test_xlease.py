"""A lease revoke and expiry across shards at one revision, in process (no Raft).

A lease whose keys lie on several shards is revoked through intents that also hold the
lease id (``accord/services/kv/xlease.py``): every key goes at one revision R on every
shard (a Range at R-1 sees them all, at R none), a watcher over all shards sees every
delete at R, a Put with the lease during the revoke either lands before and goes at R or
fails with lease-not-found after, and a coordinator that dies after any step leaves
all-or-nothing once the recovery pass ran. A lease whose keys lie on one shard or none is
revoked the same way: a Put with it on another shard, started at every turn of the event
loop through the revoke, is before it or after it, never between. The deliberately broken
variants (each shard deleting at its own revision; Puts not held back; the older path of a
one-shard lease, shard 0 first and then each other shard) are caught by the same checks.
A serializable read over every shard on a member whose replica of one shard lags behind
the others never shows some of a revoked lease's keys deleted and others not.
"""

from __future__ import annotations

import asyncio

import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.mvcc import MOD, VALUE
from accord.services.kv.xcoord import TXN_TIMEOUT_MS
from tests.kv.test_xshard import SHARDS, Shards, hold_commits, log_commits, spread_keys


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
    await b.xcoord.drain()
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


async def _race(step: int, keys_on: tuple[int, ...], expire: bool, broken: bool) -> list[str]:
    """A revoke (``expire``: an expiry) of a lease whose keys lie on ``keys_on`` (one key
    per shard named, maybe none), and a Put with the lease on shard ``SHARDS - 1``
    started ``step`` turns of the event loop after it (every command applied takes one);
    returns how the outcome differs from one etcd's, where the revoke is atomic: the Put
    is before it (its key deleted at the revoke's revision R, with every other key of the
    lease) or after it (lease-not-found)."""
    b = Shards()
    b.broken_lease_plain_path = broken
    lease = (await b.lease_grant(pb.LeaseGrantRequest(TTL=5))).ID
    pool = spread_keys(40)
    keys = [next(k for k in pool if b.shard_of(k) == s) for s in keys_on]
    late = next(k for k in pool if b.shard_of(k) == SHARDS - 1 and k not in keys)
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v", lease=lease))
    if expire:
        b.clock += 5_001
        revoking = asyncio.create_task(b.expire_leases())
    else:
        revoking = asyncio.create_task(b.lease_revoke(pb.LeaseRevokeRequest(ID=lease)))
    for _ in range(step):
        await asyncio.sleep(0)
    put = asyncio.create_task(b.put(pb.PutRequest(key=late, value=b"late", lease=lease)))
    done, outcome = await asyncio.gather(revoking, put, return_exceptions=True)
    await b.xcoord.drain()
    if isinstance(done, BaseException):
        raise done
    wrong = []
    if isinstance(outcome, BaseException):
        if not (isinstance(outcome, errors.EtcdError)
                and outcome.message == errors.LEASE_NOT_FOUND.message):
            raise outcome
        if b.machines[SHARDS - 1].store.versions(late):
            wrong.append("the Put failed, yet its key was written")
    else:
        keys.append(late)
    ends = {k: b.machines[b.shard_of(k)].store.versions(k)[-1] for k in keys}
    if any(rec[VALUE] is not None for rec in ends.values()):
        wrong.append("a key outlived its lease")
    deleted_at = {rec[MOD] for rec in ends.values()}
    if len(deleted_at) > 1:
        wrong.append(f"the lease's keys were deleted at several revisions: {deleted_at}")
    rev = done if expire else done.header.revision
    if expire:
        assert done == [lease]
        rev = min(deleted_at, default=0)
    elif keys and deleted_at != {rev}:
        wrong.append(f"keys deleted at {deleted_at}, not at the revoke's revision {rev}")
    if not isinstance(outcome, BaseException) and outcome.header.revision >= rev:
        wrong.append(f"a Put at {outcome.header.revision} succeeded after the revoke at {rev}")
    if any(lease in m.leases.leases for m in b.machines):
        wrong.append("a shard still holds the lease")
    return wrong


RACE_STEPS = range(24)
"""Every turn of the event loop from the revoke's start to past its last command."""


@pytest.mark.parametrize("expire", [False, True])
@pytest.mark.parametrize("keys_on", [(), (0,), (1,), (0, 2)])
async def test_a_put_with_the_lease_racing_a_revoke_is_before_or_after_it(
        keys_on: tuple[int, ...], expire: bool) -> None:
    for step in RACE_STEPS:
        assert await _race(step, keys_on, expire, broken=False) == [], step


@pytest.mark.parametrize("expire", [False, True])
@pytest.mark.parametrize("keys_on", [(0,), (1,)])
async def test_the_broken_variant_revoking_a_one_shard_lease_shard_by_shard_is_caught(
        keys_on: tuple[int, ...], expire: bool) -> None:
    found = [w for step in RACE_STEPS for w in await _race(step, keys_on, expire, broken=True)]
    assert found, "the older path's race: a Put on another shard lands mid-revoke"
    assert any("several revisions" in w or "after the revoke" in w for w in found), found


async def test_a_watch_over_all_shards_sees_every_delete_at_one_revision() -> None:
    b = Shards()
    lease, keys = await _leased(b)
    w = b.watch_hub.watch(b"k", b"l", start_revision=b.revision + 1)
    rev = (await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))).header.revision
    await b.xcoord.drain()
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
    # Answered once the decision is in (the other shards commit in the background).
    assert t.done() == (stall_after > SHARDS)
    t.cancel()
    await b.xcoord.close()
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
    await b.xcoord.drain()
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


async def _revoke_on_a_lagging_replica(broken: bool) -> tuple[int, int, int, int]:
    """A follower whose replicas of every shard but one applied a revoke while that
    one has not applied even its prepare: how many of the lease's keys a serializable
    read over every shard shows there, then with the prepare applied, then all of it
    (after the number of keys)."""
    leader = Shards()
    logs = log_commits(leader)
    lease, keys = await _leased(leader)
    before = [len(log) for log in logs]
    await leader.lease_revoke(pb.LeaseRevokeRequest(ID=lease))
    await leader.xcoord.drain()
    follower = Shards()
    follower.broken_serializable_parts = broken
    lag = 1
    for shard, log in enumerate(logs):
        for command in log[:before[shard] if shard == lag else len(log)]:
            follower.machines[shard].apply(command)
    every = pb.RangeRequest(key=b"k", range_end=b"l", serializable=True, count_only=True)
    seen = [(await follower.range(every)).count]
    follower.machines[lag].apply(logs[lag][before[lag]])  # the prepare: an intent
    seen.append((await follower.range(every)).count)
    for command in logs[lag][before[lag] + 1:]:
        follower.machines[lag].apply(command)
    seen.append((await follower.range(every)).count)
    return len(keys), seen[0], seen[1], seen[2]


async def test_a_serializable_read_never_shows_part_of_a_revoke_on_a_lagging_replica() -> None:
    n, first, prepared, after = await _revoke_on_a_lagging_replica(False)
    assert (first, prepared, after) == (n, n, 0), "all of the lease's keys, then none"


async def test_the_broken_serializable_read_shows_part_of_a_revoke() -> None:
    n, first, _prepared, after = await _revoke_on_a_lagging_replica(True)
    assert 0 < first < n and after == 0, "some of the keys shown deleted, some not"
