"""One revision order across shards: clock stamps, striped revisions, commit-wait.

With several shards every write transaction must get a revision no other one has, and a
write acknowledged before another starts must get the lower one, whatever shards they
are on (``docs/txn.md``, "One revision order"). This module is the proposer's half:

* **stamp**: a write is proposed with an *ordered stamp* ``-(t * n)`` as its
  ``min_revision`` (``t``: this member's clock in microseconds, never going back on this
  member; ``n``: the shard count). The apply (``MVCCStore.striped``) gives it the lowest
  revision >= max(shard revision + 1, t * n) that is congruent to the shard modulo n
  (a multi-shard Txn: to its record shard): shards never share a revision, and a
  revision is the clock time of its write to within the shard's own pace.
* **commit-wait**: before a write (or a linearizable read) is answered with revision R,
  the member waits until its clock is past ``R // n + max_drift``. Any write that starts
  after the answer, on any member whose clock is within ``max_drift`` of this one, then
  stamps ``t > R // n`` and so gets a revision above R (Spanner's commit-wait; with
  members on one host, ``max_drift`` = 0 and the wait is almost always nothing, since
  R // n is the clock time of a write already applied).

The stamp is negative so that an older member could never mistake it for a floor; a
proposer only sends stamps once every member advertises :data:`ORDER_GATE`. A member
whose clock disagrees with the cluster's, or just stepped, stamps nothing: its
:class:`~accord.services.kv.clockguard.ClockGuard` refuses (``clockguard.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from accord.services.kv.clockguard import ClockGuard

ORDER_GATE = 5
"""The command format from which members apply ordered stamps (the cluster-version gate)."""
READ_FENCE_GATE = 8
"""The format a member advertises once its shard leaders fence reads (``read_fence``):
a linearizable read's ``header.revision`` comes from the clock (``read_revision``) only
once every member does, since any of them may lead the shard it reads."""


class RevisionOrder:
    """Stamps and commit-waits for one member of an ``n``-shard store."""

    def __init__(self, shards: int, max_drift_ms: float = 0.0,
                 clock_ns: Callable[[], int] = time.time_ns,
                 guard: ClockGuard | None = None) -> None:
        """``guard``: checked before every stamp (``ClockUntrusted`` when this member's
        clock may not be used); None trusts the clock (simulations, in-process tests)."""
        if shards < 2:
            raise ValueError("a revision order is for two or more shards")
        if max_drift_ms < 0:
            raise ValueError("max_drift_ms must be >= 0")
        self.shards = shards
        self.drift_us = int(max_drift_ms * 1000)
        self._clock_ns = clock_ns
        self._last = 0
        self.guard = guard
        self.waits = 0
        """How many answers had to wait (a measure of the clock being behind revisions)."""

    def now_us(self) -> int:
        """This member's clock in microseconds, never lower than it said before."""
        t = self._clock_ns() // 1000
        if t > self._last:
            self._last = t
        return self._last

    def stamp(self, noop_floor: bool = False) -> int:
        """The ``min_revision`` of an ordered write proposed now (negative: a stamp);
        raises ``ClockUntrusted`` when the guard refuses this member's clock.

        ``noop_floor`` marks the stamp (``t * n - 1`` instead of ``t * n``) for a write
        that may write nothing (a Txn, a DeleteRange): if it does, its apply raises the
        shard to the stamp (:func:`noop_floor`), so that the answer, like a read's, is at
        or above every write acknowledged before it started (``docs/txn.md``). Only once
        every member applies the mark (:data:`READ_FENCE_GATE`)."""
        t = self._trusted_us() * self.shards
        return -(t - 1) if noop_floor else -t

    def read_revision(self) -> int:
        """The revision a linearizable read that starts now may answer at, whatever
        shard it reads: ``t * n - 1``. Every write acknowledged before now was answered
        after its member's clock passed ``R // n + max_drift``, so ``R < t * n`` on any
        clock within the drift; the shard's leader fences above it (:meth:`fence`).
        Raises ``ClockUntrusted`` when the guard refuses this member's clock."""
        return self._trusted_us() * self.shards - 1

    def fence(self) -> int:
        """The floor a shard's leader appends before anything it appends after answering
        reads: ``(t + max_drift) * n``, above the :meth:`read_revision` of every read it
        answered (each started before the answer, on a clock within the drift), so no
        write appended later lands at or below what such a read answered. Raises
        ``ClockUntrusted`` when the guard refuses this member's clock."""
        return (self._trusted_us() + self.drift_us) * self.shards

    def _trusted_us(self) -> int:
        """:meth:`now_us` (at least 1), once the guard allows this member's clock."""
        if self.guard is not None:
            self.guard.check()
        return max(1, self.now_us())

    def ready(self, revision: int) -> bool:
        """Whether an answer at ``revision`` may be given now (its commit-wait is over)."""
        return self._clock_ns() // 1000 > revision // self.shards + self.drift_us

    async def settle(self, revision: int) -> None:
        """The commit-wait: return once an answer at ``revision`` may be given."""
        if self.ready(revision):
            return
        self.waits += 1
        for _ in range(100_000):
            ahead = revision // self.shards + self.drift_us - self._clock_ns() // 1000
            if ahead < 0:
                return
            await asyncio.sleep((ahead + 1) / 1e6)
        raise RuntimeError("the clock did not pass a revision's commit-wait")


def tick_clock(start_us: int = 0) -> Callable[[], int]:
    """A logical clock for in-process simulations and tests: every reading is 1 us after
    the one before, so two runs of one history get the same revisions and a commit-wait
    never sleeps on an event loop that nothing else advances."""
    t = start_us * 1000

    def now_ns() -> int:
        nonlocal t
        t += 1000
        return t

    return now_ns


def noop_floor(min_revision: int, shards: int) -> int:
    """The floor a write that wrote nothing raises its shard to: its stamp, when the
    proposer marked it (``RevisionOrder.stamp(noop_floor=True)``: one below a multiple of
    the shard count), else 0."""
    if min_revision >= 0 or shards < 2:
        return 0
    stamp = -min_revision
    return stamp if stamp % shards == shards - 1 else 0
