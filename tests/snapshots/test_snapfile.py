"""The backup file: every group's state and etcd's layout, checked before anything is used."""

from __future__ import annotations

import hashlib
import random

import msgpack
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.cluster import bbolt, snapfile
from accord.services.kv import etcdformat, sharding
from accord.services.kv.statemachine import KVStateMachine
from tests.kv.helpers import get


def _history(seed: int, shards: int = 1) -> list[KVStateMachine]:
    """Shards with puts, overwrites, deletes, a compaction and leases; keys routed by
    ``shard_of`` and revisions shared, as a node's shards are."""
    print(f"seed={seed}")
    rnd = random.Random(seed)
    sms = [KVStateMachine(lease_id_seed=i + 2) for i in range(shards)]
    lease = sms[0].apply(KVStateMachine.encode_lease_grant(pb.LeaseGrantRequest(TTL=300), 1000))
    assert isinstance(lease, pb.LeaseGrantResponse)
    for i in range(shards)[1:]:
        sms[i].apply(KVStateMachine.encode_lease_grant(pb.LeaseGrantRequest(TTL=300, ID=lease.ID), 1000))
    rev = 1
    for step in range(300):
        key = b"/k/%d/x" % rnd.randrange(40) if rnd.random() < 0.5 else b"k%d" % rnd.randrange(40)
        sm = sms[sharding.shard_of(key, shards)]
        rev = max(m.revision for m in sms) + 1
        if rnd.random() < 0.2:
            sm.apply(KVStateMachine.encode_delete_range(pb.DeleteRangeRequest(key=key),
                                                        min_revision=rev))
        else:
            lid = lease.ID if rnd.random() < 0.1 else 0
            sm.apply(KVStateMachine.encode_put(pb.PutRequest(key=key, value=b"v%d" % step, lease=lid),
                                               min_revision=rev))
        if step == 150:
            for m in sms:
                m.apply(KVStateMachine.encode_floor(rev))
            for m in sms:
                m.apply(KVStateMachine.encode_compact(pb.CompactionRequest(revision=rev - 20)))
    return sms


