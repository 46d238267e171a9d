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


def answer_at(resp: rpc_pb2.TxnResponse, revision: int) -> None:
    """Give a Txn's answer at ``revision`` the header revisions one etcd gives it
    (measured against etcd 3.4): the Txn's own is ``revision``; each Range, Put and
    DeleteRange answer is at ``revision`` once a change has been made at or before it
    in the Txn's order (a Put, a DeleteRange that deleted something), and before that
    at the revision just below, the state the Txn started from (``revision`` itself
    when the Txn changes nothing); a nested Txn's own header says 0.

    Used where the shard's own answer cannot know ``revision``: a read answered at the
    read's revision, a write that wrote nothing raised to its stamp, a Txn merged from
    several shards' shares, and a one-shard write whose reads saw the shard's own
    latest revision, a lower name for the same state (``docs/txn.md``)."""
    before = revision - 1 if _changes(resp) else revision
    resp.header.revision = revision
    _stamp(resp, revision, before, [False])


def _changes(resp: rpc_pb2.TxnResponse) -> bool:
    for op in resp.responses:
        kind = op.WhichOneof("response")
        if kind == "response_put" or (kind == "response_delete_range"
                                      and op.response_delete_range.deleted):
            return True
        if kind == "response_txn" and _changes(op.response_txn):
            return True
    return False


def _stamp(resp: rpc_pb2.TxnResponse, revision: int, before: int, changed: list[bool]) -> None:
    for op in resp.responses:
        kind = op.WhichOneof("response")
        if kind == "response_range":
            op.response_range.header.revision = revision if changed[0] else before
        elif kind == "response_put":
            changed[0] = True
            op.response_put.header.revision = revision
        elif kind == "response_delete_range":
            dr = op.response_delete_range
            changed[0] = changed[0] or dr.deleted > 0
            dr.header.revision = revision if changed[0] else before
        elif kind == "response_txn":
            op.response_txn.header.revision = 0
            _stamp(op.response_txn, revision, before, changed)
