"""Checks a request must pass before it is proposed or applied; they read no store state.

The order of the checks follows etcd 3.4 (``v3rpc/key.go`` then the server's size check),
so a request with several faults gets the same error etcd would give. Everything here is
deterministic and also runs again inside ``apply``, so a command that slipped past the
servicer still changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from accord.proto import rpc_pb2
from accord.services.kv import errors
from accord.services.kv.limits import Limits

_SORT_TARGETS = frozenset(rpc_pb2.RangeRequest.SortTarget.values())


def _check_key(key: bytes, limits: Limits) -> None:
    if not key:
        raise errors.EMPTY_KEY
    if len(key) > limits.max_key_bytes:
        raise errors.key_too_large(len(key), limits.max_key_bytes)


def check_size(size: int, limits: Limits) -> None:
    """The request-size limit on a request's serialized ``size``."""
    if size > limits.max_request_bytes:
        raise errors.request_too_large(size, limits.max_request_bytes)


def range_fields(req: rpc_pb2.RangeRequest, limits: Limits) -> None:
    """etcd's checkRangeRequest (key given) plus the key limit and a known sort target.

    etcd 3.4 accepts an unknown ``sort_order`` (and then does not sort), which accord
    follows; an unknown ``sort_target`` crashes etcd 3.4.23 (measured: the connection
    drops), so accord answers it with the error later etcd versions give.
    """
    _check_key(req.key, limits)
    if req.sort_target not in _SORT_TARGETS:
        raise errors.INVALID_SORT_OPTION


def put_fields(req: rpc_pb2.PutRequest, limits: Limits) -> None:
    """etcd's checkPutRequest plus accord's key and value limits."""
    put_values(req.key, req.value, req.lease, req.ignore_value, req.ignore_lease, limits)


def put_values(
    key: bytes, value: bytes, lease: int, ignore_value: bool, ignore_lease: bool, limits: Limits
) -> None:
    """:func:`put_fields` on a Put's fields."""
    _check_key(key, limits)
    if ignore_value and value:
        raise errors.VALUE_PROVIDED
    if ignore_lease and lease:
        raise errors.LEASE_PROVIDED
    if len(value) > limits.max_value_bytes:
        raise errors.value_too_large(len(value), limits.max_value_bytes)


def delete_fields(req: rpc_pb2.DeleteRangeRequest, limits: Limits) -> None:
    """etcd's checkDeleteRequest plus the key limit."""
    _check_key(req.key, limits)


def txn_fields(req: rpc_pb2.TxnRequest, limits: Limits, budget: int | None = None) -> None:
    """etcd's checkTxnRequest: op counts, compare keys, every op (nested txns too).

    As in etcd, the largest of (compares, success ops, failure ops) must not exceed the
    budget, and a nested txn gets the budget left over by its parent.
    """
    n = limits.max_txn_ops if budget is None else budget
    widest = max(len(req.compare), len(req.success), len(req.failure))
    if widest > n:
        raise errors.TOO_MANY_OPS
    for cmp in req.compare:
        _check_key(cmp.key, limits)
    for ops in (req.success, req.failure):
        for op in ops:
            which = op.WhichOneof("request")
            if which == "request_range":
                range_fields(op.request_range, limits)
            elif which == "request_put":
                put_fields(op.request_put, limits)
            elif which == "request_delete_range":
                delete_fields(op.request_delete_range, limits)
            elif which == "request_txn":
                txn_fields(op.request_txn, limits, n - widest)


def check_intervals(
    ops: list[rpc_pb2.RequestOp],
) -> tuple[set[bytes], list[tuple[bytes, bytes]]]:
    """etcd's duplicate-key rule for one branch; returns its (puts, deletes).

    A key may not be put twice, nor put and deleted, anywhere in a branch (nested txns
    included); the then/else branches of a nested txn may put the same key, since only
    one of them runs. Raises ``DUPLICATE_KEY``.
    """
    dels: list[tuple[bytes, bytes]] = []
    for op in ops:
        if op.WhichOneof("request") == "request_delete_range":
            d = op.request_delete_range
            dels.append((d.key, d.range_end))
    puts: set[bytes] = set()

    def deleted(key: bytes) -> bool:
        # etcd compares against the literal interval [key, range_end): a range_end of
        # "\0" ("every key from key on") is an empty interval there, so it never clashes.
        return any(key == k if not end else k <= key < end for k, end in dels)

    for op in ops:
        if op.WhichOneof("request") != "request_txn":
            continue
        puts_then, dels_then = check_intervals(list(op.request_txn.success))
        puts_else, dels_else = check_intervals(list(op.request_txn.failure))
        for key in puts_then:
            if key in puts or deleted(key):
                raise errors.DUPLICATE_KEY
            puts.add(key)
        for key in puts_else:
            if (key in puts and key not in puts_then) or deleted(key):
                raise errors.DUPLICATE_KEY
            puts.add(key)
        dels.extend(dels_then)
        dels.extend(dels_else)
    for op in ops:
        if op.WhichOneof("request") != "request_put":
            continue
        key = op.request_put.key
        if key in puts or deleted(key):
            raise errors.DUPLICATE_KEY
        puts.add(key)
    return puts, dels


def validate_range(req: rpc_pb2.RangeRequest, limits: Limits) -> None:
    """Every store-independent check of a Range."""
    range_fields(req, limits)
    check_size(req.ByteSize(), limits)


def validate_put(req: rpc_pb2.PutRequest, limits: Limits) -> None:
    """Every store-independent check of a Put."""
    put_fields(req, limits)
    check_size(req.ByteSize(), limits)


def validate_delete_range(req: rpc_pb2.DeleteRangeRequest, limits: Limits) -> None:
    """Every store-independent check of a DeleteRange."""
    delete_fields(req, limits)
    check_size(req.ByteSize(), limits)


def validate_txn(req: rpc_pb2.TxnRequest, limits: Limits) -> None:
    """Every store-independent check of a Txn (incl. duplicate keys in each branch)."""
    txn_fields(req, limits)
    check_intervals(list(req.success))
    check_intervals(list(req.failure))
    check_size(req.ByteSize(), limits)


def validate_puts(
    keys: Sequence[bytes], values: Sequence[bytes], size: int, limits: Limits
) -> None:
    """:func:`validate_txn` of a Txn whose only ops are plain puts (no compare, no
    failure branch, no ``prev_kv``/``ignore_*``), given as its keys and values and the
    request's serialized ``size``: the same checks, the same error first, with the
    per-key loops run by C built-ins."""
    if len(keys) > limits.max_txn_ops:
        raise errors.TOO_MANY_OPS
    if keys and (
        min(map(len, keys)) == 0
        or max(map(len, keys)) > limits.max_key_bytes
        or max(map(len, values)) > limits.max_value_bytes
    ):
        for key, value in zip(keys, values, strict=True):  # the first bad op, in order
            put_values(key, value, 0, False, False, limits)
    if len(set(keys)) != len(keys):
        raise errors.DUPLICATE_KEY
    check_size(size, limits)
