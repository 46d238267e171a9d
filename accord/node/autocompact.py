"""etcd's automatic compaction: ``--auto-compaction-mode`` and ``--auto-compaction-retention``.

Pure decisions (no I/O of their own: the caller's clock, and the caller's functions for
the store's revisions, local or gathered over a node's workers); the node runs them on
every member and acts while it leads shard 0 (``Node._compaction_loop``, in worker 0 on
a node of several workers, which compacts every worker's shards). The two modes are etcd's:

* **periodic** (``--auto-compaction-retention 1h``, or a bare number of hours as etcd
  reads it: ``1`` is one hour, ``0.5`` half an hour): keep the history of the last
  retention window. Every member samples the store's revision every tenth of the
  compaction period; the period is the retention, or one hour when the retention is
  longer. Each period the leader compacts at the newest sample taken at least a
  retention ago, so every revision of the window stays readable. On a sharded store a
  sample is the revision a linearizable read would answer at then (the clock's), so "the
  revision of an hour ago" means the same on every layout.
* **revision** (``--auto-compaction-retention 1000``): every 5 minutes, compact at the
  latest revision minus the retention, keeping the last 1,000 revisions. On one shard that
  is etcd's ``rev - 1000``. A sharded store's revisions are clock stamps, not a counter,
  so "the last 1,000 revisions" are the 1,000 latest revisions any write took (a
  multi-shard write counts once), read from this replica's histories
  (``StateMachineBackend.revision_writes_ago``): a replica that lags keeps more, never less.

A compaction that fails (no leader, a timeout) is tried again at the next check; one
etcd answers "already compacted" counts as done, as etcd's compactor counts it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from accord.services.auth.tokens import parse_duration

PERIODIC = "periodic"
REVISION = "revision"
MODES = (PERIODIC, REVISION)

REVISION_CHECK_S = 300.0
"""Seconds between two compactions in revision mode (etcd's 5 minutes)."""
MAX_PERIOD_S = 3600.0
"""The longest compaction period in periodic mode (etcd's hour)."""
SAMPLES_PER_PERIOD = 10
"""Revision samples per compaction period in periodic mode (etcd's tenth)."""


@dataclass(frozen=True, slots=True)
class Retention:
    """What to keep: a window of ``seconds`` (periodic) or ``revisions`` (revision);
    zero in both: automatic compaction is off (etcd's default)."""

    mode: str = PERIODIC
    seconds: float = 0.0
    revisions: int = 0

    @property
    def enabled(self) -> bool:
        return self.seconds > 0 or self.revisions > 0

    def kept(self) -> str:
        """What is kept, in words (for the log)."""
        if self.mode == REVISION:
            return f"the last {self.revisions} revisions kept"
        return f"{self.seconds:g} s of history kept"


def parse_retention(mode: str, text: str) -> Retention:
    """``--auto-compaction-retention`` read as etcd reads it for ``mode``; ``ValueError``
    with the reason when it cannot be."""
    text = text.strip()
    if mode not in MODES:
        raise ValueError(f"auto-compaction-mode {mode!r}: use periodic or revision")
    if mode == REVISION:
        if not text.isdigit():
            raise ValueError(f"auto-compaction-retention {text!r}: revision mode takes a "
                             "whole number of revisions (0: off)")
        return Retention(REVISION, revisions=int(text))
    try:
        hours = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ValueError as e:
            raise ValueError(f"auto-compaction-retention: {e}") from None
    else:
        if hours < 0 or hours != hours:
            raise ValueError(f"auto-compaction-retention {text!r}: must be >= 0")
        seconds = hours * 3600.0
    return Retention(PERIODIC, seconds=seconds)


class PeriodicCompactor:
    """Periodic mode's decisions: feed it samples, ask it when and where to compact."""

    def __init__(self, retention_s: float, start: float) -> None:
        if retention_s <= 0:
            raise ValueError("a periodic compactor needs a retention above 0")
        self.retention = retention_s
        self.period = min(retention_s, MAX_PERIOD_S)
        """Seconds between two compactions."""
        self.step = self.sample_every = self.period / SAMPLES_PER_PERIOD
        """Seconds between two samples of the store's revision (and two decisions)."""
        self._samples: deque[tuple[float, int]] = deque()
        self._last = start
        """When the last compaction was done (or the compactor started)."""

    def sample(self, now: float, revision: int) -> None:
        """Record the store's revision at ``now``; forget samples no compaction needs."""
        self._samples.append((now, revision))
        cutoff = now - self.retention
        # Keep the newest sample at or before the cutoff: it is the next compaction's.
        while len(self._samples) > 1 and self._samples[1][0] <= cutoff:
            self._samples.popleft()

    def due(self, now: float) -> int | None:
        """The revision to compact at now, or None: not a period since the last one, or
        no sample a whole retention old yet."""
        if now - self._last < self.period or not self._samples:
            return None
        at, revision = self._samples[0]
        return revision if at <= now - self.retention else None

    async def decide(self, now: float, leads: bool, revision: Callable[[], Awaitable[int]],
                     writes_ago: Callable[[int], Awaitable[int]]) -> int | None:
        """One step: sample ``revision()`` (every member does, so a new leader has the
        samples), then, on the leader, :meth:`due`."""
        self.sample(now, await revision())
        return self.due(now) if leads else None

    def done(self, now: float, revision: int) -> None:
        """The compaction ``due`` asked for (at ``revision``) is done, or was already."""
        self._last = now


class RevisionCompactor:
    """Revision mode's decisions: every ``interval`` seconds, the revision ``retention``
    writes back, unless it is where the last compaction already was."""

    def __init__(self, retention: int, start: float, interval: float = REVISION_CHECK_S) -> None:
        if retention <= 0:
            raise ValueError("a revision compactor needs a retention above 0")
        self.retention = retention
        self.interval = self.step = interval
        """Seconds between two decisions."""
        self._last = start
        self._compacted = 0

    async def decide(self, now: float, leads: bool, revision: Callable[[], Awaitable[int]],
                     writes_ago: Callable[[int], Awaitable[int]]) -> int | None:
        """One step: on the leader, once an interval has passed since the last
        compaction (or the start), ``writes_ago(retention)``, the revision ``retention``
        writes below the latest: there, unless the history holds no more (0) or the last
        compaction was there already. Asked no more often: over a node's workers it is a
        round of calls."""
        if not leads or now - self._last < self.interval:
            return None
        at = await writes_ago(self.retention)
        return at if at > self._compacted else None

    def done(self, now: float, revision: int) -> None:
        """A compaction at ``revision`` is done (or was done already)."""
        self._last = now
        self._compacted = max(self._compacted, revision)


def compactor(retention: Retention, start: float) -> PeriodicCompactor | RevisionCompactor:
    """The compactor of ``retention`` (enabled), started at ``start``."""
    if retention.mode == REVISION:
        return RevisionCompactor(retention.revisions, start, REVISION_CHECK_S)
    return PeriodicCompactor(retention.seconds, start)
