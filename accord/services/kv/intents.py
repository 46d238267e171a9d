"""Intents and transaction records: the replicated state of multi-shard Txns on one shard.

An *intent* is what a prepared multi-shard Txn holds on a participant shard: the key
ranges of the whole Txn that this shard may hold (every compare, range, put and delete of
every branch), the leases its puts use, the revision ``rev`` it reserved there, the shard
holding its record, its deadline and the request itself (so that whoever resolves it can
apply it). While an intent is open, writes that overlap it are refused in apply and
linearizable reads that overlap it wait (``docs/txn.md``).

A *record* lives on the record shard (the Txn's lowest participant): PENDING from its
prepare until one decision, COMMITTED (with the branch path) or ABORTED. The decision has
one writer: whichever of the coordinator's commit and a resolver's abort comes first in
the record shard's log.

Both tables are plain data, part of the shard's snapshot, changed only by applying
commands: the same entries give the same tables on every replica.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from accord.services.kv.ranges import KeyRange

PENDING = 0
COMMITTED = 1
ABORTED = 2

REVOKE = 1
EXPIRE = 2

RECORD_RETENTION_MS = 600_000
"""How long past its deadline a decided record is kept for late resolvers (10 minutes)."""


@dataclass(slots=True)
class Intent:
    """One prepared multi-shard Txn on this shard."""

    txn_id: int
    rev: int
    """The revision reserved here: the Txn's commit revision on every participant."""
    record: int
    """The shard holding the Txn's record."""
    deadline_ms: int
    """After this (the coordinator's clock), anyone may resolve it through the record."""
    ranges: tuple[KeyRange, ...]
    leases: frozenset[int]
    request: bytes
    """The serialized TxnRequest (empty for a lease revoke)."""
    revoke: int = 0
    """0: a Txn; :data:`REVOKE` or :data:`EXPIRE`: a lease revoke or expiry of the one
    lease in ``leases``, whose keys on this shard are ``ranges``; while it is open, a Put
    attaching a key to that lease here is refused (``docs/txn.md``)."""

    def overlaps(self, kr: KeyRange) -> bool:
        """Whether ``kr`` shares a key with one of this intent's ranges."""
        return any(r.overlaps(kr) for r in self.ranges)

    def dump(self) -> list[Any]:
        """A msgpack-able image."""
        row = [
            self.txn_id, self.rev, self.record, self.deadline_ms,
            [[r.start, r.end, r.single] for r in self.ranges], sorted(self.leases),
            self.request,
        ]
        if self.revoke:  # only then: a snapshot without revokes stays readable by older code
            row.append(self.revoke)
        return row

    @classmethod
    def load(cls, row: Any) -> Intent:
        """Rebuild from :meth:`dump`'s image."""
        txn_id, rev, record, deadline, ranges, leases, request = row[:7]
        return cls(
            int(txn_id), int(rev), int(record), int(deadline),
            tuple(KeyRange(s, e, bool(one)) for s, e, one in ranges),
            frozenset(int(i) for i in leases), bytes(request),
            int(row[7]) if len(row) > 7 else 0,
        )


@dataclass(slots=True)
class Record:
    """A multi-shard Txn's record on its record shard."""

    txn_id: int
    state: int
    rev: int
    deadline_ms: int
    path: tuple[bool, ...] = ()
    commit_rev: int = 0
    """The revision the decision took (a ``PREPARE_DECIDE``: every other participant
    commits there, resolvers read it here); 0: each participant commits at the revision
    it reserved, which ``RESERVE`` rounds made one (``xcommands.py``)."""

    def dump(self) -> list[Any]:
        """A msgpack-able image."""
        row = [self.txn_id, self.state, self.rev, self.deadline_ms, list(self.path)]
        if self.commit_rev:  # only then: an image without it stays readable by older code
            row.append(self.commit_rev)
        return row

    @classmethod
    def load(cls, row: Any) -> Record:
        """Rebuild from :meth:`dump`'s image."""
        txn_id, state, rev, deadline, path = row[:5]
        return cls(int(txn_id), int(state), int(rev), int(deadline),
                   tuple(bool(p) for p in path), int(row[5]) if len(row) > 5 else 0)


