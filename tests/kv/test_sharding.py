"""Keys to shards, and the KV backend over several shards (in process, no Raft).

The backend here applies each command straight to its shard's state machine, in an
order the test controls, so the cross-shard rules (floors, merges, leases on every
shard, refused Txns) are checked without a cluster; the replicated backend shares
this code and is exercised through real daemons in tests/integration.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors, sharding
from accord.services.kv.backend import HeaderInfo, StateMachineBackend
from accord.services.kv.errors import EtcdError
from accord.services.kv.revorder import RevisionOrder, tick_clock
from accord.services.kv.statemachine import KVStateMachine
from tests.kv.helpers import op_get, op_put


def _prefix_end(p: bytes) -> bytes:
    return p[:-1] + bytes([p[-1] + 1])


# --- the partition rule ----------------------------------------------------------------------


def test_partition_keys_follow_the_documented_rule() -> None:
    pk = sharding.partition_key
    assert pk(b"/ckpt/job-17/rank-3/shard-0") == b"/ckpt/job-17"
    assert pk(b"/ckpt/job-17") == b"/ckpt/job-17"
    assert pk(b"/registry/pods/default/web") == b"/registry/pods"
    assert pk(b"/a") == b"/a"
    assert pk(b"mylock/694d7a1b") == b"mylock"
    assert pk(b"a/b/c") == b"a"
    assert pk(b"plain") == b"plain"
    assert pk(b"\x00accord-lock/jobs/7") == pk(b"jobs/7/694d") == b"jobs"
    assert pk(b"\x00accord-lock//locks/a") == pk(b"/locks/a/694d") == b"/locks/a"


def test_one_job_and_one_lock_queue_sit_on_one_shard() -> None:
    n = 8
    job = {sharding.shard_of(f"/ckpt/job-17/rank-{r}".encode(), n) for r in range(64)}
    queue = {sharding.shard_of(f"mylock/{i:x}".encode(), n) for i in range(64)}
    assert len(job) == 1 and len(queue) == 1
    assert sharding.shards_of_range(b"/ckpt/job-17/", _prefix_end(b"/ckpt/job-17/"), n) == [
        job.pop()
    ]
    assert sharding.shards_of_range(b"mylock/", _prefix_end(b"mylock/"), n) == [queue.pop()]
    # Keys of one partition are spread by hash: a range across partitions goes everywhere.
    assert sharding.shards_of_range(b"/ckpt/", _prefix_end(b"/ckpt/"), n) == list(range(n))
    assert sharding.shards_of_range(b"a", b"b", n) == list(range(n))
    assert sharding.shards_of_range(b"\x00", b"\x00", n) == list(range(n))
    # Lock grant records go with their lock's queue, so their prefix spans every shard.
    grants = sharding.LOCK_GRANT_PREFIX
    assert sharding.shards_of_range(grants, _prefix_end(grants), n) == list(range(n))
    assert sharding.shards_of_range(grants + b"mylock/", _prefix_end(grants + b"mylock/"), n) == [
        sharding.shard_of(b"mylock/x", n)
    ]


_keys = st.lists(
    st.sampled_from([b"", b"/", b"a", b"b", b"ab", b"\xff", sharding.LOCK_GRANT_PREFIX]),
    max_size=5,
).map(b"".join)


@given(start=_keys, end=_keys, keys=st.lists(_keys, max_size=20), n=st.integers(1, 9))
def test_a_range_is_sent_to_every_shard_that_holds_one_of_its_keys(
    start: bytes, end: bytes, keys: list[bytes], n: int
) -> None:
    """The routing rule never misses a shard: the property a range's answer depends on."""
    targets = set(sharding.shards_of_range(start, end, n))
    for k in keys:
        inside = k == start if not end else (k >= start and (end == b"\x00" or k < end))
        if inside:
            assert sharding.shard_of(k, n) in targets, (k, start, end)


# --- the backend over several shards ---------------------------------------------------------


