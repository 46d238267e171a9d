"""The fenced lock recipe: queue, grant, release and token-guarded writes over the KV API.

One algorithm, run by the v3lock servicer and by the client library alike (both drive it
through a :class:`~accord.locks.store.LockStore`):

1. **Enqueue.** ``Txn(create(N/<lease>) == 0 ? put(N/<lease>, lease) : get(N/<lease>))``.
   The key's create revision ``R`` is the contender's place in the queue and, once
   granted, its fencing token. A lease that is unknown or expired makes the put fail with
   etcd's "requested lease not found": nothing is written. The same Txn reads the two
   newest keys under ``N/`` and the grant record, so an uncontended acquire needs no
   separate read (3 commits in all: enqueue, grant, release).
2. **Wait, without a herd.** One read-only Txn (a single snapshot) reads the own key, the
   *predecessor* (the highest create revision below ``R`` under ``N/``) and the grant
   record. While a predecessor exists, watch only it (and the own key) and re-read; any
   other change wakes nobody. Re-reads happen at least every ``recheck_s`` so a lost
   watch (member killed, paused) only delays, never wedges, a waiter.
3. **Lock-delay.** If the own key is the head and the grant record names another token
   with a lock-delay ``D > 0``, that holder lost its key without releasing (its lease
   expired or was revoked: a clean release deletes the record in the same Txn). The head
   replaces the record by a *delay record* attached to a fresh lease of ``ceil(D)``
   seconds (at least the store's minimum lease TTL) and waits until the cluster deletes
   it. The delay runs on the cluster's lease clock and starts no earlier than the loss,
   so the lock stays unavailable to accord contenders for at least ``D`` after it.
4. **Grant, committed through Raft.** ``Txn(create(N/<lease>) == R and every key under
   N/ created after R-1 and mod(grant record) == <as read>) ? put(grant record =
   {"token": R, "lock_delay_ms": D})``. The first compare is the lease re-check at grant
   time (etcd #11456, where a waiter whose session expired while it waited was still told
   it held the lock): the store deletes a lease's keys in the same apply that expires or
   revokes the lease, so the own key exists at the grant's revision exactly when the
   lease was alive at that revision. The second makes sure nobody is ahead; the third
   that no concurrent grant or lock-delay slipped in. Only a committed grant is reported.
5. **Release.** ``Txn(create(N/<lease>) == R) ? [delete(N/<lease>), Txn(mod(grant
   record) == G ? delete(grant record))]``, else :class:`NotHeld` and nothing changes.
6. **Guarded writes (fencing in the store).** ``Txn(create(N/<lease>) == R and every key
   under N/ created after R-1) ? <the write> : <read the head of N/>``: the write is
   applied atomically with the proof that token ``R`` still holds the lock; otherwise
   :class:`FencedWriteRejected` names the current holder's token. An etcd client gets
   the same guarantee with the documented compare ``create_revision(lock key) == R``.

Tokens are create revisions: the store's revision never repeats or goes back (restarts,
leader changes, snapshot restore and compaction keep it), a holder's key is live while
it holds, and grants follow create-revision order, so tokens strictly increase per lock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from accord.locks import keys
from accord.locks import ops as o
from accord.locks.errors import FencedWriteRejected, InvalidLockName, NotHeld, SessionExpired
from accord.locks.store import LockStore
from accord.proto import kv_pb2, rpc_pb2

DEFAULT_RECHECK_S = 2.0
"""Longest a waiter trusts its watch before re-reading the queue."""
MAX_LOCK_DELAY_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Holding:
    """A granted lock: its key, lease and fencing token."""

    name: bytes
    key: bytes
    lease: int
    token: int
    """Create revision of ``key``: the fencing token."""
    grant_revision: int
    """Revision at which the grant was committed (the grant record's mod revision)."""
    lock_delay_ms: int = 0


def _check_lease(lease: int) -> None:
    if lease <= 0:
        raise InvalidLockName(f"lease id {lease} is not valid: a lock needs a granted lease (id > 0)")


def _check_delay(lock_delay_ms: int) -> None:
    if not 0 <= lock_delay_ms <= MAX_LOCK_DELAY_MS:
        raise InvalidLockName(
            f"lock_delay_ms={lock_delay_ms} is out of range: give 0..{MAX_LOCK_DELAY_MS} ms"
        )


@dataclass(frozen=True, slots=True)
class _View:
    """What a waiter reads at one revision: its own key, its predecessor, the grant record."""

    revision: int
    mine: kv_pb2.KeyValue | None
    pred: kv_pb2.KeyValue | None
    grant: kv_pb2.KeyValue | None


def _first(resp: rpc_pb2.ResponseOp) -> kv_pb2.KeyValue | None:
    kvs = resp.response_range.kvs
    return kvs[0] if kvs else None


async def enqueue(store: LockStore, name: bytes, lease: int) -> tuple[bytes, int]:
    """Write (or find) the contender key of ``lease``; ``(key, create_revision)``."""
    key, token, _view = await _enqueue(store, name, lease)
    return key, token


async def _enqueue(store: LockStore, name: bytes, lease: int) -> tuple[bytes, int, _View | None]:
    """Enqueue; a fresh key's transaction also reads the first view (saves a round trip)."""
    key = keys.contender_key(name, lease)
    p = keys.prefix(name)
    resp = await store.txn(rpc_pb2.TxnRequest(
        compare=[o.create_eq(key, 0)],
        success=[
            o.put(key, b"", lease),
            o.range_op(o.first_created(p, keys.prefix_end(p), last=True, limit=2)),
            o.get(keys.grant_key(name)),
        ],
        failure=[o.get(key)],
    ))
    if not resp.succeeded:
        return key, int(resp.responses[0].response_range.kvs[0].create_revision), None
    token = int(resp.header.revision)
    newest = resp.responses[1].response_range.kvs
    if not newest or newest[0].key != key or newest[0].create_revision != token:
        return key, token, None  # a store whose txn reads do not see its own put: re-read
    view = _View(token, newest[0], newest[1] if len(newest) > 1 else None, _first(resp.responses[2]))
    return key, token, view


async def _read_view(store: LockStore, name: bytes, key: bytes, token: int) -> _View:
    p = keys.prefix(name)
    snap = await store.txn(rpc_pb2.TxnRequest(success=[
        o.get(key),
        o.range_op(o.first_created(p, keys.prefix_end(p), max_create=token - 1, last=True)),
        o.get(keys.grant_key(name)),
    ]))
    return _View(int(snap.header.revision), _first(snap.responses[0]), _first(snap.responses[1]),
                 _first(snap.responses[2]))


def _show(name: bytes) -> str:
    return name.decode(errors="backslashreplace")


async def wait_grant(
    store: LockStore, name: bytes, key: bytes, token: int, lease: int, *,
    lock_delay_ms: int = 0, recheck_s: float = DEFAULT_RECHECK_S, first_view: _View | None = None,
) -> Holding:
    """Steps 2-4 of the recipe for the enqueued ``key`` with create revision ``token``."""
    p = keys.prefix(name)
    pe = keys.prefix_end(p)
    gk = keys.grant_key(name)
    view = first_view
    while True:
        if view is None:
            view = await _read_view(store, name, key, token)
        rev, mine, pred, grant = view.revision, view.mine, view.pred, view.grant
        view = None
        if mine is None or mine.create_revision != token:
            raise SessionExpired(
                f"the lease {lease:x} of the waiter for lock '{_show(name)}' expired or was "
                "revoked while it waited: the lock was not granted; acquire again with a live lease"
            )
        if pred is not None:
            await store.wait_change([(pred.key, b""), (key, b"")], rev, recheck_s)
            continue
        rec = keys.decode_grant(grant.value, int(grant.mod_revision)) if grant else None
        if rec is not None and rec.token == token and not rec.delaying:
            return Holding(name, key, lease, token, rec.mod_revision, rec.lock_delay_ms)
        if rec is not None and rec.delaying:
            await store.wait_change([(gk, b""), (key, b"")], rev, recheck_s)
            continue
        if rec is not None and rec.lock_delay_ms > 0:
            ttl = max(1, math.ceil(rec.lock_delay_ms / 1000))
            delay_lease = await store.lease_grant(ttl)
            await store.txn(rpc_pb2.TxnRequest(
                compare=[o.mod_eq(gk, rec.mod_revision)],
                success=[o.put(gk, keys.encode_delay(rec.token, rec.lock_delay_ms), delay_lease)],
            ))
            continue
        granted = await store.txn(rpc_pb2.TxnRequest(
            compare=[
                o.create_eq(key, token),
                o.all_created_after(p, pe, token - 1),
                o.mod_eq(gk, int(grant.mod_revision) if grant else 0),
            ],
            success=[o.put(gk, keys.encode_grant(token, lock_delay_ms))],
        ))
        if granted.succeeded:
            return Holding(name, key, lease, token, int(granted.header.revision), lock_delay_ms)


async def abandon(store: LockStore, key: bytes, token: int) -> None:
    """Leave the queue without having been granted: delete the own key if it is still ours."""
    await store.txn(rpc_pb2.TxnRequest(compare=[o.create_eq(key, token)], success=[o.delete(key)]))


async def acquire(
    store: LockStore, name: bytes | str, lease: int, *, lock_delay_ms: int = 0,
    recheck_s: float = DEFAULT_RECHECK_S,
    on_enqueued: Callable[[bytes, int], Awaitable[None] | None] | None = None,
) -> Holding:
    """Queue for lock ``name`` with ``lease`` and return once granted.

    Cancelled or failed while waiting, it removes its own key (shielded from the
    cancellation) so the queue does not keep a dead contender until its lease expires.
    """
    raw = keys.check_name(name)
    _check_lease(lease)
    _check_delay(lock_delay_ms)
    key, token, view = await _enqueue(store, raw, lease)
    if on_enqueued is not None:
        r = on_enqueued(key, token)
        if r is not None:
            await r
    try:
        return await wait_grant(
            store, raw, key, token, lease, lock_delay_ms=lock_delay_ms, recheck_s=recheck_s,
            first_view=view,
        )
    except SessionExpired:
        raise
    except BaseException:
        await asyncio.shield(_quiet_abandon(store, key, token))
        raise


async def _quiet_abandon(store: LockStore, key: bytes, token: int) -> None:
    try:
        await asyncio.wait_for(abandon(store, key, token), 5.0)
    except Exception:
        return


async def release(store: LockStore, holding: Holding) -> int:
    """Release a granted lock (step 5); the revision of the release."""
    return await release_key(store, holding.name, holding.key, holding.token, holding.grant_revision)


async def release_key(store: LockStore, name: bytes, key: bytes, token: int, grant_revision: int) -> int:
    """Delete ``key`` if it still has create revision ``token``, and its grant record."""
    gk = keys.grant_key(name)
    resp = await store.txn(rpc_pb2.TxnRequest(
        compare=[o.create_eq(key, token)],
        success=[o.delete(key), o.txn_op(rpc_pb2.TxnRequest(
            compare=[o.mod_eq(gk, grant_revision)], success=[o.delete(gk)],
        ))],
    ))
    if not resp.succeeded:
        raise NotHeld(
            f"lock '{_show(name)}' is not held with token {token} (key {key.decode(errors='backslashreplace')}): "
            "it was released already, or its lease expired or was revoked; nothing was changed"
        )
    return int(resp.header.revision)


async def unlock_key(store: LockStore, key: bytes) -> int:
    """Release by key alone (v3lock ``Unlock``): a holder's key also drops its grant record."""
    name, _lease = keys.split_contender_key(key)
    gk = keys.grant_key(name)
    snap = await store.txn(rpc_pb2.TxnRequest(success=[o.get(key), o.get(gk)]))
    kvs = snap.responses[0].response_range.kvs
    if not kvs:
        raise NotHeld(
            f"lock key {key.decode(errors='backslashreplace')} is not held: it was released "
            "already, or its lease expired or was revoked; nothing was changed"
        )
    token = int(kvs[0].create_revision)
    grant = snap.responses[1].response_range.kvs
    grant_rev = -1
    if grant:
        rec = keys.decode_grant(grant[0].value, int(grant[0].mod_revision))
        if rec is not None and rec.token == token and not rec.delaying:
            grant_rev = rec.mod_revision
    return await release_key(store, name, key, token, grant_rev)


def guard(name: bytes, key: bytes, token: int) -> list[rpc_pb2.Compare]:
    """The compares that prove ``token`` (of ``key``) still holds lock ``name``."""
    p = keys.prefix(name)
    return [o.create_eq(key, token), o.all_created_after(p, keys.prefix_end(p), token - 1)]


async def guarded_txn(
    store: LockStore, holding: Holding, ops: Sequence[rpc_pb2.RequestOp]
) -> rpc_pb2.TxnResponse:
    """Apply ``ops`` only if ``holding`` still holds its lock (step 6), atomically.

    Writes under the lock's own queue prefix are refused: a key there would join the
    queue as a contender that never leaves.
    """
    p = keys.prefix(holding.name)
    pe = keys.prefix_end(p)
    for op in ops:
        which = op.WhichOneof("request")
        if which in ("request_put", "request_delete_range"):
            k = getattr(op, which).key
            if p <= k < pe:
                raise InvalidLockName(
                    f"key {k!r} is inside the queue of lock '{_show(holding.name)}' "
                    f"({p!r}...): keep guarded data outside the lock's prefix"
                )
    resp = await store.txn(rpc_pb2.TxnRequest(
        compare=guard(holding.name, holding.key, holding.token),
        success=list(ops),
        failure=[o.range_op(o.first_created(p, keys.prefix_end(p)))],
    ))
    if not resp.succeeded:
        head = resp.responses[0].response_range.kvs
        raise FencedWriteRejected(holding.name, holding.token, int(head[0].create_revision) if head else None)
    return resp


async def holder(store: LockStore, name: bytes | str) -> rpc_pb2.RangeResponse:
    """The head of the queue of ``name`` (its first kv, if any, holds or is about to)."""
    p = keys.prefix(keys.check_name(name))
    return await store.range(o.first_created(p, keys.prefix_end(p)))
