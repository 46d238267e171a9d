"""Executing Range, Put, DeleteRange and Txn requests against the MVCC store.

Responses carry a header holding only ``revision`` (what etcd puts in the responses
nested in a Txn); the servicer fills in the rest of the top-level header. Store-state
checks (lease exists, key exists for ignore_*, read revisions) run before any write, so
a failing request changes nothing; a write transaction is also rolled back if anything
raises midway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accord.proto import rpc_pb2
from accord.services.kv import errors, txn
from accord.services.kv.leases import LeaseTable
from accord.services.kv.limits import Limits
from accord.services.kv.mvcc import CREATE, LEASE, MOD, VALUE, VERSION, MVCCStore, Rec, WriteTxn
from accord.services.kv.pbconv import kv_pb
from accord.services.kv.ranges import KeyRange

RR = rpc_pb2.RangeRequest
_KV_OVERHEAD = 32
"""Bytes counted per returned KeyValue besides key and value (its five varints and tags)."""

_SORT_KEYS: dict[int, Callable[[tuple[bytes, Rec]], Any]] = {
    RR.KEY: lambda kr: kr[0],
    RR.VERSION: lambda kr: kr[1][VERSION],
    RR.CREATE: lambda kr: kr[1][CREATE],
    RR.MOD: lambda kr: kr[1][MOD],
    RR.VALUE: lambda kr: kr[1][VALUE],
}


class Executor:
    """Runs requests on one store and its lease table, with the configured limits."""

    __slots__ = ("leases", "limits", "store")

    def __init__(self, store: MVCCStore, leases: LeaseTable, limits: Limits) -> None:
        self.store = store
        self.leases = leases
        self.limits = limits

    # --- Range ------------------------------------------------------------------------
    def range(self, req: rpc_pb2.RangeRequest, view_rev: int,
              top: int = 0) -> rpc_pb2.RangeResponse:
        """etcd's Range as seen from ``view_rev`` (the current revision, or a write txn's).
        ``top``: the store's revision, if above ``view_rev``: on a shard of several, a
        revision between the two was made on another shard, and this shard's state there
        is its state at ``view_rev`` (a Txn's range at a revision of the store).

        Every field is read from the message once (each read of a protobuf field costs
        as much as a dictionary lookup and an allocation), and a single key is a lookup,
        not a scan."""
        store = self.store
        rev = req.revision
        if rev > view_rev and rev > top:
            raise errors.FUTURE_REV
        if rev <= 0:
            rev = view_rev
        if rev < store.compact_rev:
            raise errors.COMPACTED
        key, end = req.key, req.range_end
        order, target, limit = req.sort_order, req.sort_target, req.limit
        max_mod, min_mod = req.max_mod_revision, req.min_mod_revision
        max_create, min_create = req.max_create_revision, req.min_create_revision
        count_only, keys_only = req.count_only, req.keys_only
        found: list[tuple[bytes, Rec]]
        if not end:
            rec = store.get(key, rev)
            count = 0 if rec is None else 1
            found = [] if rec is None or count_only else [(key, rec)]
        else:
            fetch_all = bool(order != RR.NONE or min_mod or max_mod or min_create or max_create)
            want = 0 if fetch_all or limit <= 0 else limit + 1
            count = 0
            found = []
            for item in store.scan(KeyRange.of(key, end), rev):
                count += 1
                if not count_only and (want == 0 or len(found) < want):
                    found.append(item)
        if found and (max_mod or min_mod or max_create or min_create):
            if max_mod:
                found = [kr for kr in found if kr[1][MOD] <= max_mod]
            if min_mod:
                found = [kr for kr in found if kr[1][MOD] >= min_mod]
            if max_create:
                found = [kr for kr in found if kr[1][CREATE] <= max_create]
            if min_create:
                found = [kr for kr in found if kr[1][CREATE] >= min_create]
        if target != RR.KEY and order == RR.NONE:
            order = RR.ASCEND
        if len(found) > 1 and order in (RR.ASCEND, RR.DESCEND) and not (
            target == RR.KEY and order == RR.ASCEND
        ):
            found.sort(key=_SORT_KEYS[target], reverse=order == RR.DESCEND)
        resp = rpc_pb2.RangeResponse(count=count)
        if limit > 0 and len(found) > limit:
            del found[limit:]
            resp.more = True
        if found:
            size = 0
            cap = self.limits.max_range_result_bytes
            for k, rec in found:
                size += len(k) + _KV_OVERHEAD + (0 if keys_only else len(rec[VALUE] or b""))
                if size > cap:
                    raise errors.range_too_large(size, cap)
            add = resp.kvs.add
            for k, rec in found:
                add(key=k, create_revision=rec[CREATE], mod_revision=rec[MOD],
                    version=rec[VERSION], value=b"" if keys_only else (rec[VALUE] or b""),
                    lease=rec[LEASE])
        resp.header.revision = view_rev
        return resp

    # --- state checks (before any write) -------------------------------------------------
    def check_put_state(self, req: rpc_pb2.PutRequest, in_txn: bool) -> None:
        """Lease exists; key exists when ignore_value/ignore_lease (etcd's order differs
        between a plain Put and a Put inside a Txn, and so does ours)."""
        self.check_put_values(req.key, req.lease, req.ignore_value or req.ignore_lease, in_txn)

    def check_put_values(self, key: bytes, lease: int, ignore: bool, in_txn: bool) -> None:
        """:meth:`check_put_state` on a Put's fields (``ignore``: ignore_value or
        ignore_lease is set)."""
        lease_missing = lease != 0 and lease not in self.leases.leases
        if not in_txn and lease_missing:
            raise errors.LEASE_NOT_FOUND
        if ignore and self.store.get(key, self.store.rev) is None:
            raise errors.KEY_NOT_FOUND
        if lease_missing:
            raise errors.LEASE_NOT_FOUND

    def check_txn_state(self, req: rpc_pb2.TxnRequest, taken: list[bool],
                        top: int = 0) -> None:
        """etcd's checkRequests along the taken path: every put's state first, then every
        range's revision (so a bad put wins over a bad range that comes before it); a
        range above ``top`` (the store's revision as the Txn sees it, 0: this store's
        latest) is in the future."""
        top = top or self.store.rev
        ops = self._taken_ops(req, taken, 0, [])[1]
        for op in ops:
            if op.WhichOneof("request") == "request_put":
                self.check_put_state(op.request_put, in_txn=True)
        for op in ops:
            if op.WhichOneof("request") == "request_range":
                r = op.request_range.revision
                if r > top:
                    raise errors.FUTURE_REV
                if r != 0 and r < self.store.compact_rev:
                    # etcd's quirk, kept: after a compaction a *negative* revision in a
                    # Txn's range is "compacted" (a plain Range reads it as "latest")
                    raise errors.COMPACTED

    def _taken_ops(
        self, req: rpc_pb2.TxnRequest, taken: list[bool], i: int, out: list[rpc_pb2.RequestOp]
    ) -> tuple[int, list[rpc_pb2.RequestOp]]:
        """The ops of the branches taken (nested txns flattened, in order)."""
        ops = req.success if taken[i] else req.failure
        i += 1
        for op in ops:
            if op.WhichOneof("request") == "request_txn":
                i, _ = self._taken_ops(op.request_txn, taken, i, out)
            else:
                out.append(op)
        return i, out

    # --- writes ------------------------------------------------------------------------
    def put(self, wt: WriteTxn, req: rpc_pb2.PutRequest) -> rpc_pb2.PutResponse:
        """Write one key in ``wt`` (state already checked)."""
        return self.put_values(
            wt, req.key, req.value, req.lease, req.prev_kv, req.ignore_value, req.ignore_lease
        )

    def put_values(
        self,
        wt: WriteTxn,
        key: bytes,
        value: bytes,
        lease: int,
        prev_kv: bool = False,
        ignore_value: bool = False,
        ignore_lease: bool = False,
    ) -> rpc_pb2.PutResponse:
        """:meth:`put` on a Put's fields."""
        if ignore_value or ignore_lease or prev_kv:
            prev = self.store.get(key, wt.read_rev)
            if prev is not None:
                if ignore_value:
                    value = prev[VALUE] or b""
                if ignore_lease:
                    lease = prev[LEASE]
        else:
            prev = None
        wt.put(key, value, lease)
        resp = rpc_pb2.PutResponse()
        if prev_kv and prev is not None:
            resp.prev_kv.CopyFrom(kv_pb(key, prev))
        resp.header.revision = wt.rev
        return resp

    def delete_range(
        self, wt: WriteTxn, req: rpc_pb2.DeleteRangeRequest
    ) -> rpc_pb2.DeleteRangeResponse:
        """Delete the keys of a range in ``wt``."""
        gone = wt.delete(KeyRange.of(req.key, req.range_end))
        resp = rpc_pb2.DeleteRangeResponse(deleted=len(gone))
        if req.prev_kv:
            resp.prev_kvs.extend([kv_pb(key, rec) for key, rec in gone])
        resp.header.revision = wt.rev if wt.changes else self.store.rev
        return resp

    def txn(self, wt: WriteTxn | None, req: rpc_pb2.TxnRequest,
            top: int = 0) -> rpc_pb2.TxnResponse:
        """Evaluate the guards, check the taken path, then run it (in ``wt`` if it writes).

        ``top``: the store's revision as the Txn sees it, the highest its ranges may
        name (etcd's current revision before the Txn): by default this store's latest;
        a read-only Txn served as a read on a shard of several passes the read's (the
        revisions between the shard's latest and it were made on other shards, and the
        shard's state there is its latest). A Txn that writes is applied with the
        default on every member alike: its proposer floors the shard at the highest
        revision its ranges name first (``StateMachineBackend.txn``)."""
        if not top:
            top = self.store.rev
        taken = txn.path(self.store, req, self.store.rev)
        self.check_txn_state(req, taken, top)
        resp = rpc_pb2.TxnResponse()
        self._run(wt, req, taken, 0, resp, top)
        if wt is not None and wt.changes:
            resp.header.revision = wt.rev
        else:
            resp.header.revision = self.store.rev
        return resp

    def _run(
        self,
        wt: WriteTxn | None,
        req: rpc_pb2.TxnRequest,
        taken: list[bool],
        i: int,
        resp: rpc_pb2.TxnResponse,
        top: int = 0,
    ) -> int:
        ok = taken[i]
        i += 1
        resp.succeeded = ok
        for op in req.success if ok else req.failure:
            which = op.WhichOneof("request")
            out = resp.responses.add()
            if which == "request_range":
                view = wt.read_rev if wt is not None else self.store.rev
                out.response_range.CopyFrom(self.range(op.request_range, view, top))
            elif which == "request_put":
                assert wt is not None, "a txn with a put runs in a write transaction"
                out.response_put.CopyFrom(self.put(wt, op.request_put))
            elif which == "request_delete_range":
                assert wt is not None, "a txn with a delete runs in a write transaction"
                out.response_delete_range.CopyFrom(self.delete_range(wt, op.request_delete_range))
            elif which == "request_txn":
                out.response_txn.header.SetInParent()
                i = self._run(wt, op.request_txn, taken, i, out.response_txn, top)
        return i