class InProcessShards(StateMachineBackend):
    """Commands applied directly to their shard; ``hold`` parks commands to a shard."""

    def __init__(self, shards: int) -> None:
        super().__init__([KVStateMachine(lease_id_seed=i + 2) for i in range(shards)])
        self.commands: list[tuple[int, bytes]] = []
        self.order = RevisionOrder(shards, clock_ns=tick_clock())

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        self.commands.append((shard, command))
        await asyncio.sleep(0)
        return self.machines[shard].apply(command)

    async def read_barrier(self, shard: int = 0) -> None:
        await asyncio.sleep(0)

    def header_info(self) -> HeaderInfo:
        return HeaderInfo(1, 1, 1, 1)


def _keys_on_distinct_shards(b: InProcessShards, count: int) -> list[bytes]:
    seen: dict[int, bytes] = {}
    i = 0
    while len(seen) < count:
        key = f"k{i}".encode()
        seen.setdefault(b.shard_of(key), key)
        i += 1
    return list(seen.values())


async def test_a_range_over_shards_is_one_snapshot_and_later_writes_come_after_it() -> None:
    b = InProcessShards(4)
    keys = _keys_on_distinct_shards(b, 4)
    for _ in range(5):
        await b.put(pb.PutRequest(key=keys[0], value=b"x"))  # shard of keys[0] runs ahead
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v1"))
    whole = await b.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00"))
    r = whole.header.revision
    assert [kv.key for kv in whole.kvs] == sorted(keys) and whole.count == 4
    assert all(m.revision >= r for m in b.machines), "every shard floored at R"
    for k in keys:
        resp = await b.put(pb.PutRequest(key=k, value=b"v2"))
        assert resp.header.revision > r
    again = await b.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", revision=r))
    assert [(kv.key, kv.value) for kv in again.kvs] == [(kv.key, kv.value) for kv in whole.kvs]
    with pytest.raises(EtcdError) as e:
        await b.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", revision=b.revision + 1))
    assert e.value.message == errors.FUTURE_REV.message


async def test_merged_ranges_honour_limit_sort_and_count() -> None:
    b = InProcessShards(3)
    for i in range(20):
        await b.put(pb.PutRequest(key=f"k{i:02d}".encode(), value=f"{19 - i:02d}".encode()))
    resp = await b.range(pb.RangeRequest(key=b"k", range_end=b"l", limit=5))
    assert [kv.key for kv in resp.kvs] == [f"k{i:02d}".encode() for i in range(5)]
    assert resp.count == 20 and resp.more
    desc = await b.range(pb.RangeRequest(
        key=b"k", range_end=b"l", limit=3, sort_order=pb.RangeRequest.DESCEND,
        sort_target=pb.RangeRequest.VALUE))
    assert [kv.value for kv in desc.kvs] == [b"19", b"18", b"17"]
    counted = await b.range(pb.RangeRequest(key=b"k", range_end=b"l", count_only=True))
    assert counted.count == 20 and not counted.kvs
    ser = await b.range(pb.RangeRequest(key=b"k", range_end=b"l", serializable=True))
    assert len(ser.kvs) == 20


async def test_a_txn_across_shards_commits_on_both_at_one_revision() -> None:
    b = InProcessShards(4)
    k1, k2 = _keys_on_distinct_shards(b, 2)
    resp = await b.txn(pb.TxnRequest(success=[op_put(k1), op_put(k2)]))
    assert resp.succeeded
    for k in (k1, k2):  # a linearizable read waits for a commit still under way
        got = await b.range(pb.RangeRequest(key=k))
        assert got.kvs[0].mod_revision == resp.header.revision
    # etcd's lock recipe: put the contender key and read the whole queue, in one Txn.
    ok = await b.txn(pb.TxnRequest(
        success=[op_put(b"mylock/1"), op_get(b"mylock/", _prefix_end(b"mylock/"))]))
    assert ok.succeeded and ok.responses[1].response_range.count == 1


async def test_a_lease_reaches_every_shard_and_its_revocation_deletes_keys_on_all() -> None:
    b = InProcessShards(4)
    keys = _keys_on_distinct_shards(b, 4)
    lease = await b.lease_grant(pb.LeaseGrantRequest(TTL=60))
    assert all(lease.ID in m.leases.leases for m in b.machines)
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v", lease=lease.ID))
    ttl = await b.lease_time_to_live(pb.LeaseTimeToLiveRequest(ID=lease.ID, keys=True))
    assert sorted(ttl.keys) == sorted(keys)
    await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease.ID))
    left = await b.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00"))
    assert left.count == 0
    assert not any(lease.ID in m.leases.leases for m in b.machines)
    with pytest.raises(EtcdError) as e:
        await b.put(pb.PutRequest(key=keys[1], value=b"v", lease=lease.ID))
    assert e.value.message == errors.LEASE_NOT_FOUND.message


