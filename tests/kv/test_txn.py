"""Txn semantics: one revision, compares, nested txns, validation (ETCD_COMPAT.md)."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.kv.helpers import cmp, delete, get, op_del, op_get, op_put, op_txn, put, txn


def test_three_writes_one_revision_with_sub_revision_order() -> None:
    sm = SM()
    resp = txn(sm, [], [op_put(b"a"), op_put(b"b"), op_put(b"c")])
    assert resp.succeeded and resp.header.revision == 2 and sm.revision == 2
    assert [r.response_put.header.revision for r in resp.responses] == [2, 2, 2]
    for k in (b"a", b"b", b"c"):
        kv = get(sm, k).kvs[0]
        assert kv.mod_revision == 2 and kv.create_revision == 2
    w = sm.watch_hub.watch(b"a", b"z", start_revision=2)
    batch = w.poll()
    assert batch is not None
    assert [e.kv.key for e in batch.events] == [b"a", b"b", b"c"]


def test_read_only_txn_does_not_bump() -> None:
    sm = SM()
    put(sm, b"a")
    resp = txn(sm, [cmp(b"a", "VERSION", "EQUAL", 1)], [op_get(b"a")], [op_put(b"x")])
    assert resp.succeeded and resp.header.revision == 2 and sm.revision == 2
    assert resp.responses[0].response_range.kvs[0].key == b"a"


def test_write_txn_that_changes_nothing_does_not_bump() -> None:
    sm = SM()
    put(sm, b"a")
    resp = txn(sm, [], [op_del(b"nothing")])
    assert resp.header.revision == 2 and sm.revision == 2


def test_missing_key_compares_as_zero_and_value_compare_fails() -> None:
    sm = SM()
    assert txn(sm, [cmp(b"k", "CREATE", "EQUAL", 0)], []).succeeded
    assert txn(sm, [cmp(b"k", "VERSION", "EQUAL", 0)], []).succeeded
    assert txn(sm, [cmp(b"k", "MOD", "LESS", 1)], []).succeeded
    assert txn(sm, [cmp(b"k", "LEASE", "EQUAL", 0)], []).succeeded
    assert not txn(sm, [cmp(b"k", "VALUE", "EQUAL", b"")], []).succeeded
    assert not txn(sm, [cmp(b"k", "VALUE", "NOT_EQUAL", b"x")], []).succeeded


def test_compare_targets_and_results() -> None:
    sm = SM()
    put(sm, b"k", b"m")  # 2
    put(sm, b"k", b"m")  # 3
    cases = [
        (cmp(b"k", "VERSION", "EQUAL", 2), True),
        (cmp(b"k", "VERSION", "GREATER", 1), True),
        (cmp(b"k", "VERSION", "LESS", 2), False),
        (cmp(b"k", "CREATE", "EQUAL", 2), True),
        (cmp(b"k", "MOD", "NOT_EQUAL", 3), False),
        (cmp(b"k", "MOD", "GREATER", 2), True),
        (cmp(b"k", "VALUE", "GREATER", b"a"), True),
        (cmp(b"k", "VALUE", "LESS", b"mm"), True),
        (cmp(b"k", "VALUE", "EQUAL", b"m"), True),
        (cmp(b"k", "LEASE", "GREATER", 0), False),
    ]
    for c, want in cases:
        assert txn(sm, [c], []).succeeded is want, c


def test_compare_over_a_range_requires_every_key() -> None:
    sm = SM()
    put(sm, b"p/1")
    put(sm, b"p/2")
    put(sm, b"p/2")
    assert txn(sm, [cmp(b"p/", "VERSION", "GREATER", 0, range_end=b"p0")], []).succeeded
    assert not txn(sm, [cmp(b"p/", "VERSION", "EQUAL", 1, range_end=b"p0")], []).succeeded
    assert txn(sm, [cmp(b"q/", "CREATE", "EQUAL", 0, range_end=b"q0")], []).succeeded


def test_failure_branch_and_nested_txn() -> None:
    sm = SM()
    put(sm, b"a", b"1")
    resp = txn(
        sm,
        [cmp(b"a", "VALUE", "EQUAL", b"nope")],
        [op_put(b"s")],
        [op_txn([cmp(b"a", "VERSION", "EQUAL", 1)], [op_put(b"n1"), op_get(b"a")],
                [op_put(b"n2")]),
         op_put(b"f")],
    )
    assert not resp.succeeded
    nested = resp.responses[0].response_txn
    assert nested.succeeded and nested.HasField("header") and nested.header.revision == 0
    assert nested.responses[1].response_range.kvs[0].value == b"1"
    assert get(sm, b"n1").count == 1 and get(sm, b"f").count == 1
    assert get(sm, b"n2").count == 0 and get(sm, b"s").count == 0
    assert sm.revision == 3


def test_nested_compares_see_the_state_before_the_txn() -> None:
    sm = SM()
    resp = txn(sm, [], [op_put(b"a"), op_txn([cmp(b"a", "VERSION", "EQUAL", 0)],
                                             [op_put(b"yes")], [op_put(b"no")])])
    assert resp.responses[1].response_txn.succeeded
    assert get(sm, b"yes").count == 1


def test_range_inside_write_txn_sees_own_writes() -> None:
    sm = SM()
    put(sm, b"a", b"old")
    resp = txn(sm, [], [op_put(b"a", b"new"), op_get(b"a"), op_del(b"zz")])
    r = resp.responses[1].response_range
    assert r.kvs[0].value == b"new" and r.header.revision == 3
    assert resp.responses[2].response_delete_range.header.revision == 3


def test_too_many_ops() -> None:
    sm = SM()
    ok = [op_put(b"k%d" % i) for i in range(128)]
    assert txn(sm, [], ok).succeeded
    with pytest.raises(EtcdError) as ei:
        txn(sm, [], [op_put(b"k%d" % i) for i in range(129)])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert ei.value.message == "etcdserver: too many operations in txn request"
    with pytest.raises(EtcdError):
        txn(sm, [cmp(b"k%d" % i, "VERSION", "EQUAL", 0) for i in range(129)], [])
    # a nested txn only gets the budget its parent leaves (etcd's rule)
    nested = op_txn([], [op_put(b"n%d" % i) for i in range(28)])
    assert txn(sm, [], [*(op_put(b"p%d" % i) for i in range(99)), nested]).succeeded
    with pytest.raises(EtcdError) as ei:
        txn(sm, [], [*(op_put(b"q%d" % i) for i in range(99)), op_txn([], [
            op_put(b"m%d" % i) for i in range(29)])])
    assert ei.value == errors.TOO_MANY_OPS


@pytest.mark.parametrize(
    ("success", "dup"),
    [
        ([op_put(b"a"), op_put(b"a")], True),
        ([op_put(b"a"), op_del(b"a")], True),
        ([op_del(b"a", b"c"), op_put(b"b")], True),
        ([op_del(b"a"), op_del(b"a")], False),
        ([op_put(b"a"), op_put(b"b")], False),
        ([op_put(b"a"), op_txn([], [op_put(b"a")])], True),
        ([op_del(b"a", b"z"), op_txn([], [op_put(b"m")])], True),
        ([op_txn([], [op_put(b"a")], [op_put(b"a")])], False),
        ([op_txn([], [op_put(b"a")]), op_txn([], [op_put(b"a")])], True),
        ([op_txn([], [op_del(b"a")]), op_put(b"a")], True),
    ],
)
def test_duplicate_key_rule(success: list[pb.RequestOp], dup: bool) -> None:
    sm = SM()
    if dup:
        with pytest.raises(EtcdError) as ei:
            txn(sm, [], success)
        assert ei.value.message == "etcdserver: duplicate key given in txn request"
        assert sm.revision == 1
    else:
        txn(sm, [], success)


def test_put_and_failure_branch_may_share_a_key() -> None:
    sm = SM()
    resp = txn(sm, [], [op_put(b"a")], [op_put(b"a")])
    assert resp.succeeded


def test_failed_state_check_in_txn_changes_nothing() -> None:
    sm = SM()
    put(sm, b"a")
    with pytest.raises(EtcdError) as ei:
        txn(sm, [], [op_put(b"b"), op_put(b"c", lease=77)])
    assert ei.value == errors.LEASE_NOT_FOUND
    with pytest.raises(EtcdError) as ei:
        txn(sm, [], [op_put(b"b"), op_put(b"nokey", b"", ignore_value=True)])
    assert ei.value == errors.KEY_NOT_FOUND
    with pytest.raises(EtcdError) as ei:
        txn(sm, [], [op_put(b"b"), op_get(b"a", revision=9)])
    assert ei.value == errors.FUTURE_REV
    assert sm.revision == 2 and get(sm, b"b").count == 0
    sm.apply(SM.encode_compact(pb.CompactionRequest(revision=2)))
    with pytest.raises(EtcdError) as ei:  # etcd: negative revision in a txn after compaction
        txn(sm, [], [op_get(b"a", revision=-1)])
    assert ei.value == errors.COMPACTED
    assert get(sm, b"a", revision=-1).count == 1
    # only the taken branch is checked
    assert not txn(sm, [cmp(b"a", "VERSION", "EQUAL", 9)], [op_put(b"x", lease=77)]).succeeded


def test_empty_compare_key_rejected() -> None:
    sm = SM()
    with pytest.raises(EtcdError) as ei:
        txn(sm, [cmp(b"", "VERSION", "EQUAL", 0)], [])
    assert ei.value == errors.EMPTY_KEY


def test_txn_delete_then_events_and_prev() -> None:
    sm = SM()
    put(sm, b"a", b"1")
    put(sm, b"b", b"2")
    resp = txn(sm, [], [op_del(b"a", b"c", prev_kv=True)])
    assert resp.responses[0].response_delete_range.deleted == 2
    assert sm.revision == 4
    assert delete(sm, b"a").deleted == 0


def test_delete_from_key_and_put_inside_it_in_one_txn_is_allowed_as_in_etcd() -> None:
    sm = SM()
    put(sm, b"b", b"old")  # 2
    w = sm.watch_hub.watch(b"a", b"\x00", prev_kv=True)
    resp = txn(sm, [], [op_del(b"a", b"\x00"), op_put(b"b", b"new")])  # 3
    assert resp.responses[0].response_delete_range.deleted == 1
    kv = get(sm, b"b").kvs[0]
    assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (b"new", 1, 3, 3)
    live = w.poll()
    assert live is not None
    shape = [(e.type, e.kv.key, e.prev_kv.value) for e in live.events]
    assert shape == [(1, b"b", b"old"), (0, b"b", b"")]
    replay = sm.watch_hub.watch(b"a", b"\x00", start_revision=3, prev_kv=True).poll()
    assert replay is not None and list(replay.events) == list(live.events)
    # put first, then the from-key delete removes it again; as in etcd, a watcher's
    # prev_kv is the version before the revision (none for c, created and deleted in it)
    resp = txn(sm, [], [op_put(b"c"), op_del(b"a", b"\x00", prev_kv=True)])
    assert resp.responses[1].response_delete_range.deleted == 2
    assert [kv.key for kv in resp.responses[1].response_delete_range.prev_kvs] == [b"b", b"c"]
    assert get(sm, b"\x00", b"\x00").count == 0
    live = w.poll()
    assert live is not None
    shape = [(e.type, e.kv.key, e.prev_kv.value) for e in live.events]
    assert shape == [(0, b"c", b""), (1, b"b", b"new"), (1, b"c", b"")]
    replay = sm.watch_hub.watch(b"a", b"\x00", start_revision=4, prev_kv=True).poll()
    assert replay is not None and list(replay.events) == list(live.events)
    other = SM()
    other.restore(sm.snapshot())
    assert other.snapshot() == sm.snapshot()