def _live(sms: list[KVStateMachine]) -> dict[bytes, tuple[bytes, int, int, int, int]]:
    out = {}
    for sm in sms:
        for kv in get(sm, b"\x00", b"\x00").kvs:
            out[kv.key] = (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
    return out


@pytest.mark.parametrize("shards", [1, 3])
def test_etcd_layout_round_trip_keeps_every_live_key(shards: int) -> None:
    sms = _history(seed=shards * 7, shards=shards)
    images = [sm.snapshot() for sm in sms]
    buckets = etcdformat.to_etcd(images)
    rev, back = etcdformat.from_etcd(buckets, shards, [i + 2 for i in range(shards)])
    restored = []
    for img in back:
        sm = KVStateMachine()
        sm.restore(img)
        restored.append(sm)
    assert _live(restored) == _live(sms)
    assert rev == max(sm.revision for sm in sms)
    assert all(sm.compact_revision == max(m.compact_revision for m in sms) for sm in restored)
    lid = next(iter(sms[0].leases.leases))
    for sm, back_sm in zip(sms, restored, strict=True):
        held = sm.leases.leases[lid].keys
        assert (back_sm.leases.leases[lid].keys if held else set()) == held
    assert lid in restored[0].leases.leases  # the lease's home keeps it even without keys
    # one history whatever the shard count: the etcd layout of 3 shards restores into 1
    _rev1, one = etcdformat.from_etcd(buckets, 1, [2])
    single = KVStateMachine()
    single.restore(one[0])
    assert _live([single]) == _live(sms)


def test_accord_file_carries_every_group_image_and_its_format() -> None:
    sms = _history(seed=3)
    groups = {1: b"members", 2: sms[0].snapshot(), 3: b"scheduler"}
    data = snapfile.encode(sms[0].revision, groups, [2])
    assert len(data) % 512 == 32
    snap = snapfile.decode(data)
    assert (snap.origin, snap.format, snap.revision) == ("accord", 1, sms[0].revision)
    assert snap.groups == groups and snap.kv_groups == (2,)
    st = snapfile.status(data)
    assert st.keys == len(_live(sms)) and st.groups == 3
    assert st.revision == max(etcdformat.parse_rev_key(k)[0] for k in snap.buckets[b"key"])
    assert st.total_size == len(data) - 32


def _resealed(db: bytes) -> bytes:
    return db + hashlib.sha256(db).digest()


def test_a_flipped_byte_is_refused_by_the_checksum() -> None:
    data = bytearray(snapfile.encode(5, {2: _history(1)[0].snapshot()}, [2]))
    data[len(data) // 2] ^= 1
    with pytest.raises(snapfile.SnapshotFileError, match="SHA-256 trailer does not match"):
        snapfile.decode(bytes(data))


def test_a_truncated_file_is_refused_naming_its_size() -> None:
    data = snapfile.encode(5, {2: _history(1)[0].snapshot()}, [2])
    with pytest.raises(snapfile.SnapshotFileError, match=r"truncated .*size \(\d+ bytes\)"):
        snapfile.decode(data[:-1000])


def test_a_file_cut_at_a_page_boundary_is_refused_by_the_pages() -> None:
    data = snapfile.encode(5, {2: _history(1)[0].snapshot()}, [2])
    db = data[:-32]
    with pytest.raises(snapfile.SnapshotFileError, match="bbolt database is truncated"):
        snapfile.decode(_resealed(db[: len(db) - 4096]))


def test_an_unknown_format_version_is_refused_naming_it() -> None:
    data = snapfile.encode(5, {2: _history(1)[0].snapshot()}, [2])
    buckets = bbolt.read_db(data[:-32]).buckets
    buckets[b"accord"][b"format"] = b"9"
    with pytest.raises(snapfile.SnapshotFileError, match="format 9 is not supported"):
        snapfile.decode(_resealed(bbolt.write_db(buckets)))


def test_a_missing_kv_image_is_refused() -> None:
    data = snapfile.encode(5, {2: _history(1)[0].snapshot()}, [2])
    buckets = bbolt.read_db(data[:-32]).buckets
    buckets[b"accord"][b"kv_groups"] = msgpack.packb([2, 101])
    with pytest.raises(snapfile.SnapshotFileError, match=r"KV groups \[101\] have no state"):
        snapfile.decode(_resealed(bbolt.write_db(buckets)))


def test_a_bbolt_file_of_something_else_is_refused() -> None:
    with pytest.raises(snapfile.SnapshotFileError, match="neither accord's nor etcd's"):
        snapfile.decode(_resealed(bbolt.write_db({b"other": {b"k": b"v"}})))


def test_a_raw_db_without_trailer_needs_skip_hash_check() -> None:
    db = snapfile.encode(5, {2: _history(1)[0].snapshot()}, [2])[:-32]
    with pytest.raises(snapfile.SnapshotFileError, match="--skip-hash-check"):
        snapfile.decode(db)
    assert snapfile.decode(db, skip_hash_check=True).revision == 5


def test_an_image_cut_back_to_a_revision_holds_exactly_the_keys_then() -> None:
    sm = KVStateMachine()
    lease = sm.apply(KVStateMachine.encode_lease_grant(pb.LeaseGrantRequest(TTL=60), 1000))
    assert isinstance(lease, pb.LeaseGrantResponse)
    for i in range(50):
        sm.apply(KVStateMachine.encode_put(pb.PutRequest(key=b"k%d" % (i % 20), value=b"%d" % i)))
    cut = sm.revision
    then = _live([sm])
    sm.apply(KVStateMachine.encode_put(pb.PutRequest(key=b"k1", value=b"late", lease=lease.ID)))
    sm.apply(KVStateMachine.encode_put(pb.PutRequest(key=b"new", value=b"late")))
    sm.apply(KVStateMachine.encode_delete_range(pb.DeleteRangeRequest(key=b"k2")))
    back = KVStateMachine()
    back.restore(KVStateMachine.image_at(sm.snapshot(), cut))
    assert back.revision == cut and _live([back]) == then
    assert back.leases.leases[lease.ID].keys == set()  # k1 held it only after the cut


def test_a_restored_image_keeps_each_lease_remaining_time_in_a_new_clock() -> None:
    sm = KVStateMachine()
    sm.apply(KVStateMachine.encode_lease_grant(pb.LeaseGrantRequest(TTL=100), 5_000, term=7))
    sm.apply(KVStateMachine.encode_lease_checkpoint(45_000, 7))  # 60 s left
    back = KVStateMachine()
    back.restore(KVStateMachine.image_for_new_cluster(sm.snapshot(), 900_000))
    (lease,) = back.leases.leases.values()
    assert back.leases.clock_term == 0 and back.leases.clock_ms == 900_000
    assert back.leases.remaining_s(lease, 900_000) == 60
    back.apply(KVStateMachine.encode_lease_checkpoint(5_000_000, 2))  # the new cluster's term 2
    assert back.leases.remaining_s(lease, 5_000_000) == 60
