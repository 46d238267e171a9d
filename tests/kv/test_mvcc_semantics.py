"""etcd's revision, KeyValue, range and compaction semantics (ETCD_COMPAT.md)."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError
from accord.services.kv.ranges import prefix_end
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.kv.helpers import delete, get, keys, put

RR = pb.RangeRequest


def test_empty_store_is_at_revision_1_and_first_write_makes_2() -> None:
    sm = SM()
    assert sm.revision == 1
    assert put(sm, b"a").header.revision == 2
    assert sm.revision == 2


def test_every_put_bumps_even_with_the_same_value() -> None:
    sm = SM()
    put(sm, b"a", b"x")
    put(sm, b"a", b"x")
    assert sm.revision == 3


def test_empty_delete_does_not_bump() -> None:
    sm = SM()
    put(sm, b"a")
    resp = delete(sm, b"zzz")
    assert resp.deleted == 0 and resp.header.revision == 2 and sm.revision == 2


def test_keyvalue_fields_create_mod_version_and_reset_by_delete() -> None:
    sm = SM()
    put(sm, b"k", b"1")  # 2
    put(sm, b"other")  # 3
    put(sm, b"k", b"2")  # 4
    kv = get(sm, b"k").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version, kv.value) == (2, 4, 2, b"2")
    delete(sm, b"k")  # 5
    assert get(sm, b"k").count == 0
    put(sm, b"k", b"3")  # 6
    kv = get(sm, b"k").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version) == (6, 6, 1)


def test_prev_kv_on_put_and_delete() -> None:
    sm = SM()
    assert not put(sm, b"a", b"1", prev_kv=True).HasField("prev_kv")
    prev = put(sm, b"a", b"2", prev_kv=True).prev_kv
    assert (prev.value, prev.version, prev.mod_revision) == (b"1", 1, 2)
    put(sm, b"b", b"3")
    resp = delete(sm, b"a", b"c", prev_kv=True)
    assert resp.deleted == 2
    assert [(kv.key, kv.value) for kv in resp.prev_kvs] == [(b"a", b"2"), (b"b", b"3")]


def _fill(sm: SM) -> None:
    for k in [b"a", b"ab", b"abc", b"b", b"b\xff", b"c", b"\xff\xff"]:
        put(sm, k, k.upper())


def test_range_end_rules() -> None:
    sm = SM()
    _fill(sm)
    assert keys(get(sm, b"ab")) == [b"ab"]
    assert keys(get(sm, b"ab", b"b")) == [b"ab", b"abc"]
    assert keys(get(sm, b"b", b"\x00")) == [b"b", b"b\xff", b"c", b"\xff\xff"]
    assert len(get(sm, b"\x00", b"\x00").kvs) == 7
    assert keys(get(sm, b"a", prefix_end(b"a"))) == [b"a", b"ab", b"abc"]
    assert keys(get(sm, b"c", b"a")) == []


def test_prefix_end_drops_trailing_ff() -> None:
    assert prefix_end(b"a") == b"b"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"


def test_empty_key_is_rejected_everywhere() -> None:
    sm = SM()
    for call in (
        lambda: get(sm, b""),
        lambda: put(sm, b""),
        lambda: delete(sm, b""),
    ):
        with pytest.raises(EtcdError) as ei:
            call()
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert ei.value.message == "etcdserver: key is not provided"


def test_limit_keeps_total_count_and_sets_more() -> None:
    sm = SM()
    for i in range(7):
        put(sm, b"k%d" % i)
    resp = get(sm, b"k", b"l", limit=1)
    assert (len(resp.kvs), resp.count, resp.more) == (1, 7, True)
    resp = get(sm, b"k", b"l", limit=7)
    assert (len(resp.kvs), resp.more) == (7, False)


def test_count_only_and_keys_only() -> None:
    sm = SM()
    _fill(sm)
    resp = get(sm, b"a", b"c", count_only=True)
    assert resp.count == 5 and len(resp.kvs) == 0
    resp = get(sm, b"a", b"c", keys_only=True)
    assert all(kv.value == b"" for kv in resp.kvs) and resp.kvs[0].version == 1


def test_sort_targets_and_orders() -> None:
    sm = SM()
    put(sm, b"c", b"1")  # 2
    put(sm, b"a", b"3")  # 3
    put(sm, b"b", b"2")  # 4
    put(sm, b"a", b"4")  # 5
    r = get(sm, b"a", b"z", sort_target=RR.CREATE, sort_order=RR.ASCEND)
    assert keys(r) == [b"c", b"a", b"b"]
    r = get(sm, b"a", b"z", sort_target=RR.MOD)  # NONE with non-KEY target => ascend
    assert keys(r) == [b"c", b"b", b"a"]
    r = get(sm, b"a", b"z", sort_target=RR.KEY, sort_order=RR.DESCEND)
    assert keys(r) == [b"c", b"b", b"a"]
    r = get(sm, b"a", b"z", sort_target=RR.VALUE, sort_order=RR.DESCEND, limit=1)
    assert keys(r) == [b"a"] and r.more and r.count == 3
    r = get(sm, b"a", b"z", sort_target=RR.VERSION, sort_order=RR.DESCEND)
    assert keys(r)[0] == b"a"
    # the concurrency Mutex's "first create": sort CREATE ascend, limit 1
    r = get(sm, b"a", b"z", sort_target=RR.CREATE, sort_order=RR.ASCEND, limit=1)
    assert keys(r) == [b"c"]
    with pytest.raises(EtcdError) as ei:
        get(sm, b"a", sort_target=7)
    assert ei.value.message == "etcdserver: invalid sort option"
    # an unknown order is accepted and sorts nothing (etcd 3.4), but fetches all for limit
    r = get(sm, b"a", b"z", sort_target=RR.MOD, sort_order=7, limit=2)
    assert keys(r) == [b"a", b"b"] and r.more and r.count == 3


def test_min_max_revision_filters() -> None:
    sm = SM()
    put(sm, b"a")  # 2
    put(sm, b"b")  # 3
    put(sm, b"c")  # 4
    put(sm, b"a")  # 5
    assert keys(get(sm, b"a", b"z", min_mod_revision=4)) == [b"a", b"c"]
    assert keys(get(sm, b"a", b"z", max_mod_revision=3)) == [b"b"]
    assert keys(get(sm, b"a", b"z", min_create_revision=3)) == [b"b", b"c"]
    r = get(sm, b"a", b"z", max_create_revision=3, sort_target=RR.CREATE,
            sort_order=RR.DESCEND, limit=1)  # waitDeletes: last create below a revision
    assert keys(r) == [b"b"]


def test_reads_at_past_revisions() -> None:
    sm = SM()
    put(sm, b"a", b"1")  # 2
    put(sm, b"a", b"2")  # 3
    delete(sm, b"a")  # 4
    assert get(sm, b"a", revision=2).kvs[0].value == b"1"
    assert get(sm, b"a", revision=3).kvs[0].value == b"2"
    assert get(sm, b"a", revision=4).count == 0
    assert get(sm, b"a", revision=1).count == 0
    assert get(sm, b"a", revision=2).header.revision == 4
    with pytest.raises(EtcdError) as ei:
        get(sm, b"a", revision=5)
    assert ei.value == errors.FUTURE_REV


def test_compaction_semantics() -> None:
    sm = SM()
    put(sm, b"a", b"1")  # 2
    put(sm, b"a", b"2")  # 3
    put(sm, b"b", b"1")  # 4
    delete(sm, b"b")  # 5
    put(sm, b"c")  # 6
    resp = sm.apply(SM.encode_compact(pb.CompactionRequest(revision=5)))
    assert isinstance(resp, pb.CompactionResponse) and resp.header.revision == 6
    assert sm.revision == 6 and sm.compact_revision == 5
    assert get(sm, b"a", revision=5).kvs[0].value == b"2"  # compact rev itself is readable
    assert get(sm, b"\x00", b"\x00", revision=5).count == 1
    with pytest.raises(EtcdError) as ei:
        get(sm, b"a", revision=4)
    assert ei.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert ei.value.message == "etcdserver: mvcc: required revision has been compacted"
    for rev, err in ((5, errors.COMPACTED), (3, errors.COMPACTED), (7, errors.FUTURE_REV)):
        with pytest.raises(EtcdError) as ei:
            sm.apply(SM.encode_compact(pb.CompactionRequest(revision=rev)))
        assert ei.value == err
    assert len(sm.store.versions(b"a")) == 1 and sm.store.versions(b"b") == []
    assert sm.apply(SM.encode_compact(pb.CompactionRequest(revision=6))) is not None


def test_revision_floor_makes_revisions_jump_and_reads_stay_consistent() -> None:
    sm = SM()
    put(sm, b"a", b"1")  # 2
    resp = sm.apply(SM.encode_put(pb.PutRequest(key=b"a", value=b"2"), min_revision=100))
    assert isinstance(resp, pb.PutResponse) and resp.header.revision == 100
    assert sm.revision == 100
    assert get(sm, b"a", revision=50).kvs[0].value == b"1"
    kv = get(sm, b"a").kvs[0]
    assert (kv.mod_revision, kv.create_revision, kv.version) == (100, 2, 2)
    # a floor below the next revision changes nothing
    assert put(sm, b"b").header.revision == 101
    resp = sm.apply(SM.encode_put(pb.PutRequest(key=b"c"), min_revision=5))
    assert isinstance(resp, pb.PutResponse) and resp.header.revision == 102


def test_ignore_value_and_ignore_lease() -> None:
    sm = SM()
    with pytest.raises(EtcdError) as ei:
        put(sm, b"a", b"", ignore_value=True)
    assert ei.value == errors.KEY_NOT_FOUND
    with pytest.raises(EtcdError) as ei:
        put(sm, b"a", b"x", ignore_value=True)
    assert ei.value == errors.VALUE_PROVIDED
    lease = sm.apply(SM.encode_lease_grant(pb.LeaseGrantRequest(TTL=60), 0))
    assert isinstance(lease, pb.LeaseGrantResponse)
    put(sm, b"a", b"keep", lease=lease.ID)
    put(sm, b"a", b"", ignore_value=True)
    kv = get(sm, b"a").kvs[0]
    assert kv.value == b"keep" and kv.lease == 0
    put(sm, b"a", b"new", lease=lease.ID)
    put(sm, b"a", b"newer", ignore_lease=True)
    kv = get(sm, b"a").kvs[0]
    assert kv.value == b"newer" and kv.lease == lease.ID
    with pytest.raises(EtcdError) as ei:
        put(sm, b"a", b"x", ignore_lease=True, lease=5)
    assert ei.value == errors.LEASE_PROVIDED


def test_unknown_lease_on_put() -> None:
    sm = SM()
    with pytest.raises(EtcdError) as ei:
        put(sm, b"a", lease=12345)
    assert ei.value.code == grpc.StatusCode.NOT_FOUND
    assert ei.value.message == "etcdserver: requested lease not found"
    assert sm.revision == 1


def test_malformed_command_changes_nothing() -> None:
    sm = SM()
    with pytest.raises(EtcdError) as ei:
        sm.apply(b"\x93\x01\x02")
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert sm.revision == 1
