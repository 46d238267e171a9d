"""Builders for the Compare/RequestOp messages the recipes put in their transactions."""

from __future__ import annotations

from accord.proto import rpc_pb2

Compare = rpc_pb2.Compare
RR = rpc_pb2.RangeRequest


def create_eq(key: bytes, rev: int) -> rpc_pb2.Compare:
    """``create_revision(key) == rev`` (``rev == 0``: the key does not exist)."""
    return Compare(key=key, target=Compare.CREATE, result=Compare.EQUAL, create_revision=rev)


def all_created_after(key: bytes, range_end: bytes, rev: int) -> rpc_pb2.Compare:
    """Every key in ``[key, range_end)`` was created after revision ``rev``."""
    return Compare(
        key=key, range_end=range_end, target=Compare.CREATE, result=Compare.GREATER,
        create_revision=rev,
    )


def mod_eq(key: bytes, rev: int) -> rpc_pb2.Compare:
    """``mod_revision(key) == rev`` (``rev == 0``: the key does not exist)."""
    return Compare(key=key, target=Compare.MOD, result=Compare.EQUAL, mod_revision=rev)


def put(key: bytes, value: bytes, lease: int = 0) -> rpc_pb2.RequestOp:
    """A Put op."""
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> rpc_pb2.RequestOp:
    """A DeleteRange op of one key."""
    return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=key))


def get(key: bytes) -> rpc_pb2.RequestOp:
    """A Range op of one key."""
    return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))


def first_created(key: bytes, range_end: bytes, *, max_create: int = 0,
                  last: bool = False, limit: int = 1) -> rpc_pb2.RangeRequest:
    """The lowest (``last``: highest) create revisions in the range, at most ``max_create``."""
    return RR(
        key=key, range_end=range_end, limit=limit, sort_target=RR.CREATE,
        sort_order=RR.DESCEND if last else RR.ASCEND, max_create_revision=max_create,
    )


def txn_op(req: rpc_pb2.TxnRequest) -> rpc_pb2.RequestOp:
    """A nested Txn op."""
    return rpc_pb2.RequestOp(request_txn=req)


def range_op(req: rpc_pb2.RangeRequest) -> rpc_pb2.RequestOp:
    """A Range op."""
    return rpc_pb2.RequestOp(request_range=req)