async def test_expired_leases_leave_every_shard_and_strays_are_reaped() -> None:
    b = InProcessShards(3)
    keys = _keys_on_distinct_shards(b, 3)
    clock = [1_000_000]
    b.lease_clock = lambda: (clock[0], 0)  # type: ignore[method-assign]
    lease = await b.lease_grant(pb.LeaseGrantRequest(TTL=5))
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v", lease=lease.ID))
    clock[0] += 6_000
    assert await b.expire_leases() == [lease.ID]
    assert (await b.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00"))).count == 0
    # A revocation interrupted after shard 0: the lease is left on another shard.
    stray = await b.lease_grant(pb.LeaseGrantRequest(TTL=60))
    await b.put(pb.PutRequest(key=keys[2], value=b"v", lease=stray.ID))
    home = b.machines[0]
    home.apply(home.encode_lease_revoke(pb.LeaseRevokeRequest(ID=stray.ID)))
    assert b.stray_leases() == {stray.ID}
    await b.reap_stray_leases(b.stray_leases())
    assert b.stray_leases() == set()
    assert (await b.range(pb.RangeRequest(key=keys[2]))).count == 0


async def test_compaction_reaches_every_shard_and_deletes_span_shards() -> None:
    b = InProcessShards(3)
    keys = _keys_on_distinct_shards(b, 3)
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"1"))
        await b.put(pb.PutRequest(key=k, value=b"2"))
    top = b.revision
    await b.compact(pb.CompactionRequest(revision=top))
    assert all(m.compact_revision == top for m in b.machines)
    with pytest.raises(EtcdError) as e:
        await b.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", revision=top - 1))
    assert e.value.message == errors.COMPACTED.message
    gone = await b.delete_range(pb.DeleteRangeRequest(key=b"k", range_end=b"l", prev_kv=True))
    assert gone.deleted == 3 and sorted(kv.key for kv in gone.prev_kvs) == sorted(keys)


async def test_hash_kv_agrees_between_replicas_with_the_same_history() -> None:
    a, b = InProcessShards(3), InProcessShards(3)
    for be in (a, b):
        for i in range(10):
            await be.put(pb.PutRequest(key=f"h{i}".encode(), value=b"v"))
    assert (await a.hash_kv(0)).hash == (await b.hash_kv(0)).hash
    await a.put(pb.PutRequest(key=b"h0", value=b"other"))
    await b.put(pb.PutRequest(key=b"h0", value=b"v2"))
    assert (await a.hash_kv(0)).hash != (await b.hash_kv(0)).hash


async def test_hash_kv_after_a_compaction_hashes_shards_not_written_since() -> None:
    """A compaction floors every shard at its revision; a shard written nothing since
    stands at that revision, and HashKV at any later revision (what ``etcdctl endpoint
    hashkv`` asks after a compaction) hashes it as it stands instead of refusing it as
    compacted. At or below the compaction it is refused, as etcd 3.4 refuses."""
    b = InProcessShards(3)
    keys = _keys_on_distinct_shards(b, 3)
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"1"))
    top = b.revision
    await b.compact(pb.CompactionRequest(revision=top))
    later = (await b.put(pb.PutRequest(key=keys[0], value=b"2"))).header.revision
    at_later = await b.hash_kv(later)
    assert at_later.compact_revision == top
    assert at_later.hash == (await b.hash_kv(0)).hash
    with pytest.raises(EtcdError) as e:
        await b.hash_kv(top)
    assert e.value.message == errors.COMPACTED.message


def test_the_lock_grant_record_rule_matches_the_lock_recipe() -> None:
    from accord.locks import keys

    assert keys.GRANT_PREFIX == sharding.LOCK_GRANT_PREFIX
    name = b"/ckpt/job-17/lock"
    assert sharding.shard_of(keys.GRANT_PREFIX + name, 8) == sharding.shard_of(
        keys.prefix(name) + b"694d", 8) == sharding.shard_of(b"/ckpt/job-17/manifest", 8)
