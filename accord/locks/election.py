"""Leader election over the KV API, with etcd's ``concurrency.Election`` semantics.

Campaigners queue exactly like lock contenders (``N/<lease hex>``, create-revision
order, each watching only its predecessor); the leader is the key with the lowest create
revision and its value is the proclaimed value. The campaign re-checks, before reporting
leadership, that its own key still exists (its lease is alive), like the lock grant.
Proclaim and resign are guarded by ``create_revision(leader key) == rev``; a campaigner
that is no longer leader gets ``election: not leader`` and nothing changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from accord.locks import keys
from accord.locks import ops as o
from accord.locks.errors import NoLeader, NotLeader, SessionExpired
from accord.locks.recipe import DEFAULT_RECHECK_S, _check_lease, _quiet_abandon
from accord.locks.store import LockStore
from accord.proto import kv_pb2, rpc_pb2


@dataclass(frozen=True, slots=True)
class Leadership:
    """A won campaign: etcd's ``LeaderKey``."""

    name: bytes
    key: bytes
    rev: int
    lease: int


async def campaign(
    store: LockStore, name: bytes | str, lease: int, value: bytes, *,
    recheck_s: float = DEFAULT_RECHECK_S,
) -> Leadership:
    """Campaign for ``name`` with ``value``; returns once this campaigner leads."""
    raw = keys.check_name(name)
    _check_lease(lease)
    key = keys.contender_key(raw, lease)
    resp = await store.txn(rpc_pb2.TxnRequest(
        compare=[o.create_eq(key, 0)], success=[o.put(key, value, lease)], failure=[o.get(key)],
    ))
    if resp.succeeded:
        rev = int(resp.header.revision)
    else:
        kv = resp.responses[0].response_range.kvs[0]
        rev = int(kv.create_revision)
        if kv.value != value:
            await proclaim(store, Leadership(raw, key, rev, lease), value)
    try:
        await _wait_head(store, raw, key, rev, lease, recheck_s)
    except SessionExpired:
        raise
    except BaseException:
        await asyncio.shield(_quiet_abandon(store, key, rev))
        raise
    return Leadership(raw, key, rev, lease)


async def _wait_head(store: LockStore, name: bytes, key: bytes, rev: int, lease: int,
                     recheck_s: float) -> None:
    p = keys.prefix(name)
    pe = keys.prefix_end(p)
    while True:
        snap = await store.txn(rpc_pb2.TxnRequest(success=[
            o.get(key), o.range_op(o.first_created(p, pe, max_create=rev - 1, last=True)),
        ]))
        mine = snap.responses[0].response_range.kvs
        pred = snap.responses[1].response_range.kvs
        if not mine or mine[0].create_revision != rev:
            raise SessionExpired(
                f"the lease {lease:x} of the campaign for '{name.decode(errors='backslashreplace')}' "
                "expired or was revoked while it waited; campaign again with a live lease"
            )
        if not pred:
            return
        await store.wait_change([(pred[0].key, b""), (key, b"")], int(snap.header.revision), recheck_s)


async def proclaim(store: LockStore, leader: Leadership, value: bytes) -> int:
    """Set the leader's value, only while ``leader`` still leads; the revision."""
    resp = await store.txn(rpc_pb2.TxnRequest(
        compare=[o.create_eq(leader.key, leader.rev)],
        success=[o.put(leader.key, value, leader.lease)],
    ))
    if not resp.succeeded:
        raise NotLeader()
    return int(resp.header.revision)


async def resign(store: LockStore, leader: Leadership) -> int:
    """Give up leadership (delete the key if it is still ours); the revision."""
    resp = await store.txn(rpc_pb2.TxnRequest(
        compare=[o.create_eq(leader.key, leader.rev)], success=[o.delete(leader.key)],
    ))
    if not resp.succeeded:
        raise NotLeader()
    return int(resp.header.revision)


async def leader(store: LockStore, name: bytes | str) -> tuple[kv_pb2.KeyValue, int]:
    """The current leader's key-value and the read's revision; :class:`NoLeader` if none."""
    p = keys.prefix(keys.check_name(name))
    resp = await store.range(o.first_created(p, keys.prefix_end(p)))
    if not resp.kvs:
        raise NoLeader()
    return resp.kvs[0], int(resp.header.revision)


async def observe(
    store: LockStore, name: bytes | str, *, recheck_s: float = DEFAULT_RECHECK_S
) -> AsyncIterator[kv_pb2.KeyValue]:
    """Yield the leader's key-value each time leader or value changes (first: the current).

    Like etcd's Observe: the current leader's key is followed through its watch events,
    so every value it proclaims is reported; when it goes (or the watch breaks), the
    next leader is read afresh.
    """
    raw = keys.check_name(name)
    p = keys.prefix(raw)
    pe = keys.prefix_end(p)
    last: tuple[bytes, int] | None = None
    while True:
        resp = await store.range(o.first_created(p, pe))
        rev = int(resp.header.revision)
        if not resp.kvs:
            await store.wait_change([(p, pe)], rev, recheck_s)
            continue
        kv = resp.kvs[0]
        if (bytes(kv.key), int(kv.mod_revision)) != last:
            last = (bytes(kv.key), int(kv.mod_revision))
            yield kv
        after = rev
        following = True
        while following:
            events = await store.wait_change([(kv.key, b"")], after, recheck_s)
            if not events:
                break  # timeout or broken watch: re-read the leader
            for ev in events:
                after = max(after, int(ev.kv.mod_revision))
                if ev.type == kv_pb2.Event.DELETE:
                    following = False
                    break
                if (bytes(ev.kv.key), int(ev.kv.mod_revision)) != last:
                    last = (bytes(ev.kv.key), int(ev.kv.mod_revision))
                    yield ev.kv
