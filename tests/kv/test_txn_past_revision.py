"""A Range at a past revision inside a writing Txn does not see that Txn's own writes."""

from __future__ import annotations

from accord.proto import rpc_pb2
from accord.services.kv.statemachine import KVStateMachine


def test_range_at_a_past_revision_inside_a_txn_ignores_the_txns_writes() -> None:
    sm = KVStateMachine()
    put = rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"ba", value=b"x"))
    past = rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"b", range_end=b"c", revision=1))
    now = rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"b", range_end=b"c"))
    resp = sm.apply(KVStateMachine.encode_txn(rpc_pb2.TxnRequest(success=[put, past, now])))
    assert isinstance(resp, rpc_pb2.TxnResponse)
    at_past, at_now = resp.responses[1].response_range, resp.responses[2].response_range
    assert (at_past.count, len(at_past.kvs)) == (0, 0)
    assert (at_now.count, [kv.key for kv in at_now.kvs]) == (1, [b"ba"])


def test_read_only_txn_is_served_as_a_read_without_a_revision_bump() -> None:
    sm = KVStateMachine()
    sm.apply(KVStateMachine.encode_put(rpc_pb2.PutRequest(key=b"k", value=b"v")))
    rev = sm.revision
    cmp = rpc_pb2.Compare(key=b"k", target=rpc_pb2.Compare.VALUE, result=rpc_pb2.Compare.EQUAL,
                          value=b"v")
    get = rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"k"))
    req = rpc_pb2.TxnRequest(compare=[cmp], success=[get])
    assert sm.is_read_only_txn(req)
    resp = sm.read_txn(req)
    assert resp.succeeded and resp.responses[0].response_range.kvs[0].value == b"v"
    assert sm.revision == rev and resp.header.revision == rev
    put = rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"k", value=b"w"))
    assert not sm.is_read_only_txn(rpc_pb2.TxnRequest(failure=[put]))
