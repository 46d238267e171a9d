"""Lease bookkeeping: TTLs, deadlines on the replicated clock, attached keys, expiry.

Time never comes from a clock here. Each lease command carries the proposing leader's
clock (``now_ms``) and Raft term; the table keeps a *replicated clock* (``clock_ms``) that
advances with them. Deadlines live in the clock domain of the term that last observed
them. When a command of a newer term arrives (a new leader, whose clock is unrelated to
the old one), every deadline is rebased so that each lease keeps the remaining time it had
at the last command of the old term: a leader change neither expires a lease early nor
resets it to its full TTL (etcd #9395, #17132). The time lost across a leader change is
bounded by the gap between the old leader's last lease command and the new leader's
first; leaders propose a checkpoint command (a clock tick) periodically and on election
to keep that gap short.

The leader alone decides expiry (:meth:`LeaseTable.expired`), then proposes an expire
command; applying it re-checks each deadline, so a keepalive committed in between wins.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from accord.services.kv import errors

_MASK63 = (1 << 63) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


@dataclass(slots=True)
class Lease:
    """One lease: its granted TTL, its deadline and the keys attached to it."""

    id: int
    ttl: int
    """Granted TTL in seconds (after clamping to the minimum)."""
    base_deadline_ms: int
    """Deadline minus the table's ``offset_ms`` (so a rebase is O(1))."""
    keys: set[bytes] = field(default_factory=set)


