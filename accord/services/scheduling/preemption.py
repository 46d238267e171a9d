"""Preemption: which running jobs to stop so a blocked job can start.

Eligible victims are preemptible jobs of lower priority, and (quota reclaim)
preemptible jobs of a queue that is borrowing beyond its nominal quota when the
blocked job's queue would stay within its own. Victims are tried cheapest first:
lowest priority, then those with the most recent committed checkpoint (least work
lost when they restart from it), then the most recently started. Victims are
added until the job fits, then any victim the placement does not need is dropped
again, so no job is stopped for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.model import Job, Placement, Running
from accord.services.scheduling.placement import Policy, give_back, place, take
from accord.services.scheduling.queueing import QueueConfig, Usage, is_borrowing


@dataclass(slots=True, frozen=True)
class Preemption:
    """Stop ``victims`` so ``placement`` can start."""

    victims: tuple[str, ...]
    placement: Placement


def eligible(job: Job, r: Running, usage: Usage, queues: Mapping[str, QueueConfig]) -> bool:
    """Whether ``job`` may preempt running job ``r``."""
    if not r.job.preemptible or r.job.id == job.id:
        return False
    if r.job.priority < job.priority:
        return True
    if r.job.queue != job.queue and is_borrowing(r.job.queue, usage, queues):
        q = queues.get(job.queue)
        if q is not None and q.nominal_gpus is not None:
            return usage.queue_gpus.get(job.queue, 0.0) + job.gpus <= q.nominal_gpus + 1e-9
    return False


def victim_order(r: Running, now: float) -> tuple[float, float, float, str]:
    """Sort key: cheapest victim first."""
    ckpt_age = now - r.last_checkpoint if r.last_checkpoint is not None else float("inf")
    return (r.job.priority, ckpt_age, -r.start_time, r.job.id)


def find_victims(index: CapacityIndex, job: Job, running: Iterable[Running], usage: Usage,
                 queues: Mapping[str, QueueConfig], policy: Policy, now: float,
                 max_candidates: int = 64) -> Preemption | None:
    """The fewest cheap victims that let ``job`` fit, with its placement; None if impossible."""
    cands = sorted((r for r in running if eligible(job, r, usage, queues)),
                   key=lambda r: victim_order(r, now))[:max_candidates]
    if not cands:
        return None
    releases = index.releases
    chosen: list[Running] = []
    try:
        found: Placement | None = None
        for r in cands:
            give_back(index, r.job, r.placement)
            chosen.append(r)
            found = place(index, job, policy)
            if found is not None:
                break
        if found is None:
            return None
        # Drop victims the job does not need, most expensive first.
        for r in list(reversed(chosen)):
            take(index, r.job, r.placement)
            p = place(index, job, policy)
            if p is None:
                give_back(index, r.job, r.placement)
            else:
                chosen.remove(r)
                found = p
        return Preemption(tuple(r.job.id for r in chosen), found)
    finally:
        for r in reversed(chosen):
            take(index, r.job, r.placement)
        index.releases = releases
