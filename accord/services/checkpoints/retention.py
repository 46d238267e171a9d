"""Retention: which committed steps of a job a GC pass deletes. Pure functions.

A committed step is kept when any rule of the job's :class:`Retention` keeps it (the
newest ``keep_last``, every ``keep_every``-th step, steps younger than
``keep_within_s``), when it is pinned, or when it is the latest committed step, which
is never a victim whatever the policy says: a policy of "keep the last 0" still leaves
one loadable checkpoint. Steps that are pending are never victims either (they are not
committed yet; their lease expires them).
"""

from __future__ import annotations

from collections.abc import Iterable

from accord.services.checkpoints.model import Retention


def kept(committed: Iterable[tuple[int, float]], policy: Retention, pinned: set[int],
         latest: int | None, now: float) -> set[int]:
    """The committed steps (``(step, committed_at)``) that retention keeps."""
    steps = sorted(committed)
    if policy.keeps_all:
        return {s for s, _ in steps}
    keep = {s for s, _ in steps if s in pinned}
    if latest is not None:
        keep.add(latest)
    if policy.keep_last:
        keep.update(s for s, _ in steps[-policy.keep_last:])
    if policy.keep_every:
        keep.update(s for s, _ in steps if s % policy.keep_every == 0)
    if policy.keep_within_s:
        keep.update(s for s, t in steps if now - t < policy.keep_within_s)
    return keep


def victims(committed: Iterable[tuple[int, float]], policy: Retention, pinned: set[int],
            latest: int | None, now: float) -> list[int]:
    """The committed steps retention deletes, oldest first."""
    steps = list(committed)
    keep = kept(steps, policy, pinned, latest, now)
    return sorted(s for s, _ in steps if s not in keep)
