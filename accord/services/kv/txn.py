"""Txn guards: compare evaluation, the branch path through nested txns, read-only test.

As in etcd, the whole path (which branch runs at every nesting level) is decided from
the state *before* the transaction writes anything, so a nested txn's compares do not
see the writes of the enclosing branch.
"""

from __future__ import annotations

from accord.proto import rpc_pb2
from accord.services.kv.mvcc import CREATE, LEASE, MOD, VALUE, VERSION, MVCCStore, Rec
from accord.services.kv.ranges import KeyRange

Compare = rpc_pb2.Compare


def _compare_one(cmp: rpc_pb2.Compare, rec: Rec | None) -> bool:
    target = cmp.target
    result: int
    if target == Compare.VALUE:
        have = (rec[VALUE] or b"") if rec is not None else b""
        want = cmp.value
        result = (have > want) - (have < want)
    else:
        if target == Compare.VERSION:
            have_i, want_i = (rec[VERSION] if rec else 0), cmp.version
        elif target == Compare.CREATE:
            have_i, want_i = (rec[CREATE] if rec else 0), cmp.create_revision
        elif target == Compare.MOD:
            have_i, want_i = (rec[MOD] if rec else 0), cmp.mod_revision
        elif target == Compare.LEASE:
            have_i, want_i = (rec[LEASE] if rec else 0), cmp.lease
        else:
            have_i = want_i = 0
        result = (have_i > want_i) - (have_i < want_i)
    op = cmp.result
    if op == Compare.EQUAL:
        return result == 0
    if op == Compare.NOT_EQUAL:
        return result != 0
    if op == Compare.GREATER:
        return result > 0
    if op == Compare.LESS:
        return result < 0
    return True


def compare(store: MVCCStore, cmp: rpc_pb2.Compare, rev: int) -> bool:
    """Whether one guard holds at ``rev``.

    Over a range every key must satisfy it; a missing key compares as version, create,
    mod and lease 0, and a VALUE compare on a missing key always fails (etcd's rule: an
    empty value and a missing one cannot be told apart).
    """
    found = False
    for _key, rec in store.scan(KeyRange.of(cmp.key, cmp.range_end), rev):
        found = True
        if not _compare_one(cmp, rec):
            return False
    if found:
        return True
    if cmp.target == Compare.VALUE:
        return False
    return _compare_one(cmp, None)


def path(store: MVCCStore, req: rpc_pb2.TxnRequest, rev: int) -> list[bool]:
    """The branch taken by this txn and, depth first, by every nested txn on the way."""
    ok = all(compare(store, c, rev) for c in req.compare)
    out = [ok]
    for op in req.success if ok else req.failure:
        if op.WhichOneof("request") == "request_txn":
            out.extend(path(store, op.request_txn, rev))
    return out


def is_read_only(req: rpc_pb2.TxnRequest) -> bool:
    """True if no branch at any depth contains a Put or a DeleteRange."""
    for ops in (req.success, req.failure):
        for op in ops:
            which = op.WhichOneof("request")
            if which in ("request_put", "request_delete_range"):
                return False
            if which == "request_txn" and not is_read_only(op.request_txn):
                return False
    return True
