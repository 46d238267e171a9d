"""The parts of a multi-shard Txn that do not depend on where it runs: pure functions.

A participant answers for its own keys only; the coordinator combines the answers into
the one answer etcd gives (``docs/txn.md``). The Txn tree is walked in one fixed order
everywhere: a node's compares, then its success ops, then its failure ops, nested Txns
depth first. "Node" numbers and "op" numbers below count in that order.

* :func:`partial_compares` (on a participant): for every compare of every node, whether
  this shard holds a key in its range and whether every such key satisfies it;
* :func:`combine` and :func:`path_of` (on the coordinator): etcd's compare over all
  shards (a compare holds when every shard's part does; a missing key compares as etcd's
  missing key) and the branch path ``txn.path`` would give on one store;
* :func:`put_checks` (on a participant) and :func:`first_error` (on the coordinator):
  etcd's ``checkRequests`` along the taken path, puts first, then ranges;
* :func:`run_share` (on a participant, at commit) and :func:`merge` (on the coordinator).

The functions a participant's apply runs take the request as a :class:`TxnPlan`
(``txnplan.py``): walked once, shared by the entries of one Txn on one member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from accord.proto import rpc_pb2
from accord.services.kv import errors, fanout, txn
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.mvcc import MVCCStore, WriteTxn
from accord.services.kv.ops import Executor
from accord.services.kv.ranges import KeyRange
from accord.services.kv.txnplan import TxnPlan, nodes

Compare = rpc_pb2.Compare


def partial_compares(
    store: MVCCStore, plan: TxnPlan, rev: int
) -> list[list[tuple[bool, bool]]]:
    """Per node, per compare: ``(found a key here, every key found here satisfies it)``."""
    out = []
    compare_one = txn._compare_one
    for node in plan.compares:
        row = []
        for key, end, cmp in node:
            if not end:  # one key: a lookup
                rec = store.get(key, rev)
                row.append((False, True) if rec is None else (True, compare_one(cmp, rec)))
                continue
            found, ok = False, True
            for _key, rec in store.scan(KeyRange.of(key, end), rev):
                found = True
                if not compare_one(cmp, rec):
                    ok = False
                    break
            row.append((found, ok))
        out.append(row)
    return out


def combine(
    plan: TxnPlan, parts: Sequence[Sequence[Sequence[tuple[bool, bool]]]]
) -> list[bool]:
    """Per node: whether all its compares hold, from every participant's
    :func:`partial_compares` (etcd's rule for a compare over keys none holds)."""
    out = []
    for n, node in enumerate(plan.compares):
        holds = True
        for c, (_key, _end, cmp) in enumerate(node):
            found = any(p[n][c][0] for p in parts)
            ok = all(p[n][c][1] for p in parts)
            if found:
                result = ok
            elif cmp.target == Compare.VALUE:
                result = False
            else:
                result = txn._compare_one(cmp, None)
            if not result:
                holds = False
                break
        out.append(holds)
    return out


def fold_partials(
    parts: Sequence[Sequence[Sequence[tuple[bool, bool]]]]
) -> list[list[tuple[bool, bool]]]:
    """Several participants' :func:`partial_compares` as one (found on any, satisfied on
    all): :func:`combine` of it with more parts equals :func:`combine` of them all."""
    if not parts:
        return []
    return [
        [(any(p[n][c][0] for p in parts), all(p[n][c][1] for p in parts))
         for c in range(len(row))]
        for n, row in enumerate(parts[0])
    ]


def path_of(plan: TxnPlan, holds: Sequence[bool]) -> list[bool]:
    """The branch path (``txn.path``'s answer) from :func:`combine`'s per-node results."""
    if plan.flat:
        return [holds[0]]
    out: list[bool] = []
    _path(plan.req, holds, 0, out)
    return out


def _path(req: rpc_pb2.TxnRequest, holds: Sequence[bool], n: int, out: list[bool]) -> int:
    ok = holds[n]
    out.append(ok)
    n += 1
    for branch, taken in ((req.success, ok), (req.failure, not ok)):
        for op in branch:
            if op.WhichOneof("request") != "request_txn":
                continue
            if taken:
                n = _path(op.request_txn, holds, n, out)
            else:
                n += len(nodes(op.request_txn))
    return n


def put_checks(
    ex: Executor, plan: TxnPlan, owns: Callable[[bytes], bool]
) -> dict[int, str]:
    """etcd's state checks of every put this shard holds: ``{op number: error message}``."""
    out: dict[int, str] = {}
    for o, key, lease, ignore in plan.puts:
        if not owns(key):
            continue
        try:
            ex.check_put_values(key, lease, ignore, in_txn=True)
        except EtcdError as e:
            out[o] = e.message
    return out


_BY_MESSAGE = {e.message: e for e in (errors.KEY_NOT_FOUND, errors.LEASE_NOT_FOUND)}


def first_error(
    plan: TxnPlan, path: Sequence[bool], checks: dict[int, str], rev: int,
    compact_rev: int,
) -> EtcdError | None:
    """The error etcd's ``checkRequests`` raises along ``path`` (every put's state, then
    every range's revision), given the participants' :func:`put_checks`, the revision the
    Txn commits at and the highest first revision among them (etcd's: the last
    compaction, -1 if never compacted; ``KVStateMachine.first_revision``); None if there
    is none."""
    taken = plan.taken(path)
    kinds = plan.kinds
    if checks:
        for o, _op in taken:
            if o in checks and kinds[o] == "request_put":
                return _BY_MESSAGE.get(checks[o], errors.bad_request(checks[o]))
    for o, op in taken:
        if kinds[o] == "request_range":
            r = op.request_range.revision
            if r >= rev:
                return errors.FUTURE_REV
            if r != 0 and r < compact_rev:
                return errors.COMPACTED
    return None


def run_share(
    ex: Executor, wt: WriteTxn, plan: TxnPlan, path: Sequence[bool],
    owns: Callable[[bytes], bool], answer: bool = True,
) -> tuple[rpc_pb2.TxnResponse | None, EtcdError | None]:
    """This shard's share of the taken path, written in ``wt`` (at the Txn's revision):
    the puts of keys it holds, its part of every range and delete; and the error of a
    range of it that could not be answered (too large). The decision is made, so the
    writes stand; such a range answers empty here and the error goes back with the
    share, for the coordinator to give the client instead of an answer missing keys
    (as etcd fails a call whose response is over its size limit after applying it).
    Without ``answer`` (nobody on this member reads it) the same writes, with the same
    tags, and ``(None, None)``: no response built, no range read."""
    resp = rpc_pb2.TxnResponse() if answer else None
    failed: list[EtcdError] = []
    tags: list[int] = []
    _run(ex, wt, wt.rev, plan.req, path, [0], owns, resp, failed, tags, [0])
    wt.retag(tags)
    if resp is None:
        return None, None
    resp.header.revision = wt.rev
    return resp, (failed[0] if failed else None)


def read_share(
    ex: Executor, req: rpc_pb2.TxnRequest, path: Sequence[bool], rev: int
) -> rpc_pb2.TxnResponse:
    """This shard's part of a read-only Txn's taken path, every range read at ``rev``
    (here a range's error is the client's answer: nothing is decided yet)."""
    resp = rpc_pb2.TxnResponse()
    _run(ex, None, rev, req, path, [0], lambda _k: False, resp)
    resp.header.revision = rev
    return resp


def _run(
    ex: Executor, wt: WriteTxn | None, rev: int, req: rpc_pb2.TxnRequest,
    path: Sequence[bool], p: list[int], owns: Callable[[bytes], bool],
    resp: rpc_pb2.TxnResponse | None, failed: list[EtcdError] | None = None,
    tags: list[int] | None = None, at: list[int] | None = None,
) -> None:
    """Walk the taken path in execution order; with ``tags``, each change written gets
    its operation's place in that order over the whole Txn (``at`` counts the operations
    run so far, every shard counting the same: ``WriteTxn.retag``). With ``resp`` None
    the writes alone: nothing answered, nothing read."""
    ok = path[p[0]]
    p[0] += 1
    if resp is not None:
        resp.succeeded = ok
    for op in req.success if ok else req.failure:
        which = op.WhichOneof("request")
        out = resp.responses.add() if resp is not None else None
        if tags is None or at is None or wt is None or which == "request_txn":
            _run_op(ex, wt, rev, op, which, path, p, owns, out, failed, tags, at)
            continue
        place, at[0] = at[0], at[0] + 1
        written = len(wt.changes)
        _run_op(ex, wt, rev, op, which, path, p, owns, out, failed)
        tags.extend([place] * (len(wt.changes) - written))


def _run_op(
    ex: Executor, wt: WriteTxn | None, rev: int, op: rpc_pb2.RequestOp, which: str | None,
    path: Sequence[bool], p: list[int], owns: Callable[[bytes], bool],
    out: rpc_pb2.ResponseOp | None, failed: list[EtcdError] | None,
    tags: list[int] | None = None, at: list[int] | None = None,
) -> None:
    """One operation of :func:`_run` (a nested Txn walked in turn); with ``out`` None
    its writes only (a range changes nothing: skipped)."""
    if out is None:
        if which == "request_txn":
            _run(ex, wt, rev, op.request_txn, path, p, owns, None, failed, tags, at)
        elif wt is None:
            raise ValueError("a read share of a Txn that writes")
        elif which == "request_put":
            if owns(op.request_put.key):
                ex.put(wt, op.request_put)
        elif which == "request_delete_range":
            ex.delete_range(wt, op.request_delete_range)
        return
    if which == "request_range":
        try:
            out.response_range.CopyFrom(ex.range(op.request_range, rev))
        except EtcdError as e:
            if wt is None or failed is None:
                raise
            out.response_range.SetInParent()
            failed.append(e)
    elif which == "request_txn":
        out.response_txn.header.SetInParent()
        _run(ex, wt, rev, op.request_txn, path, p, owns, out.response_txn, failed, tags,
             at)
    elif wt is None:
        raise ValueError("a read share of a Txn that writes")
    elif which == "request_put":
        if owns(op.request_put.key):
            out.response_put.CopyFrom(ex.put(wt, op.request_put))
        else:
            out.response_put.SetInParent()
    elif which == "request_delete_range":
        out.response_delete_range.CopyFrom(ex.delete_range(wt, op.request_delete_range))


def merge(
    req: rpc_pb2.TxnRequest, path: Sequence[bool], parts: dict[int, rpc_pb2.TxnResponse],
    rev: int, limits: Limits, shard_of: Callable[[bytes], int],
) -> rpc_pb2.TxnResponse:
    """One TxnResponse at ``rev`` from every participant's :func:`run_share` answer."""
    resp = rpc_pb2.TxnResponse()
    _merge(req, path, [0], parts, rev, limits, shard_of, resp)
    txn.answer_at(resp, rev)
    return resp


def _merge(
    req: rpc_pb2.TxnRequest, path: Sequence[bool], p: list[int],
    parts: dict[int, rpc_pb2.TxnResponse], rev: int, limits: Limits,
    shard_of: Callable[[bytes], int], resp: rpc_pb2.TxnResponse,
) -> None:
    ok = path[p[0]]
    p[0] += 1
    resp.succeeded = ok
    for i, op in enumerate(req.success if ok else req.failure):
        which = op.WhichOneof("request")
        out = resp.responses.add()
        mine = {s: part.responses[i] for s, part in parts.items()}
        if which == "request_range":
            rr = fanout.merge_ranges(
                op.request_range, [m.response_range for m in mine.values()], rev, limits)
            out.response_range.CopyFrom(rr)
        elif which == "request_put":
            owner = mine.get(shard_of(op.request_put.key))
            if owner is not None:
                out.response_put.CopyFrom(owner.response_put)
            else:
                out.response_put.SetInParent()
        elif which == "request_delete_range":
            dr = fanout.merge_deletes([m.response_delete_range for m in mine.values()])
            out.response_delete_range.CopyFrom(dr)
        elif which == "request_txn":
            out.response_txn.SetInParent()
            _merge(op.request_txn, path, p,
                   {s: m.response_txn for s, m in mine.items()}, rev, limits, shard_of,
                   out.response_txn)
