"""Each configurable limit: over it, etcd's (or accord's) error and no change."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.kv.helpers import get, op_put, put, txn

TOO_LARGE = "etcdserver: request is too large"


def _raises(call: object, code: grpc.StatusCode, message: str) -> EtcdError:
    assert callable(call)
    with pytest.raises(EtcdError) as ei:
        call()
    assert ei.value.code == code and ei.value.message == message
    return ei.value


def test_key_size_limit() -> None:
    sm = SM(limits=Limits(max_key_bytes=8))
    put(sm, b"k" * 8)
    err = _raises(lambda: put(sm, b"k" * 9), grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    assert "key" in err.detail
    _raises(lambda: sm.validate_put(pb.PutRequest(key=b"k" * 9)),
            grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    _raises(lambda: get(sm, b"k" * 9), grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    _raises(lambda: txn(sm, [], [op_put(b"k" * 9)]), grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    assert sm.revision == 2


def test_value_size_limit() -> None:
    sm = SM(limits=Limits(max_value_bytes=16))
    put(sm, b"a", b"v" * 16)
    err = _raises(lambda: put(sm, b"a", b"v" * 17), grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    assert "value" in err.detail
    assert get(sm, b"a").kvs[0].value == b"v" * 16 and sm.revision == 2


def test_request_size_limit() -> None:
    sm = SM(limits=Limits(max_request_bytes=100))
    put(sm, b"a", b"v" * 80)
    _raises(lambda: put(sm, b"a", b"v" * 100), grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    _raises(lambda: txn(sm, [], [op_put(b"k%d" % i, b"x" * 10) for i in range(8)]),
            grpc.StatusCode.INVALID_ARGUMENT, TOO_LARGE)
    assert sm.revision == 2


def test_default_request_limit_is_etcds_one_and_a_half_mib() -> None:
    sm = SM()
    with pytest.raises(EtcdError) as ei:
        sm.validate_put(pb.PutRequest(key=b"a", value=b"v" * (3 * 1024 * 1024 // 2)))
    assert ei.value.message == TOO_LARGE


def test_txn_ops_limit_is_configurable() -> None:
    sm = SM(limits=Limits(max_txn_ops=3))
    txn(sm, [], [op_put(b"a"), op_put(b"b"), op_put(b"c")])
    _raises(lambda: txn(sm, [], [op_put(b"k%d" % i) for i in range(4)]),
            grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations in txn request")
    assert sm.revision == 2


def test_range_result_size_limit() -> None:
    sm = SM(limits=Limits(max_range_result_bytes=1000))
    for i in range(10):
        put(sm, b"k%d" % i, b"v" * 100)
    with pytest.raises(EtcdError) as ei:
        get(sm, b"k", b"l")
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "range result too large" in ei.value.message
    assert len(get(sm, b"k", b"l", limit=5).kvs) == 5  # paging works
    assert len(get(sm, b"k", b"l", keys_only=True).kvs) == 10
    assert get(sm, b"k", b"l", count_only=True).count == 10
    with pytest.raises(EtcdError):  # in a txn, the writes before it are rolled back
        txn(sm, [], [op_put(b"z"), pb.RequestOp(request_range=pb.RangeRequest(key=b"k", range_end=b"l"))])
    assert get(sm, b"z").count == 0 and sm.revision == 11


def test_watcher_count_limit() -> None:
    sm = SM(limits=Limits(max_watchers=2))
    sm.watch_hub.watch(b"a")
    w = sm.watch_hub.watch(b"b")
    with pytest.raises(EtcdError) as ei:
        sm.watch_hub.watch(b"c")
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    w.close()
    sm.watch_hub.watch(b"c")


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_txn_ops"):
        Limits(max_txn_ops=0)
    with pytest.raises(ValueError, match="min_lease_ttl_s"):
        Limits(min_lease_ttl_s=10, max_lease_ttl_s=5)
