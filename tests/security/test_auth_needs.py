"""What each request needs (``needs.py``): etcd checks every branch of a Txn, nested ones
included, and READ as well as WRITE where a request returns previous values."""

from __future__ import annotations

from accord.proto import rpc_pb2
from accord.services.auth.needs import (
    READ,
    WRITE,
    delete_needs,
    put_needs,
    txn_leases,
    txn_needs,
)


def test_a_txn_needs_both_branches_and_nested_txns() -> None:
    inner = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"c2")],
        failure=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"deep", lease=7))])
    txn = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"c1", range_end=b"c9")],
        success=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"r"))],
        failure=[rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(
                     key=b"d", range_end=b"e", prev_kv=True)),
                 rpc_pb2.RequestOp(request_txn=inner)])
    assert list(txn_needs(txn)) == [
        (b"c1", b"c9", READ), (b"r", b"", READ), (b"d", b"e", WRITE), (b"d", b"e", READ),
        (b"c2", b"", READ), (b"deep", b"", WRITE)]
    assert list(txn_leases(txn)) == [7]


def test_prev_kv_needs_read_too() -> None:
    assert list(put_needs(rpc_pb2.PutRequest(key=b"k"))) == [(b"k", b"", WRITE)]
    assert list(put_needs(rpc_pb2.PutRequest(key=b"k", prev_kv=True))) == [
        (b"k", b"", WRITE), (b"k", b"", READ)]
    assert list(delete_needs(rpc_pb2.DeleteRangeRequest(key=b"k", prev_kv=True))) == [
        (b"k", b"", WRITE), (b"k", b"", READ)]