class _Records(dict[int, Record]):
    """The records by txn id, with a heap of ``(deadline, txn id)`` beside (every record
    set is pushed), so that :meth:`IntentTable.expire_records` pops the expired ones
    instead of scanning every record kept (10 minutes of them: a scan per prepare on the
    record shard cost more than the rest of the prepare at a hundred Txns a second)."""

    __slots__ = ("by_deadline",)

    def __init__(self) -> None:
        super().__init__()
        self.by_deadline: list[tuple[int, int]] = []

    def __setitem__(self, txn_id: int, rec: Record) -> None:
        super().__setitem__(txn_id, rec)
        heapq.heappush(self.by_deadline, (rec.deadline_ms, txn_id))


class IntentTable:
    """The open intents and the records of one shard."""

    __slots__ = ("_stuck", "intents", "records")

    def __init__(self) -> None:
        self.intents: dict[int, Intent] = {}
        self.records: dict[int, Record] = _Records()
        self._stuck: set[int] = set()
        """Records past their retention still PENDING (kept until decided; normally none)."""

    def __bool__(self) -> bool:
        """Whether any intent is open (the one check the single-shard path pays)."""
        return bool(self.intents)

    def blocking(self, kr: KeyRange, *, other_than: int = 0) -> Intent | None:
        """An open intent (not ``other_than``'s) overlapping ``kr``, or None."""
        for intent in self.intents.values():
            if intent.txn_id != other_than and intent.overlaps(kr):
                return intent
        return None

    def blocking_any(self, ranges: Iterable[KeyRange], *, other_than: int = 0) -> Intent | None:
        """An open intent overlapping any of ``ranges``, or None."""
        for kr in ranges:
            found = self.blocking(kr, other_than=other_than)
            if found is not None:
                return found
        return None

    def in_way(self, ranges: Iterable[KeyRange], *, below: int | None = None,
               txn_id: int = 0) -> list[Intent]:
        """The open intents over any of ``ranges`` (or ``txn_id``'s), only those that
        reserved a revision at or below ``below`` if given: what a request waits out."""
        ranges = tuple(ranges)
        return [i for i in self.intents.values()
                if ((txn_id and i.txn_id == txn_id) or any(i.overlaps(kr) for kr in ranges))
                and (below is None or i.rev <= below)]

    def using_lease(self, lease_ids: Iterable[int]) -> Intent | None:
        """An open intent one of whose puts uses one of ``lease_ids``, or None."""
        ids = set(lease_ids)
        for intent in self.intents.values():
            if intent.leases & ids:
                return intent
        return None

    def revoking(self, lease_ids: Iterable[int]) -> Intent | None:
        """An open lease revoke or expiry of one of ``lease_ids``, or None (a Put
        attaching a key to such a lease must wait for its decision)."""
        for intent in self.intents.values():
            if intent.revoke and not intent.leases.isdisjoint(lease_ids):
                return intent
        return None

    def lowest_rev(self) -> int:
        """The lowest revision an open intent reserved (0: none open)."""
        return min((i.rev for i in self.intents.values()), default=0)

    def lowest_in_way(self, ranges: Iterable[KeyRange]) -> int:
        """The lowest revision reserved by an open intent over any of ``ranges`` (0: none):
        a serializable read over several shards answers below it (``docs/txn.md``)."""
        ranges = tuple(ranges)
        return min((i.rev for i in self.intents.values()
                    if any(i.overlaps(kr) for kr in ranges)), default=0)

    def expire_records(self, now_ms: int) -> None:
        """Forget decided records whose deadline is :data:`RECORD_RETENTION_MS` past (the
        same records a scan of them all would, in O(expired) per call)."""
        records = self.records
        assert isinstance(records, _Records)
        heap, limit = records.by_deadline, now_ms - RECORD_RETENTION_MS
        for t in [t for t in self._stuck if records.get(t) is None
                  or records[t].state != PENDING]:
            self._stuck.discard(t)
            records.pop(t, None)
        while heap and heap[0][0] < limit:
            deadline, t = heapq.heappop(heap)
            rec = records.get(t)
            if rec is None or rec.deadline_ms != deadline:
                continue  # gone already, or set again with another deadline (pushed too)
            if rec.state == PENDING:
                self._stuck.add(t)
            else:
                del records[t]

    def dump(self) -> list[Any]:
        """A msgpack-able, deterministic image."""
        return [
            [self.intents[t].dump() for t in sorted(self.intents)],
            [self.records[t].dump() for t in sorted(self.records)],
        ]

    @classmethod
    def load(cls, image: Any) -> IntentTable:
        """Rebuild from :meth:`dump`'s image."""
        table = cls()
        intents, records = image
        for row in intents:
            i = Intent.load(row)
            table.intents[i.txn_id] = i
        for row in records:
            r = Record.load(row)
            table.records[r.txn_id] = r
        return table
