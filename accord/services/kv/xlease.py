"""A lease revoke (or expiry) across shards at one revision (``docs/txn.md``).

Every shard keeps the ids of the live leases and the keys attached to each on that shard
(``backend.py``). Revoking a lease whose keys lie on several shards runs the multi-shard
Txn's protocol with one change: its intent also holds the lease id, so that a Put
attaching a key to the lease on any shard waits until the revoke is decided (then it
either ran before and its key is deleted with the others, or it fails with etcd's
"requested lease not found"). The rounds:

1. ``LEASE`` prepare on every shard (all hold the lease id): an intent over the lease's
   keys there, one reserved revision R (``RESERVE`` when they differ), and on shard 0 (the
   record shard, the leases' home) the PENDING record; an expiry is refused there if a
   keepalive renewed the lease meanwhile;
2. ``COMMIT`` on shard 0, the decision (an expiry is aborted instead if the lease is no
   longer overdue): the lease's keys there are deleted at R and the lease is forgotten;
3. ``COMMIT`` on the other shards: their keys deleted at R, the lease forgotten; run in
   the background after the answer (the decision is durable; their intents hold the lease
   and the keys until then), so a revoke answers after two rounds.

Every revoke with several shards runs this, wherever its keys lie (on one shard or none
too): each shard holds the lease id, so a Put with it on a shard that has not been told
could otherwise land after the revoke took effect elsewhere and be deleted at that
shard's own revision (the older path's race; ``broken_lease_plain_path`` in the backend).

A coordinator that dies midway leaves intents that the recovery pass resolves through the
record exactly as a Txn's (``xcoord.Coordinator.resolve``): all keys deleted at R, or
none and the lease still live.
"""

from __future__ import annotations

import asyncio
import random

import grpc

from accord.proto import rpc_pb2
from accord.services.kv import errors, xcommands
from accord.services.kv.errors import EtcdError
from accord.services.kv.intents import COMMITTED
from accord.services.kv.statemachine import KVStateMachine
from accord.services.kv.xcoord import MAX_ATTEMPTS, TXN_TIMEOUT_MS, WAIT_TIMEOUT_S, Coordinator

RECORD = 0
"""The record shard of every lease revoke: shard 0, where leases live."""


async def revoke(
    coord: Coordinator, lease_id: int, *, expire: bool = False, broken: bool = False,
) -> int | None:
    """Revoke ``lease_id`` on every shard at one revision; returns that revision.

    With ``expire``, an expiry: None when the lease is no longer overdue (a keepalive
    won). Raises etcd's lease-not-found for an unknown lease. ``broken`` (tests only):
    the deliberately broken variant in which the shards other than 0 delete their keys
    each at its own next revision after the decision, as before this protocol."""
    parts = coord.parts
    machines, n = parts.machines, parts.shards
    shards = list(range(n))
    loop = asyncio.get_running_loop()
    give_up = loop.time() + WAIT_TIMEOUT_S
    floor = 0
    for attempt in range(MAX_ATTEMPTS):
        txn_id = random.getrandbits(62) | 1
        rev = max(max(m.revision for m in machines) + 1, floor)
        stamp = parts.stamp()
        if stamp:  # ordered: the record shard's stripe, at or above the stamp and floor
            rev = -max(-stamp, floor)
        now, term = parts.lease_clock()
        deadline = now + TXN_TIMEOUT_MS
        answers = await asyncio.gather(
            *(parts.commit(xcommands.encode_lease(
                txn_id, lease_id, rev, s, deadline, now, term, expire), s) for s in shards),
            return_exceptions=True,
        )
        failure = next((a for a in answers if isinstance(a, BaseException)), None)
        prepared = [a for a in answers if isinstance(a, xcommands.Prepared)]
        if failure is not None or len(prepared) != n or not all(a.ok for a in prepared):
            await coord._abort(txn_id, shards)
            if failure is not None:
                raise failure
            home = prepared[RECORD].reason
            if home == "not-found":
                if expire:
                    return None
                raise errors.LEASE_NOT_FOUND
            if home == "alive":
                return None
            coord.stats["retries"] += 1
            if any(a.reason == "conflict" for a in prepared):
                await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
            if loop.time() > give_up:
                break
            continue
        settled = await coord.settle_revision(txn_id, shards, prepared, bool(stamp))
        if settled is None:
            floor = max(a.rev for a in prepared) + 1
            continue
        rev = settled
        first = await parts.commit(xcommands.encode_commit(txn_id, [], RECORD, n, now), RECORD)
        if first.decision is None or first.decision.state != COMMITTED:
            await coord._abort(txn_id, shards)
            if expire:
                return None  # renewed meanwhile, or resolved by another: the next pass sees
            coord.stats["retries"] += 1
            continue
        if broken:
            # The broken variant: the other shards delete their keys each at its own next
            # revision, after the decision (the behaviour before this protocol).
            await asyncio.gather(*(parts.commit(
                xcommands.encode_abort(txn_id, False, now), s) for s in shards[1:]))
            plain = _plain_revoke(lease_id)
            await asyncio.gather(*(_tolerant(coord, plain, s) for s in shards[1:]))
        else:
            # The decision is durable and the answer holds nothing from the other shards:
            # answer now and commit them in the background. Until each has, its intent
            # holds the lease (a Put with it waits, then fails with lease-not-found) and
            # its keys (a linearizable read at or above R waits), as for a Txn's.
            coord.finish_later(txn_id, [], shards[1:], now)
        coord.stats["committed"] += 1
        await parts.settle(rev)
        return rev
    raise EtcdError(
        grpc.StatusCode.UNAVAILABLE,
        "accord: a lease revoke across shards kept meeting transactions in progress on "
        "its keys and gave up; retry it",
    )


def _plain_revoke(lease_id: int) -> bytes:
    return KVStateMachine.encode_lease_revoke(rpc_pb2.LeaseRevokeRequest(ID=lease_id))


async def _tolerant(coord: Coordinator, command: bytes, shard: int) -> None:
    try:
        await coord.parts.commit(command, shard)
    except EtcdError:
        pass
