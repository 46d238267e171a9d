"""The KV state machine each shard applies: commands in, etcd responses out.

``apply`` is deterministic: it depends only on the state and the command bytes (lease
commands carry the leader's clock and term; nothing here reads a clock). Reads run
without a Raft entry. See ``STORE_API.md`` for the contract with the servicers.

Commands come in two formats. Format 1 (``codec.py``) carries the serialized etcd
request. Format 2 is the compact form of the two writes that dominate, made once on the
proposer so that no replica parses protobuf or walks a message to apply them (every
replica applies every command: on a 3-node cluster that work is done three times):

* ``[2, Kind.PUT, min_revision, size, key, value, lease, flags]``: a Put (``flags``:
  1 prev_kv, 2 ignore_value, 4 ignore_lease);
* ``[2, Kind.TXN, min_revision, size, [key, value, lease, key, value, lease, ...]]``: a
  Txn with no compare and no failure branch whose ops are plain puts (no prev_kv, no
  ignore_*), which is what ``client.batcher()`` sends.

``size`` is the serialized request's size, for the request-size limit. Both forms are
validated again when applied, in etcd's order, and answer exactly what format 1 answers
for the same request. Format 1 is still applied, so a log written before applies as it
did; a format-1 Put or Txn is also what an older proposer sends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accord.proto import rpc_pb2
from accord.services.kv import errors, sharding, txn, validate, xcommands, xtxn
from accord.services.kv.codec import Kind, decode, encode
from accord.services.kv.intents import (
    ABORTED,
    COMMITTED,
    EXPIRE,
    PENDING,
    REVOKE,
    Intent,
    IntentTable,
    Record,
)
from accord.services.kv.leases import LeaseTable
from accord.services.kv.limits import Limits
from accord.services.kv.mvcc import LEASE, MOD, VALUE, MVCCStore, WriteTxn
from accord.services.kv.ops import Executor
from accord.services.kv.pbwire import varint
from accord.services.kv.ranges import KeyRange
from accord.services.kv.revorder import noop_floor
from accord.services.kv.txnplan import TxnPlan, plan_of
from accord.services.kv.watchhub import Change, WatchHub

SNAPSHOT_FORMAT = 1
COMPACT_FORMAT = 2
"""The format number of the compact command forms (see the module docstring)."""
RECENT_KEPT = 1024
"""How many multi-shard commits a shard remembers for serializable reads
(``recent_commits``)."""
SETTLED_KEPT = 4096
"""How many resolved intents a shard remembers the commit revision of (``settled_at``)."""
_PREV_KV, _IGNORE_VALUE, _IGNORE_LEASE = 1, 2, 4


@dataclass(slots=True)
class ExpireResult:
    """What an expire command did: the leases revoked and the revision afterwards."""

    revoked: list[int] = field(default_factory=list)
    revision: int = 0


class KVStateMachine:
    """MVCC store + leases + watch hub of one shard."""

    def __init__(
        self, *, limits: Limits | None = None, lease_id_seed: int = 0,
        stripe: tuple[int, int] = (1, 0),
    ) -> None:
        self.limits = limits or Limits()
        if not (stripe[0] >= 1 and 0 <= stripe[1] < stripe[0]):
            raise ValueError(f"stripe must be (shards, shard) with 0 <= shard < shards: {stripe}")
        self.stripe = stripe
        """``(shard count, this shard's index)``: where its ordered writes' revisions lie
        (``revorder.py``); every replica of a shard is built with the same."""
        self._store = MVCCStore()
        self._store.stripe = stripe
        self._leases = LeaseTable(lease_id_seed)
        self._exec = Executor(self._store, self._leases, self.limits)
        self.watch_hub = WatchHub(self._store, self.limits)
        self._x = IntentTable()
        self._held: list[tuple[int, list[Change]]] = []
        """Publications above an open intent's revision, held back in revision order
        until it is resolved (``docs/txn.md``, "Watches over several shards")."""
        self.broken_lease_puts = False
        """A deliberately broken variant for tests: a Put attaching a key to a lease
        whose revoke across shards is in progress is not held back (the key then
        outlives the lease). Never set outside tests."""
        self.recent_commits: deque[tuple[int, tuple[int, ...]]] = deque(maxlen=RECENT_KEPT)
        """The multi-shard Txns (and lease revokes, in which every shard takes part) this
        replica committed its share of lately, as ``(revision, participants)``: a serializable read over several shards answers
        below one whose share another participant's replica on this member has not
        applied yet (``StateMachineBackend.range``). Local and bounded, not replicated
        state."""
        self.settled_at: dict[int, int] = {}
        """Where the intents resolved here lately went: txn id -> the revision its
        commit took on this shard (0: aborted). Local and bounded (the latest
        :data:`SETTLED_KEPT`), not replicated state: a reader that waited for an intent
        learns from it whether the Txn landed above the revision it reads at
        (``Coordinator.wait_free``)."""
        self.broken_decide_at_want = False
        """A deliberately broken variant for tests: a ``PREPARE_DECIDE`` takes the highest
        revision the other participants reserved as it is, even when this shard has
        written it since (two writes then share a revision). Never set outside tests."""

    def set_stripe(self, stripe: tuple[int, int]) -> None:
        """Place this shard in an ``(shards, index)`` store (before it applies anything
        ordered; every replica of the shard must be given the same)."""
        if not (stripe[0] >= 1 and 0 <= stripe[1] < stripe[0]):
            raise ValueError(f"stripe must be (shards, shard) with 0 <= shard < shards: {stripe}")
        self.stripe = stripe
        self._store.stripe = stripe

    # --- state -----------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        """Current revision (1 for an empty store, as etcd)."""
        return self._store.rev

    def recent_revisions(self, n: int) -> list[int]:
        """The ``n`` highest revisions this shard wrote at (``MVCCStore.recent_revisions``)."""
        return self._store.recent_revisions(n)

    @property
    def compact_revision(self) -> int:
        """Revision of the last compaction (0 if never compacted)."""
        return max(0, self._store.compact_rev)

    @property
    def first_revision(self) -> int:
        """etcd's first revision of the store, below which a Txn's range is refused as
        compacted: the last compaction's revision, -1 if never compacted (so that a
        range at revision -1 of a store never compacted is read, as one etcd reads it)."""
        return self._store.compact_rev

    @property
    def store(self) -> MVCCStore:
        """The underlying MVCC store (read-only use)."""
        return self._store

    @property
    def leases(self) -> LeaseTable:
        """The underlying lease table (read-only use)."""
        return self._leases

    @property
    def intents(self) -> IntentTable:
        """The open intents and transaction records of this shard (read-only use)."""
        return self._x

    # --- command encoders ------------------------------------------------------------------
    @staticmethod
    def encode_put(req: rpc_pb2.PutRequest, *, min_revision: int = 0) -> bytes:
        """A Put command (compact form)."""
        return _put_command(
            min_revision, req.ByteSize(), req.key, req.value, req.lease, req.prev_kv,
            req.ignore_value, req.ignore_lease,
        )

    def validate_and_encode_put(self, req: rpc_pb2.PutRequest, min_revision: int = 0) -> bytes:
        """:meth:`validate_put` then :meth:`encode_put`, reading each field of ``req``
        once (the proposer's whole work on a Put; ``min_revision``: a floor, or a
        negative ordered stamp, ``revorder.py``)."""
        key, value, lease = req.key, req.value, req.lease
        ignore_value, ignore_lease = req.ignore_value, req.ignore_lease
        validate.put_values(key, value, lease, ignore_value, ignore_lease, self.limits)
        size = req.ByteSize()
        validate.check_size(size, self.limits)
        return _put_command(min_revision, size, key, value, lease, req.prev_kv, ignore_value,
                            ignore_lease)

    def validate_and_encode_put_v1(self, req: rpc_pb2.PutRequest) -> bytes:
        """:meth:`validate_put` then the format-1 Put command (the serialized request),
        which every accord version applies: what a proposer sends while some member
        cannot apply format 2 (``Backend.compact_commands``)."""
        self.validate_put(req)
        return encode(Kind.PUT, req.SerializeToString())

    @staticmethod
    def encode_delete_range(req: rpc_pb2.DeleteRangeRequest, *, min_revision: int = 0) -> bytes:
        """A DeleteRange command."""
        return encode(Kind.DELETE_RANGE, req.SerializeToString(), min_revision=min_revision)

    @staticmethod
    def encode_txn(req: rpc_pb2.TxnRequest, *, min_revision: int = 0, compact: bool = True) -> bytes:
        """A Txn command (the compact form when its ops are only plain puts, unless
        ``compact`` is False: then always format 1)."""
        items = KVStateMachine.plain_puts(req) if compact else None
        if items is not None:
            return KVStateMachine.encode_puts(items, req.ByteSize(), min_revision=min_revision)
        return encode(Kind.TXN, req.SerializeToString(), min_revision=min_revision)

    @staticmethod
    def plain_puts(req: rpc_pb2.TxnRequest) -> list[Any] | None:
        """``[key, value, lease, ...]`` of a Txn that only puts (no compare, no failure
        branch, no prev_kv or ignore_* on any put, at least one put); else None."""
        if len(req.compare) or len(req.failure) or not len(req.success):
            return None
        items: list[Any] = []
        add = items.extend
        for op in req.success:
            if not op.HasField("request_put"):
                return None
            p = op.request_put
            if p.prev_kv or p.ignore_value or p.ignore_lease:
                return None
            add((p.key, p.value, p.lease))
        return items

    @staticmethod
    def encode_puts(items: list[Any], size: int, *, min_revision: int = 0) -> bytes:
        """The compact Txn command of :meth:`plain_puts`' ``items``; ``size``: the
        TxnRequest's serialized size."""
        body = [COMPACT_FORMAT, Kind.TXN.value, min_revision, size, items]
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        return packed

    @staticmethod
    def encode_compact(req: rpc_pb2.CompactionRequest, *, min_revision: int = 0) -> bytes:
        """A Compact command (``min_revision``: floor the shard there first, so a shard
        behind the others can be compacted at the cluster's revision)."""
        return encode(Kind.COMPACT, req.SerializeToString(), min_revision=min_revision)

    @staticmethod
    def encode_lease_grant(req: rpc_pb2.LeaseGrantRequest, now_ms: int, term: int = 0) -> bytes:
        """A LeaseGrant command stamped with the leader's clock and term."""
        return encode(Kind.LEASE_GRANT, req.SerializeToString(), now_ms=now_ms, term=term)

    @staticmethod
    def encode_lease_revoke(
        req: rpc_pb2.LeaseRevokeRequest, *, min_revision: int = 0
    ) -> bytes:
        """A LeaseRevoke command (deletes the lease's keys in one revision)."""
        return encode(Kind.LEASE_REVOKE, req.SerializeToString(), min_revision=min_revision)

    @staticmethod
    def encode_lease_checkpoint(
        now_ms: int,
        term: int = 0,
        req: rpc_pb2.LeaseCheckpointRequest | None = None,
    ) -> bytes:
        """A checkpoint: advances the replicated lease clock (which checkpoints every
        lease's remaining TTL) and, with ``req``, sets given leases' remaining TTLs."""
        payload = req.SerializeToString() if req is not None else b""
        return encode(Kind.LEASE_CHECKPOINT, payload, now_ms=now_ms, term=term)

    @staticmethod
    def encode_lease_expire(
        ids: list[int], now_ms: int, term: int = 0, *, min_revision: int = 0
    ) -> bytes:
        """Expire leases the leader found overdue (re-checked when applied)."""
        return encode(
            Kind.LEASE_EXPIRE, b"", now_ms=now_ms, term=term, ids=list(ids),
            min_revision=min_revision,
        )

    @staticmethod
    def encode_floor(revision: int) -> bytes:
        """Raise the shard's revision to at least ``revision`` without changing a key.

        A read across shards at revision R floors every shard it reads at R, so that no
        shard ever writes at or below R afterwards and the read stays a true snapshot."""
        return encode(Kind.FLOOR, b"", min_revision=revision)

    @staticmethod
    def encode_lease_keepalive(lease_id: int, now_ms: int, term: int = 0) -> bytes:
        """A KeepAlive command."""
        return encode(
            Kind.LEASE_KEEPALIVE,
            rpc_pb2.LeaseKeepAliveRequest(ID=lease_id).SerializeToString(),
            now_ms=now_ms,
            term=term,
        )

    # --- validation the servicer can run before proposing ----------------------------------
    def validate_range(self, req: rpc_pb2.RangeRequest) -> None:
        """Store-independent checks of a Range."""
        validate.validate_range(req, self.limits)

    def validate_put(self, req: rpc_pb2.PutRequest) -> None:
        """Store-independent checks of a Put."""
        validate.validate_put(req, self.limits)

    def validate_delete_range(self, req: rpc_pb2.DeleteRangeRequest) -> None:
        """Store-independent checks of a DeleteRange."""
        validate.validate_delete_range(req, self.limits)

    def validate_txn(self, req: rpc_pb2.TxnRequest) -> None:
        """Store-independent checks of a Txn."""
        validate.validate_txn(req, self.limits)

    def validate_puts(self, items: list[Any], size: int) -> None:
        """:meth:`validate_txn` of a Txn given as :meth:`plain_puts`' ``items``."""
        validate.validate_puts(items[0::3], items[1::3], size, self.limits)

    def validate_compact(self, req: rpc_pb2.CompactionRequest) -> None:
        """Pre-check a Compact against the current revisions (apply re-checks)."""
        if req.revision <= self._store.compact_rev:
            raise errors.COMPACTED
        if req.revision > self._store.rev:
            raise errors.FUTURE_REV

    def validate_lease_grant(self, req: rpc_pb2.LeaseGrantRequest) -> None:
        """Pre-check a LeaseGrant (TTL, explicit id collision, lease count)."""
        if req.TTL > self.limits.max_lease_ttl_s:
            raise errors.LEASE_TTL_TOO_LARGE
        if req.ID != 0 and req.ID in self._leases.leases:
            raise errors.LEASE_EXISTS
        if len(self._leases.leases) >= self.limits.max_leases:
            raise errors.too_many_leases(self.limits.max_leases)

    # --- apply -----------------------------------------------------------------------------
    def apply(self, command: bytes, answer: bool = True) -> object:
        """Apply one committed command; returns its response or raises ``EtcdError``.

        Without ``answer`` (nobody on this member waits for it: the host's
        ``apply_unanswered``) the state changes the same, and a multi-shard Txn's
        command builds no answer (its compares, checks and share's response are read by
        the coordinator's member only); other commands' answers are small and built."""
        if len(command) > 1 and command[1] == COMPACT_FORMAT:
            return self._apply_compact(command)
        if len(command) > 1 and command[1] == xcommands.XFORMAT:
            return self._apply_x(command, answer)
        cmd = decode(command)
        kind = cmd.kind
        if kind == Kind.PUT:
            put = _parse(rpc_pb2.PutRequest, cmd.payload)
            validate.validate_put(put, self.limits)
            if self._x.intents:
                self._check_free([KeyRange(put.key, None, True)])
                if put.lease:
                    self._check_lease_free([put.lease])
            self._exec.check_put_state(put, in_txn=False)
            return self._write(cmd.min_revision, lambda wt: self._exec.put(wt, put))
        if kind == Kind.DELETE_RANGE:
            dr = _parse(rpc_pb2.DeleteRangeRequest, cmd.payload)
            validate.validate_delete_range(dr, self.limits)
            if self._x.intents:
                self._check_free([KeyRange.of(dr.key, dr.range_end)])
            return self._write(cmd.min_revision, lambda wt: self._exec.delete_range(wt, dr))
        if kind == Kind.TXN:
            tr = _parse(rpc_pb2.TxnRequest, cmd.payload)
            validate.validate_txn(tr, self.limits)
            if txn.is_read_only(tr):
                return self._exec.txn(None, tr)
            if self._x.intents:
                plan = TxnPlan(tr)
                self._check_free([KeyRange.of(k, e) for k, e in plan.ranges])
                self._check_lease_free({lease for _o, _k, lease, _i in plan.puts if lease})
            return self._write(cmd.min_revision, lambda wt: self._exec.txn(wt, tr))
        if kind == Kind.FLOOR:
            self._store.raise_floor(cmd.min_revision)
            return self._store.rev
        if kind == Kind.COMPACT:
            cr = _parse(rpc_pb2.CompactionRequest, cmd.payload)
            low = self._x.lowest_rev()
            if low and cr.revision >= low:
                raise errors.Locked(min(self._x.intents))
            self._store.raise_floor(cmd.min_revision)
            self._store.compact(cr.revision)
            resp = rpc_pb2.CompactionResponse()
            resp.header.revision = self._store.rev
            return resp
        if kind in (Kind.LEASE_GRANT, Kind.LEASE_CHECKPOINT, Kind.LEASE_EXPIRE,
                    Kind.LEASE_KEEPALIVE):
            self._leases.observe(cmd.now_ms, cmd.term)
        if kind == Kind.LEASE_GRANT:
            return self._lease_grant(_parse(rpc_pb2.LeaseGrantRequest, cmd.payload))
        if kind == Kind.LEASE_REVOKE:
            rv = _parse(rpc_pb2.LeaseRevokeRequest, cmd.payload)
            if rv.ID not in self._leases.leases:
                raise errors.LEASE_NOT_FOUND
            if self._x.intents and self._lease_blocked(rv.ID):
                raise errors.Locked(min(self._x.intents))
            self._revoke([rv.ID], cmd.min_revision)
            rresp = rpc_pb2.LeaseRevokeResponse()
            rresp.header.revision = self._store.rev
            return rresp
        if kind == Kind.LEASE_CHECKPOINT:
            return self._lease_checkpoint(cmd.payload)
        if kind == Kind.LEASE_EXPIRE:
            due = [i for i in dict.fromkeys(cmd.ids) if self._leases.is_expired(i)]
            if self._x.intents:
                due = [i for i in due if not self._lease_blocked(i)]  # expired next time
            self._revoke(due, cmd.min_revision)
            return ExpireResult(due, self._store.rev)
        # Kind.LEASE_KEEPALIVE
        ka = _parse(rpc_pb2.LeaseKeepAliveRequest, cmd.payload)
        kresp = rpc_pb2.LeaseKeepAliveResponse(ID=ka.ID, TTL=self._leases.renew(ka.ID))
        kresp.header.revision = self._store.rev
        return kresp

    def _apply_compact(self, command: bytes) -> Any:
        """Apply a format-2 command (see the module docstring)."""
        try:
            body = msgpack.unpackb(command, raw=False, use_list=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise errors.bad_request(f"malformed KV command: {exc}") from exc
        if type(body) is not tuple or len(body) < 5 or body[0] != COMPACT_FORMAT:
            raise errors.bad_request("malformed KV command: not a compact command")
        kind, min_revision, size = body[1], body[2], body[3]
        if not (type(kind) is int and type(min_revision) is int and type(size) is int):
            raise errors.bad_request("malformed KV command: numeric field is not an integer")
        if kind == Kind.PUT and len(body) == 8:
            key, value, lease, flags = body[4:]
            if not (type(key) is bytes and type(value) is bytes and type(lease) is int
                    and type(flags) is int):
                raise errors.bad_request("malformed KV command: bad Put fields")
            return self._apply_put(min_revision, size, key, value, lease, flags)
        if kind == Kind.TXN and len(body) == 5:
            items = body[4]
            if type(items) is not tuple or not items or len(items) % 3:
                raise errors.bad_request("malformed KV command: bad put list")
            keys, values, leases = items[0::3], items[1::3], items[2::3]
            if {*map(type, keys), *map(type, values)} != {bytes} or {*map(type, leases)} != {int}:
                raise errors.bad_request("malformed KV command: bad put list")
            return self._apply_puts(min_revision, size, keys, values, leases)
        raise errors.bad_request(f"malformed KV command: unknown compact kind {kind!r}")

    def _apply_put(
        self, min_revision: int, size: int, key: bytes, value: bytes, lease: int, flags: int
    ) -> rpc_pb2.PutResponse:
        """A Put: the checks of ``validate_put`` and ``check_put_state``, then the write."""
        prev_kv = bool(flags & _PREV_KV)
        ignore_value = bool(flags & _IGNORE_VALUE)
        ignore_lease = bool(flags & _IGNORE_LEASE)
        validate.put_values(key, value, lease, ignore_value, ignore_lease, self.limits)
        validate.check_size(size, self.limits)
        ex = self._exec
        if self._x.intents:
            self._check_free([KeyRange(key, None, True)])
            if lease:
                self._check_lease_free([lease])
        ex.check_put_values(key, lease, ignore_value or ignore_lease, in_txn=False)
        wt = self._store.begin(min_revision)
        try:
            resp = ex.put_values(wt, key, value, lease, prev_kv, ignore_value, ignore_lease)
        except BaseException:
            wt.rollback()
            raise
        self._commit(wt)
        return resp

    def _apply_puts(
        self,
        min_revision: int,
        size: int,
        keys: tuple[bytes, ...],
        values: tuple[bytes, ...],
        leases: tuple[int, ...],
    ) -> rpc_pb2.TxnResponse:
        """A Txn of plain puts: ``validate_txn``'s checks, the leases, then the writes."""
        validate.validate_puts(keys, values, size, self.limits)
        if self._x.intents:
            self._check_free([KeyRange(k, None, True) for k in keys])
            self._check_lease_free([i for i in leases if i])
        if any(leases):
            live = self._leases.leases
            for lease in leases:
                if lease and lease not in live:
                    raise errors.LEASE_NOT_FOUND
        wt = self._store.begin(min_revision)
        put = wt.put
        try:
            for key, value, lease in zip(keys, values, leases, strict=True):
                put(key, value, lease)
        except BaseException:
            wt.rollback()
            raise
        self._commit(wt)
        return puts_response(wt.rev, len(keys))

    def _write(self, min_revision: int, body: Any) -> Any:
        """Run ``body(wt)`` in one write transaction: commit, or roll back on error. A
        write that wrote nothing, proposed with a marked stamp, raises the shard to the
        stamp and answers there (``revorder.noop_floor``)."""
        wt = self._store.begin(min_revision)
        try:
            resp = body(wt)
        except BaseException:
            wt.rollback()
            raise
        wrote = bool(wt.changes)
        self._commit(wt)
        if not wrote and min_revision < 0:
            floor = noop_floor(min_revision, self.stripe[0])
            if floor:
                self._store.raise_floor(floor)
                resp.header.revision = self._store.rev
        return resp

    def _commit(self, wt: WriteTxn) -> None:
        changes = wt.commit()
        if not changes:
            return
        leases = self._leases
        if not leases.leases:
            # No lease exists, so no change attaches or detaches a key (the common case).
            if self._x.intents:
                self._hold(wt.rev, changes)
            else:
                self.watch_hub.publish(wt.rev, changes)
            return
        for (key, rec, _before), prev in zip(changes, wt.replaced, strict=True):
            if prev is not None and prev[LEASE]:
                leases.detach(prev[LEASE], key)
            if rec[VALUE] is not None and rec[LEASE]:
                leases.attach(rec[LEASE], key)
        if self._x.intents:
            self._hold(wt.rev, changes)
        else:
            self.watch_hub.publish(wt.rev, changes)

    # --- multi-shard Txns (docs/txn.md) ------------------------------------------------------
    def _check_free(self, ranges: list[KeyRange]) -> None:
        """Refuse (``errors.Locked``) a write overlapping an open intent."""
        found = self._x.blocking_any(ranges)
        if found is not None:
            raise errors.Locked(found.txn_id)

    def _check_lease_free(self, lease_ids: Any) -> None:
        """Refuse (``errors.Locked``) a Put attaching a key to a lease whose revoke or
        expiry across shards is in progress: it runs again once that is decided, and
        then either the lease is still there or it fails with lease-not-found."""
        if self.broken_lease_puts or not lease_ids:
            return
        found = self._x.revoking(lease_ids)
        if found is not None:
            raise errors.Locked(found.txn_id)

    def _lease_blocked(self, lease_id: int) -> bool:
        """Whether revoking ``lease_id`` would touch an open intent (a put of a prepared
        Txn uses it, or one of its keys is held)."""
        if self._x.using_lease([lease_id]) is not None:
            return True
        keys = self._leases.leases[lease_id].keys
        return self._x.blocking_any(KeyRange(k, None, True) for k in keys) is not None

    def _hold(self, rev: int, changes: list[Change]) -> None:
        """Publish now, or hold back while an open intent reserved a lower revision."""
        low = self._x.lowest_rev()
        if low and rev > low:
            self._held.append((rev, changes))
        else:
            self.watch_hub.publish(rev, changes)

    def _release(self) -> None:
        """After an intent left: publish the held revisions now below every open intent,
        in revision order, and tell the hub its new closed revision."""
        low = self._x.lowest_rev()
        self.watch_hub.held_from = low
        if not self._held:
            return
        self._held.sort(key=lambda h: h[0])
        keep = []
        for rev, changes in self._held:
            if low and rev > low:
                keep.append((rev, changes))
            else:
                self.watch_hub.publish(rev, changes)
        self._held = keep

    def _apply_x(self, command: bytes, answer: bool = True) -> object:
        """Apply a format-3 command (``xcommands.py``); ``answer``: see :meth:`apply`."""
        body = xcommands.decode(command)
        kind, txn_id = body[0], body[1]
        if type(txn_id) is not int:
            raise errors.bad_request("malformed KV command: txn id is not an integer")
        if kind == xcommands.XKind.PREPARE:
            return self._x_prepare(txn_id, *body[2:], answer=answer)
        if kind == xcommands.XKind.COMMIT:
            path, shard, shards, now_ms = body[2:]
            return self._x_commit(txn_id, path, shard, shards, now_ms, answer=answer)
        if kind == xcommands.XKind.DECIDE:
            if type(body[6]) is not int or body[6] <= 0:
                raise errors.bad_request("malformed KV command: bad decided revision")
            path, shard, shards, now_ms, at = body[2:]
            return self._x_commit(txn_id, path, shard, shards, now_ms, at, answer=answer)
        if kind == xcommands.XKind.RESERVE:
            return self._x_reserve(txn_id, *body[2:])
        if kind == xcommands.XKind.LEASE:
            return self._x_prepare_lease(txn_id, *body[2:])
        if kind == xcommands.XKind.PREPARE_DECIDE:
            return self._x_prepare_decide(txn_id, *body[2:], answer=answer)
        return self._x_abort(txn_id, *body[2:])

    def _x_prepare(
        self, txn_id: int, rev: int, record: int, shard: int, shards: int, deadline_ms: int,
        now_ms: int, request: bytes, *, answer: bool = True,
    ) -> xcommands.Prepared:
        store, x = self._store, self._x
        plan = plan_of(request)
        if shard == record:
            x.expire_records(now_ms)
            if txn_id in x.records:
                return xcommands.Prepared(False, "decided", store.rev)
        if txn_id in x.intents:  # a second prepare of one Txn: refused, nothing changes
            return xcommands.Prepared(False, "again", store.rev)
        if rev < 0:  # an ordered stamp: a revision only the record shard hands out
            rev = store.striped(-rev, record)
        else:
            rev = max(rev, store.rev + 1)  # the candidate, or the lowest this shard can give
        part = plan.part(shard, shards)
        ranges, leases = part.ranges, part.leases
        if x.intents and (x.blocking_any(ranges) is not None
                          or x.revoking(leases) is not None):
            return xcommands.Prepared(False, "conflict", store.rev)

        def owns(key: bytes) -> bool:
            return sharding.shard_of(key, shards) == shard

        prepared = xcommands.Prepared(True, "", rev)
        if answer:  # what the coordinator decides on; nothing of the state
            prepared.compares = xtxn.partial_compares(store, plan, store.rev)
            prepared.checks = xtxn.put_checks(self._exec, plan, owns)
            prepared.compact_rev = store.compact_rev
        x.intents[txn_id] = Intent(txn_id, rev, record, deadline_ms, ranges, leases, request)
        if shard == record:
            x.records[txn_id] = Record(txn_id, PENDING, rev, deadline_ms)
        store.raise_floor(rev)
        self.watch_hub.held_from = x.lowest_rev()
        return prepared

    def _x_prepare_decide(
        self, txn_id: int, stamp: int, record: int, shards: int, deadline_ms: int,
        now_ms: int, request: bytes, want: int, compares: Any, checks: Any,
        compact_rev: int, *, answer: bool = True,
    ) -> xcommands.Prepared | xcommands.Committed:
        """The record shard's prepare and decision in one entry, once the other
        participants prepared (``xcommands.PREPARE_DECIDE``): refused (a ``Prepared``)
        on a record already there, a conflict, or etcd's error along the branch taken;
        else the record COMMITTED at the lowest revision of this shard's stripe at or
        above ``want`` and above its own, and this shard's share written there."""
        if not (type(stamp) is int and stamp < 0 and type(want) is int and want > 0
                and type(compact_rev) is int and type(request) is bytes):
            raise errors.bad_request("malformed KV command: bad prepare-decide fields")
        store, x = self._store, self._x
        x.expire_records(now_ms)
        rec = x.records.get(txn_id)
        if rec is not None:  # a resolver's tombstone came first (or this entry again)
            return xcommands.Prepared(False, "decided", store.rev)
        plan = plan_of(request)
        part = plan.part(record, shards)

        def owns(key: bytes) -> bool:
            return sharding.shard_of(key, shards) == record

        if x.intents and (x.blocking_any(part.ranges) is not None
                          or x.revoking(part.leases) is not None):
            return xcommands.Prepared(False, "conflict", store.rev)
        own = xtxn.partial_compares(store, plan, store.rev)
        others = [[(bool(f), bool(k)) for f, k in row] for row in compares]
        path = xtxn.path_of(plan, xtxn.combine(plan, [own, others] if others else [own]))
        found = {int(o): str(m) for o, m in checks}
        found.update(xtxn.put_checks(self._exec, plan, owns))
        rev = want if self.broken_decide_at_want else store.striped(max(want, -stamp), record)
        err = xtxn.first_error(plan, path, found, rev, max(compact_rev, store.compact_rev))
        if err is not None:
            return xcommands.Prepared(False, "invalid", store.rev, error=err)
        x.records[txn_id] = Record(txn_id, COMMITTED, rev, deadline_ms, tuple(path), rev)
        wt, resp, error = self._share_at(rev, plan, path, owns, answer)
        self._commit(wt)
        store.raise_floor(rev)
        self.recent_commits.append((rev, plan.participants(shards)))
        return xcommands.Committed(resp, xcommands.Decision(COMMITTED, tuple(path), rev), error)

    def _x_prepare_lease(
        self, txn_id: int, lease_id: int, rev: int, shard: int, deadline_ms: int,
        now_ms: int, term: int, expire: bool,
    ) -> xcommands.Prepared:
        """The prepare of a lease revoke (``expire``: an expiry) across shards: an intent
        holding the lease's keys here and the lease id, the revision reserved as a Txn's;
        on the record shard (0, the leases' home) also the PENDING record, refused when
        the lease is unknown or, for an expiry, no longer overdue."""
        if type(lease_id) is not int or type(expire) is not bool:
            raise errors.bad_request("malformed KV command: bad lease revoke fields")
        store, x, leases = self._store, self._x, self._leases
        record = 0
        if shard == record:
            x.expire_records(now_ms)
            if txn_id in x.records:
                return xcommands.Prepared(False, "decided", store.rev)
            if expire:
                leases.observe(now_ms, term)
            if lease_id not in leases.leases:
                return xcommands.Prepared(False, "not-found", store.rev)
            if expire and not leases.is_expired(lease_id):
                return xcommands.Prepared(False, "alive", store.rev)
        if txn_id in x.intents:
            return xcommands.Prepared(False, "again", store.rev)
        if rev < 0:  # an ordered stamp: a revision only the record shard hands out
            rev = store.striped(-rev, record)
        else:
            rev = max(rev, store.rev + 1)
        ranges = tuple(KeyRange(k, None, True) for k in self.lease_keys(lease_id))
        if x.blocking_any(ranges) is not None or x.using_lease([lease_id]) is not None:
            return xcommands.Prepared(False, "conflict", store.rev)
        x.intents[txn_id] = Intent(txn_id, rev, record, deadline_ms, ranges,
                                   frozenset([lease_id]), b"", EXPIRE if expire else REVOKE)
        if shard == record:
            x.records[txn_id] = Record(txn_id, PENDING, rev, deadline_ms)
        store.raise_floor(rev)
        self.watch_hub.held_from = x.lowest_rev()
        return xcommands.Prepared(True, "", rev)

    def _x_revoke_share(self, intent: Intent, shards: int) -> rpc_pb2.TxnResponse:
        """A decided lease revoke on this shard: delete the keys its intent holds at the
        reserved revision, forget the lease. Every shard of ``shards`` takes part in a
        revoke (``xlease.py``)."""
        (lease_id,) = intent.leases
        wt = self._store.begin_at(intent.rev)
        try:
            for kr in intent.ranges:
                wt.delete(kr)
            wt.retag([0] * len(wt.changes))  # one operation: the merged watch orders by key
        except BaseException:
            wt.rollback()
            raise
        del self._x.intents[intent.txn_id]
        self._commit_at(wt)
        self.recent_commits.append((intent.rev, tuple(range(shards))))
        self._settled(intent.txn_id, intent.rev)
        if lease_id in self._leases.leases:
            self._leases.remove(lease_id)
        self._release()
        resp = rpc_pb2.TxnResponse(succeeded=True)
        resp.header.revision = intent.rev
        return resp

    def _x_reserve(self, txn_id: int, rev: int) -> xcommands.Prepared:
        """Move an intent's reserved revision up to ``rev``, if nothing here has used it
        (the shard's revision is still below it): the participants then agree on one."""
        intent = self._x.intents.get(txn_id)
        store = self._store
        if intent is None:
            return xcommands.Prepared(False, "gone", store.rev)
        if rev <= intent.rev:
            return xcommands.Prepared(True, "", intent.rev)
        if store.rev >= rev:
            return xcommands.Prepared(False, "behind", store.rev + 1)
        intent.rev = rev
        store.raise_floor(rev)
        self._release()
        return xcommands.Prepared(True, "", rev)

    def _x_commit(
        self, txn_id: int, path: tuple[bool, ...], shard: int, shards: int, now_ms: int,
        at: int = 0, *, answer: bool = True,
    ) -> xcommands.Committed:
        """A COMMIT (``at`` 0: at the reserved revision) or a DECIDE (``at``: the revision
        the record shard decided, on a participant other than it) of ``txn_id``."""
        x = self._x
        decision = None
        intent = x.intents.get(txn_id)
        rev = intent.rev if intent is not None else 0
        if at and intent is not None and intent.record != shard:
            if at < intent.rev or at % shards != intent.record % shards:
                raise errors.bad_request(
                    f"malformed KV command: decided revision {at} is below this shard's "
                    f"reserved {intent.rev} or outside the record shard's stripe")
            rev = at
        if (intent is not None and intent.record == shard) or txn_id in x.records:
            rec = x.records.get(txn_id)
            if rec is None or rec.state == ABORTED:
                return xcommands.Committed(None, xcommands.Decision(ABORTED))
            if (rec.state == PENDING and intent is not None and intent.revoke == EXPIRE
                    and not any(self._leases.is_expired(i) for i in intent.leases)):
                # A keepalive came between the expiry's prepare and its decision: it wins.
                rec.state = ABORTED
                del x.intents[txn_id]
                self._release()
                return xcommands.Committed(None, xcommands.Decision(ABORTED))
            if rec.state == PENDING:
                if at:  # the record shard decides in PREPARE_DECIDE or COMMIT, never here
                    raise errors.bad_request(
                        "malformed KV command: a DECIDE on a pending record")
                rec.state, rec.path = COMMITTED, tuple(path)
            decision = xcommands.Decision(rec.state, rec.path, rec.commit_rev)
            path = rec.path
            if rec.commit_rev:
                rev = rec.commit_rev
        if intent is None:
            return xcommands.Committed(None, decision)
        if intent.revoke:
            return xcommands.Committed(self._x_revoke_share(intent, shards), decision)
        plan = plan_of(intent.request)

        def owns(key: bytes) -> bool:
            return sharding.shard_of(key, shards) == shard

        wt, resp, error = self._share_at(rev, plan, path, owns, answer)
        del x.intents[txn_id]
        self._commit_at(wt)
        self._store.raise_floor(rev)  # a decided revision above this shard's: move up to it
        self.recent_commits.append((rev, plan.participants(shards)))
        self._settled(txn_id, rev)
        self._release()
        return xcommands.Committed(resp, decision, error)

    def _share_at(self, rev: int, plan: TxnPlan, path: Any, owns: Callable[[bytes], bool],
                  answer: bool = True) -> tuple[WriteTxn, Any, Any]:
        """Run this shard's share of a decided multi-shard Txn as a write at ``rev`` (not
        committed yet; rolled back if it raises): the write, the responses (None without
        ``answer``), the error."""
        wt = self._store.begin_at(rev)
        try:
            resp, error = xtxn.run_share(self._exec, wt, plan, path, owns, answer)
        except BaseException:
            wt.rollback()
            raise
        return wt, resp, error

    def _commit_at(self, wt: WriteTxn) -> None:
        """Commit a retro write: its events join the held ones at their revision."""
        changes = wt.commit()
        if not changes:
            return
        leases = self._leases
        for (key, rec, _before), prev in zip(changes, wt.replaced, strict=True):
            if prev is not None and prev[LEASE]:
                leases.detach(prev[LEASE], key)
            if rec[VALUE] is not None and rec[LEASE]:
                leases.attach(rec[LEASE], key)
        self._held.append((wt.rev, changes))

    def _x_abort(self, txn_id: int, is_record: bool, now_ms: int) -> xcommands.Decision:
        x = self._x
        intent = x.intents.get(txn_id)
        if is_record:
            rec = x.records.get(txn_id)
            if rec is None:
                rec = x.records[txn_id] = Record(
                    txn_id, ABORTED, 0, intent.deadline_ms if intent else now_ms)
            elif rec.state == PENDING:
                rec.state = ABORTED
            if rec.state == COMMITTED:
                return xcommands.Decision(COMMITTED, rec.path, rec.commit_rev)
        if intent is not None:
            del x.intents[txn_id]
            self._settled(txn_id, 0)
            self._release()
        return xcommands.Decision(ABORTED)

    def _settled(self, txn_id: int, rev: int) -> None:
        settled = self.settled_at
        settled[txn_id] = rev
        if len(settled) > SETTLED_KEPT:
            del settled[next(iter(settled))]

    def _revoke(self, ids: list[int], min_revision: int) -> None:
        """Delete every key of the given leases in one revision, then forget the leases."""
        keys = sorted({k for i in ids for k in self._leases.leases[i].keys})
        if keys:
            wt = self._store.begin(min_revision)
            for key in keys:
                wt.delete(KeyRange(key, None, True))
            self._commit(wt)
        for i in ids:
            self._leases.remove(i)

    def _lease_grant(self, req: rpc_pb2.LeaseGrantRequest) -> rpc_pb2.LeaseGrantResponse:
        lim = self.limits
        lease = self._leases.grant(
            req.ID, req.TTL, min_ttl=lim.min_lease_ttl_s, max_ttl=lim.max_lease_ttl_s,
            max_leases=lim.max_leases,
        )
        resp = rpc_pb2.LeaseGrantResponse(ID=lease.id, TTL=lease.ttl)
        resp.header.revision = self._store.rev
        return resp

    def _lease_checkpoint(self, payload: bytes) -> rpc_pb2.LeaseCheckpointResponse:
        req = _parse(rpc_pb2.LeaseCheckpointRequest, payload)
        for cp in req.checkpoints:
            self._leases.set_remaining(cp.ID, cp.remaining_TTL)
        resp = rpc_pb2.LeaseCheckpointResponse()
        resp.header.revision = self._store.rev
        return resp

    # --- reads -----------------------------------------------------------------------------
    def range(self, req: rpc_pb2.RangeRequest, *, validated: bool = False) -> rpc_pb2.RangeResponse:
        """A Range at the current (or the requested past) revision (``validated``: the
        caller already ran :meth:`validate_range` on ``req``)."""
        if not validated:
            validate.validate_range(req, self.limits)
        return self._exec.range(req, self._store.rev)

    def read_share(
        self, plan: TxnPlan, rev: int
    ) -> tuple[list[list[tuple[bool, bool]]], Callable[[list[bool]], rpc_pb2.TxnResponse]]:
        """A read-only multi-shard Txn's part here at ``rev``: this shard's partial
        compares (``xtxn.partial_compares``) and a function of the branch path that reads
        this shard's part of the taken ranges (``xtxn.read_share``)."""
        return (xtxn.partial_compares(self._store, plan, rev),
                lambda path: self.read_branch(plan.req, path, rev))

    def read_branch(self, req: rpc_pb2.TxnRequest, path: Sequence[bool],
                    rev: int) -> rpc_pb2.TxnResponse:
        """This shard's part at ``rev`` of the reads along ``path`` of a read-only
        multi-shard Txn (its compares already combined elsewhere)."""
        return xtxn.read_share(self._exec, req, path, rev)

    def is_read_only_txn(self, req: rpc_pb2.TxnRequest) -> bool:
        """Whether no branch of ``req`` (nested ones included) can write."""
        return bool(txn.is_read_only(req))

    def read_txn(self, req: rpc_pb2.TxnRequest, top: int = 0) -> rpc_pb2.TxnResponse:
        """Evaluate a read-only Txn locally, as a read (no Raft entry, no revision bump);
        ``top``: the store's revision the read answers at, if above this shard's (its
        ranges may name a revision up to it: ``Executor.txn``)."""
        validate.validate_txn(req, self.limits)
        if not txn.is_read_only(req):
            raise ValueError("read_txn called with a Txn that writes")
        result: rpc_pb2.TxnResponse = self._exec.txn(None, req, top)
        return result

    def lease_time_to_live(
        self, req: rpc_pb2.LeaseTimeToLiveRequest, now_ms: int | None = None
    ) -> rpc_pb2.LeaseTimeToLiveResponse:
        """Remaining TTL (``now_ms``: the leader's clock; default the replicated clock);
        an unknown lease gets TTL -1, not an error."""
        table = self._leases
        resp = rpc_pb2.LeaseTimeToLiveResponse(ID=req.ID)
        resp.header.revision = self._store.rev
        lease = table.leases.get(req.ID)
        if lease is None:
            resp.TTL = -1
            return resp
        resp.TTL = table.remaining_s(lease, table.clock_ms if now_ms is None else now_ms)
        resp.grantedTTL = lease.ttl
        if req.keys:
            resp.keys.extend(sorted(lease.keys))
        return resp

    def lease_keys(self, lease_id: int) -> list[bytes]:
        """The keys of this shard attached to ``lease_id`` (none for an unknown lease)."""
        lease = self._leases.leases.get(lease_id)
        return sorted(lease.keys) if lease is not None else []

    def lease_leases(self) -> rpc_pb2.LeaseLeasesResponse:
        """Every live lease, soonest expiry first (etcd's order), ties by id."""
        table = self._leases
        order = sorted(table.leases.values(), key=lambda ls: (ls.base_deadline_ms, ls.id))
        resp = rpc_pb2.LeaseLeasesResponse()
        resp.leases.extend([rpc_pb2.LeaseStatus(ID=ls.id) for ls in order])
        resp.header.revision = self._store.rev
        return resp

    def expired_leases(self, now_ms: int, term: int | None = None, limit: int = 1000) -> list[int]:
        """Leader only: leases overdue at ``now_ms`` (its clock), to propose an expire for.

        With ``term`` given, returns nothing until a command of that term has been applied
        (the new leader's first checkpoint rebases the deadlines into its clock).
        """
        if term is not None and term != self._leases.clock_term:
            return []
        return self._leases.expired(now_ms, limit)

    def hash_kv(self, revision: int = 0) -> tuple[int, int]:
        """(CRC32C of the history up to ``revision`` (0 = current), compact revision)."""
        store = self._store
        if revision > 0 and revision <= store.compact_rev:
            raise errors.COMPACTED
        if revision > store.rev:
            raise errors.FUTURE_REV
        return store.hash(revision if revision > 0 else store.rev), self.compact_revision

    # --- snapshots -------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """A deterministic msgpack image of the whole state (watchers are not state)."""
        return self.prepare_snapshot()()

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """Capture the state now (on the apply loop: ~0.1 s per million keys) and return
        a function that serializes that capture; run it in a worker thread
        (``await asyncio.to_thread(sm.prepare_snapshot())``) so the loop keeps applying."""
        return self._capture(keep_revision=True)

    def prepare_hash(self) -> Callable[[], bytes]:
        """:meth:`prepare_snapshot` for etcd's Hash: the same image, but without the
        lease table's replicated clock and the leases' deadlines in it, which the
        leader's lease checkpoints (every few seconds) and a new leader's clock move
        while no key and no lease changes (etcd's Hash covers a lease's id and TTL, not
        its remaining time), and on a shard of several (striped) without the shard's
        revision counter, which a revision floor moves (a fence after answered reads, a
        watch closing idle shards). The records' own revisions, the compaction revision,
        the leases' ids, TTLs and keys and everything else are kept. So a quiet store's
        Hash stays the same, as one etcd's does."""
        return self._capture(keep_revision=self.stripe[0] == 1, keep_clock=False)

    def _capture(self, keep_revision: bool, keep_clock: bool = True) -> Callable[[], bytes]:
        store_image = self._store.freeze()
        lease_image = self._leases.dump(with_time=keep_clock)
        x_image = self._x.dump() if self._x.intents or self._x.records else None

        def serialize() -> bytes:
            store = store_image()
            if not keep_revision:
                store = [0, *store[1:]]
            image = [SNAPSHOT_FORMAT, store, lease_image]
            if x_image is not None:
                image.append(x_image)  # open intents and records (docs/txn.md)
            packed: bytes = msgpack.packb(image, use_bin_type=True)
            return packed

        return serialize

    @staticmethod
    def image_at(data: bytes, revision: int) -> bytes:
        """A snapshot image cut back to ``revision``: versions written after it dropped
        (keys left with none disappear), the store's revision set to it, each lease's
        keys those whose version at ``revision`` holds the lease, and the records of
        multi-shard Txns committed after it dropped. Leases granted after ``revision``
        stay (a grant has no revision), without keys."""
        try:
            fmt, (rev, compact, entries), lease_image, *x_image = msgpack.unpackb(
                data, raw=False)
            if fmt != SNAPSHOT_FORMAT:
                raise ValueError(f"unknown KV snapshot format {fmt!r}")
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
            raise errors.bad_request(f"malformed KV snapshot: {exc}") from exc
        if rev <= revision:
            return data
        kept = []
        held: dict[int, list[bytes]] = {}
        for key, recs in entries:
            recs = [r for r in recs if r[MOD] <= revision]
            if recs:
                kept.append([key, recs])
                last = recs[-1]
                if last[VALUE] is not None and last[LEASE]:
                    held.setdefault(last[LEASE], []).append(key)
        for row in lease_image[4]:
            row[3] = held.get(row[0], [])
        if x_image:
            # A record of a Txn committed above the cut goes too: its writes were cut
            # here, so the restored shards must not finish it from the record (an intent
            # of it left on another shard then finds no record and is aborted).
            intent_rows, record_rows = x_image[0]
            x_image = [[intent_rows,
                        [r for r in record_rows if not _committed_after(r, revision)]]]
        image = [fmt, [revision, compact, kept], lease_image, *x_image]
        packed: bytes = msgpack.packb(image, use_bin_type=True)
        return packed

    @staticmethod
    def image_for_new_cluster(data: bytes, now_ms: int) -> bytes:
        """A snapshot image for a cluster restored from it at wall-clock ``now_ms``: the
        lease clock is moved to ``now_ms`` with every deadline (each lease keeps the time
        it had left when the image was taken) and forgets the old cluster's Raft term,
        whose numbers mean nothing in the new one (its terms start again at 1, and a
        clock reading of an older term is ignored); the new leader's first lease
        command then rebases the deadlines into its own clock."""
        try:
            fmt, store_image, lease_image, *x_image = msgpack.unpackb(data, raw=False)
            if fmt != SNAPSHOT_FORMAT:
                raise ValueError(f"unknown KV snapshot format {fmt!r}")
            shift = now_ms - lease_image[0]
            lease_image[0], lease_image[1] = now_ms, 0
            for row in lease_image[4]:
                row[2] += shift
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
            raise errors.bad_request(f"malformed KV snapshot: {exc}") from exc
        packed: bytes = msgpack.packb([fmt, store_image, lease_image, *x_image],
                                      use_bin_type=True)
        return packed

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's; live watchers catch up from it."""
        try:
            fmt, store_image, lease_image, *x_image = msgpack.unpackb(
                data, raw=False, use_list=False)
            if fmt != SNAPSHOT_FORMAT:
                raise ValueError(f"unknown KV snapshot format {fmt!r}")
            store = MVCCStore.load(store_image)
            leases = LeaseTable.load(lease_image)
            x = IntentTable.load(x_image[0]) if x_image else IntentTable()
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
            raise errors.bad_request(f"malformed KV snapshot: {exc}") from exc
        store.stripe = self.stripe
        self._store = store
        self._leases = leases
        self._exec = Executor(store, leases, self.limits)
        self._x = x
        self._held = []
        self.watch_hub.rebind(store, x.lowest_rev())


def _parse(cls: Any, payload: bytes) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError (a plain Exception subclass)
        raise errors.bad_request(f"malformed {cls.__name__}: {exc}") from exc
    return msg


def _put_command(
    min_revision: int, size: int, key: bytes, value: bytes, lease: int, prev_kv: bool,
    ignore_value: bool, ignore_lease: bool,
) -> bytes:
    flags = (
        (_PREV_KV if prev_kv else 0)
        | (_IGNORE_VALUE if ignore_value else 0)
        | (_IGNORE_LEASE if ignore_lease else 0)
    )
    body = [COMPACT_FORMAT, Kind.PUT.value, min_revision, size, key, value, lease, flags]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def puts_response(revision: int, n: int) -> rpc_pb2.TxnResponse:
    """The TxnResponse of a Txn of ``n`` plain puts applied at ``revision``: succeeded,
    header revision, and ``n`` PutResponses whose headers hold only the revision.

    Parsed from bytes made here (the ``n`` ops are identical), which costs a fraction of
    building ``n`` nested messages field by field."""
    if revision < 0 or n < 0:
        raise ValueError("revision and n must be >= 0")
    rev = b"\x18" + varint(revision)  # ResponseHeader.revision = 3
    header = b"\x0a" + bytes((len(rev),)) + rev  # .header = 1
    op = b"\x12" + bytes((len(header),)) + header  # ResponseOp.response_put = 2
    item = b"\x1a" + bytes((len(op),)) + op  # TxnResponse.responses = 3
    resp = rpc_pb2.TxnResponse()
    resp.ParseFromString(header + b"\x10\x01" + item * n)  # succeeded = 2
    return resp


def _committed_after(row: Any, revision: int) -> bool:
    """Whether a record's image is of a Txn committed at a revision above ``revision``."""
    rec = Record.load(row)
    return rec.state == COMMITTED and (rec.commit_rev or rec.rev) > revision