class LeaseTable:
    """Every live lease of one shard, with a deterministic replicated clock."""

    __slots__ = ("_heap", "clock_ms", "clock_term", "id_seed", "leases", "offset_ms", "seq")

    def __init__(self, id_seed: int = 0) -> None:
        self.leases: dict[int, Lease] = {}
        self.clock_ms = 0
        """The latest leader clock observed in the current term's domain."""
        self.clock_term = 0
        """The term whose clock ``clock_ms`` and the deadlines are in."""
        self.offset_ms = 0
        self.id_seed = id_seed
        self.seq = 0
        self._heap: list[tuple[int, int]] = []

    # --- the replicated clock -------------------------------------------------------------
    def observe(self, now_ms: int, term: int) -> None:
        """Advance the replicated clock with a command's ``(now_ms, term)``.

        ``term == 0`` means "same domain as before". A newer term rebases every deadline;
        a clock reading from an older term or an earlier time is ignored (never backwards).
        """
        if term > self.clock_term:
            self.offset_ms += now_ms - self.clock_ms
            self.clock_ms = now_ms
            self.clock_term = term
        elif (term == 0 or term == self.clock_term) and now_ms > self.clock_ms:
            self.clock_ms = now_ms

    def deadline_ms(self, lease: Lease) -> int:
        """The lease's deadline in the current clock domain."""
        return lease.base_deadline_ms + self.offset_ms

    def _set_deadline(self, lease: Lease, deadline_ms: int) -> None:
        lease.base_deadline_ms = deadline_ms - self.offset_ms
        heapq.heappush(self._heap, (lease.base_deadline_ms, lease.id))

    # --- commands --------------------------------------------------------------------------
    def grant(self, lease_id: int, ttl: int, *, min_ttl: int, max_ttl: int, max_leases: int) -> Lease:
        """Create a lease (``lease_id == 0``: pick a deterministic unused id)."""
        if ttl > max_ttl:
            raise errors.LEASE_TTL_TOO_LARGE
        if lease_id != 0 and lease_id in self.leases:
            raise errors.LEASE_EXISTS
        if len(self.leases) >= max_leases:
            raise errors.too_many_leases(max_leases)
        ttl = max(ttl, min_ttl)
        while lease_id == 0 or lease_id in self.leases:
            self.seq += 1
            mixed = (self.id_seed * 0x100000001B3 + self.seq) ^ (self.clock_ms << 20)
            lease_id = _splitmix64(mixed & 0xFFFFFFFFFFFFFFFF) & _MASK63
        lease = Lease(lease_id, ttl, 0)
        self._set_deadline(lease, self.clock_ms + ttl * 1000)
        self.leases[lease_id] = lease
        return lease

    def renew(self, lease_id: int) -> int:
        """KeepAlive: restart the lease's TTL; returns the TTL, 0 if unknown or expired."""
        lease = self.leases.get(lease_id)
        if lease is None or self.deadline_ms(lease) <= self.clock_ms:
            return 0
        self._set_deadline(lease, self.clock_ms + lease.ttl * 1000)
        return lease.ttl

    def set_remaining(self, lease_id: int, remaining_s: int) -> None:
        """Checkpoint: the lease has ``remaining_s`` seconds left from now (etcd's
        LeaseCheckpoint); unknown leases and non-positive values are ignored."""
        lease = self.leases.get(lease_id)
        if lease is not None and remaining_s > 0:
            self._set_deadline(lease, self.clock_ms + remaining_s * 1000)

    def remove(self, lease_id: int) -> Lease:
        """Forget a lease (revoke/expire); raises lease-not-found."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            raise errors.LEASE_NOT_FOUND
        return lease

    def is_expired(self, lease_id: int) -> bool:
        """Whether the lease exists and its deadline has passed on the replicated clock."""
        lease = self.leases.get(lease_id)
        return lease is not None and self.deadline_ms(lease) <= self.clock_ms

    # --- key attachment --------------------------------------------------------------------
    def attach(self, lease_id: int, key: bytes) -> None:
        """Record that ``key`` is held by ``lease_id`` (no-op for 0 or a vanished lease)."""
        lease = self.leases.get(lease_id)
        if lease is not None:
            lease.keys.add(key)

    def detach(self, lease_id: int, key: bytes) -> None:
        """Record that ``key`` no longer belongs to ``lease_id``."""
        lease = self.leases.get(lease_id)
        if lease is not None:
            lease.keys.discard(key)

    # --- leader-side queries (not replicated) ----------------------------------------------
    def expired(self, now_ms: int, limit: int) -> list[int]:
        """Ids of leases whose deadline is ``<= now_ms``, soonest first, at most ``limit``."""
        out: list[int] = []
        heap = self._heap
        base_now = now_ms - self.offset_ms
        seen: set[int] = set()
        stash: list[tuple[int, int]] = []
        while heap and heap[0][0] <= base_now and len(out) < limit:
            entry = heapq.heappop(heap)
            base, lease_id = entry
            lease = self.leases.get(lease_id)
            if lease is None or lease.base_deadline_ms != base or lease_id in seen:
                continue  # stale heap entry: the lease was renewed or removed
            seen.add(lease_id)
            out.append(lease_id)
            stash.append(entry)
        for entry in stash:  # stay queued until the expire command is applied
            heapq.heappush(heap, entry)
        return out

    def remaining_s(self, lease: Lease, now_ms: int) -> int:
        """Whole seconds left (truncated, as etcd), never negative."""
        return max(0, (self.deadline_ms(lease) - now_ms) // 1000)

    # --- persistence ---------------------------------------------------------------------
    def dump(self, *, with_time: bool = True) -> list[Any]:
        """A msgpack-able, deterministic image. ``with_time=False`` (etcd's Hash) puts 0
        for the replicated clock and every deadline, which lease checkpoints and a new
        leader's clock move while no lease changes (etcd hashes a lease's id and TTL,
        not its remaining time); it is not an image to :meth:`load`."""
        return [
            self.clock_ms if with_time else 0,
            self.clock_term if with_time else 0,
            self.id_seed,
            self.seq,
            [
                [lid, lease.ttl, self.deadline_ms(lease) if with_time else 0,
                 sorted(lease.keys)]
                for lid, lease in sorted(self.leases.items())
            ],
        ]

    @classmethod
    def load(cls, image: list[Any]) -> LeaseTable:
        """Rebuild from :meth:`dump`'s image."""
        clock_ms, clock_term, id_seed, seq, leases = image
        table = cls(id_seed)
        table.clock_ms, table.clock_term, table.seq = clock_ms, clock_term, seq
        for lid, ttl, deadline, keys in leases:
            lease = Lease(lid, ttl, 0, set(keys))
            table._set_deadline(lease, deadline)
            table.leases[lid] = lease
        return table
