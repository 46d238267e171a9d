"""Short builders for KV store tests."""

from __future__ import annotations

from typing import Any

from accord.proto import rpc_pb2 as pb
from accord.services.kv.statemachine import KVStateMachine as SM


def put(sm: SM, key: bytes, value: bytes = b"v", **kw: Any) -> pb.PutResponse:
    """Apply a Put."""
    resp = sm.apply(SM.encode_put(pb.PutRequest(key=key, value=value, **kw)))
    assert isinstance(resp, pb.PutResponse)
    return resp


def delete(sm: SM, key: bytes, range_end: bytes = b"", **kw: Any) -> pb.DeleteRangeResponse:
    """Apply a DeleteRange."""
    resp = sm.apply(
        SM.encode_delete_range(pb.DeleteRangeRequest(key=key, range_end=range_end, **kw))
    )
    assert isinstance(resp, pb.DeleteRangeResponse)
    return resp


def get(sm: SM, key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RangeResponse:
    """Run a Range."""
    return sm.range(pb.RangeRequest(key=key, range_end=range_end, **kw))


def txn(sm: SM, compare: list[pb.Compare], success: list[pb.RequestOp],
        failure: list[pb.RequestOp] | None = None) -> pb.TxnResponse:
    """Apply a Txn."""
    resp = sm.apply(SM.encode_txn(pb.TxnRequest(compare=compare, success=success,
                                                failure=failure or [])))
    assert isinstance(resp, pb.TxnResponse)
    return resp


def op_put(key: bytes, value: bytes = b"v", **kw: Any) -> pb.RequestOp:
    """A Put inside a Txn."""
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, **kw))


def op_del(key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RequestOp:
    """A DeleteRange inside a Txn."""
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key, range_end=range_end, **kw))


def op_get(key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RequestOp:
    """A Range inside a Txn."""
    return pb.RequestOp(request_range=pb.RangeRequest(key=key, range_end=range_end, **kw))


def op_txn(compare: list[pb.Compare], success: list[pb.RequestOp],
           failure: list[pb.RequestOp] | None = None) -> pb.RequestOp:
    """A nested Txn."""
    return pb.RequestOp(request_txn=pb.TxnRequest(compare=compare, success=success,
                                                  failure=failure or []))


def cmp(key: bytes, target: str, result: str, value: Any, range_end: bytes = b"") -> pb.Compare:
    """A Compare: target in VERSION/CREATE/MOD/VALUE/LEASE, result in EQUAL/.../NOT_EQUAL."""
    field = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision",
             "VALUE": "value", "LEASE": "lease"}[target]
    return pb.Compare(key=key, range_end=range_end, target=getattr(pb.Compare, target),
                      result=getattr(pb.Compare, result), **{field: value})


def keys(resp: pb.RangeResponse) -> list[bytes]:
    """The keys of a Range response, in order."""
    return [kv.key for kv in resp.kvs]
