"""One scheduling cycle: from the cluster's state to a list of decisions.

The leader of the scheduling shard runs ``run_cycle`` on its replica of the state
and commits the result as one ``place_jobs`` command; the state machine applies
(and re-validates) it. ``run_cycle`` takes capacity tentatively while it works
and gives every bit back before it returns, so the replica is unchanged.

Per cycle: jobs in queue order (``queueing.py``); each that passes its quota is
placed if it fits. The first that does not fit may preempt cheaper jobs
(``preemption.py``); if it still cannot start, it becomes the head with a
reservation (``backfill.py``) and later jobs only start if they cannot delay it.
A shape (size, selector, topology) that failed is not searched again in the
cycle unless capacity was released since (the index only shrinks in between).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from accord.services.scheduling.backfill import Mask, Reservation, may_ignore_mask, reserve
from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.model import WHOLE, Job, Placement, Running
from accord.services.scheduling.placement import Policy, give_back, place, take
from accord.services.scheduling.preemption import find_victims
from accord.services.scheduling.queueing import FairQueue, QueueConfig, Usage, quota_block

_UNKNOWN = object()


@dataclass(slots=True)
class CycleCache:
    """What one cycle learned that stays true for the next while no capacity is released.

    Between cycles the index only changes through committed commands; while its
    ``releases`` counter stands still, capacity has only shrunk, so a shape that
    did not fit still does not, and the head's reservation still holds (every
    device it needs is idle-and-masked or held by a job ending by its start)
    unless a node or device left service, which ``topology_changes`` tracks.
    Leader-local: never part of the replicated state.
    """

    index_id: int = 0
    releases: int = -1
    topology_changes: int = -1
    failed: dict[tuple[object, ...], int] = field(default_factory=dict)
    reservations: dict[str, object] = field(default_factory=dict)
    probe: Policy | None = None

    def probe_policy(self, policy: Policy) -> Policy:
        """The policy used to find a reservation: the same search without fragmentation scoring.

        A reservation only needs *a* place at the shadow time, and the shadow-time
        search moves many nodes through states the fragmentation memo has never seen.
        """
        if policy.name not in ("accord", "best-fit"):
            return policy
        if self.probe is None:
            self.probe = Policy("best-fit", max_domains=policy.max_domains)
        return self.probe

    def reset(self, index: CapacityIndex) -> None:
        """Forget everything (capacity was released, or another index is scheduled)."""
        self.index_id = id(index)
        self.releases = index.releases
        self.topology_changes = index.topology_changes
        self.failed = {}
        self.reservations = {}

    def reservation_for(self, job: Job, index: CapacityIndex, now: float, dirty: bool
                        ) -> Reservation | None:
        """A still-valid reservation computed for ``job`` in an earlier cycle, if any."""
        if dirty:
            return None
        res = self.reservations.get(job.id, _UNKNOWN)
        if isinstance(res, Reservation) and res.start >= now:
            return res
        return None

    def remember(self, job: Job, index: CapacityIndex, res: Reservation | None) -> None:
        """Keep a reservation for the next cycles."""
        if res is not None:
            self.reservations[job.id] = res


@dataclass(slots=True)
class CycleConfig:
    """Which scheduling features a cycle uses (baselines switch some off)."""

    policy: Policy = field(default_factory=Policy)
    fair_share: bool = True
    expected_finish: bool = False
    """Order within a tenant and priority by submit time + runtime estimate (see queueing)."""
    backfill: bool = True
    strict_order: bool = False
    """Stop at the first job that does not fit (plain FIFO, no backfill)."""
    preemption: bool = True
    max_preemptions: int = 4
    """Preemption searches per cycle (each costs a few placement searches)."""
    cache: CycleCache = field(default_factory=CycleCache)


@dataclass(slots=True)
class CycleResult:
    """What the leader commits: preemptions first, then placements."""

    placements: list[Placement] = field(default_factory=list)
    preemptions: list[str] = field(default_factory=list)
    reservation: Reservation | None = None
    considered: int = 0


def run_cycle(index: CapacityIndex, pending: Iterable[Job], running: Mapping[str, Running],
              now: float, cfg: CycleConfig, queues: Mapping[str, QueueConfig] | None = None,
              weights: Mapping[str, float] | None = None) -> CycleResult:
    """Decide placements and preemptions for ``pending`` jobs; ``index`` is left unchanged."""
    queues = queues or {}
    usage = Usage(total_gpus=float(index.total_devices), total_cpu=float(index.total_cpu))
    for r in running.values():
        usage.add(r.job)
    fq = FairQueue(pending, usage, weights, cfg.fair_share, cfg.expected_finish)
    out = CycleResult()
    jobs_of: dict[str, Job] = {}
    preempted: list[Running] = []
    cache = cfg.cache
    if (cache.index_id != id(index) or cache.releases != index.releases
            or cache.topology_changes != index.topology_changes):
        cache.reset(index)
    failed = cache.failed
    mask: Mask | None = None
    mask_key: object = None
    head_job: Job | None = None
    live = dict(running)
    pre_left = cfg.max_preemptions if cfg.preemption else 0
    releases0 = index.releases
    try:
        while (job := fq.pop()) is not None:
            out.considered += 1
            if quota_block(job, usage, queues) is not None:
                fq.done(job, False)
                continue
            short = out.reservation is not None and may_ignore_mask(job, out.reservation, now)
            key = (job.shape(), job.topology, short, mask_key)
            p: Placement | None = None
            if failed.get(key) != index.releases:
                p = place(index, job, cfg.policy, keep=True)
                if (p is None and short and mask is not None and out.reservation is not None
                        and _could_fit_unmasked(index, job, mask)):
                    # Ends before the shadow time: it may use reserved capacity, so search
                    # without the mask, then hold what is still idle of the reservation again.
                    mask.lift(index)
                    p = place(index, job, cfg.policy, keep=True)
                    assert head_job is not None
                    mask = Mask.apply(index, head_job, out.reservation)
                    if p is not None:
                        out.placements.append(p)
                        jobs_of[job.id] = job
                        fq.done(job, True)
                        continue
                if p is not None:
                    out.placements.append(p)
                    jobs_of[job.id] = job
                    fq.done(job, True)
                    continue
                failed[key] = index.releases
            if out.reservation is None and pre_left > 0 and any(
                    r.job.preemptible for r in live.values()):
                pre_left -= 1
                pre = find_victims(index, job, live.values(), usage, queues, cfg.policy, now)
                if pre is not None:
                    for vid in pre.victims:
                        victim = live.pop(vid)
                        give_back(index, victim.job, victim.placement)
                        usage.add(victim.job, -1.0)
                        preempted.append(victim)
                        out.preemptions.append(vid)
                    take(index, job, pre.placement)
                    out.placements.append(pre.placement)
                    jobs_of[job.id] = job
                    fq.done(job, True)
                    continue
            if out.reservation is None and (cfg.backfill or cfg.strict_order):
                res = cache.reservation_for(job, index, now, bool(preempted))
                if res is None:
                    started = [Running(jobs_of[q.job_id], q, now) for q in out.placements]
                    res = reserve(index, job, [*live.values(), *started], cache.probe_policy(cfg.policy),
                                  now)
                    if not preempted:
                        cache.remember(job, index, res)
                if res is not None:
                    if cfg.strict_order:
                        break  # plain FIFO: the blocked head holds everyone back
                    out.reservation = res
                    head_job = job
                    mask = Mask.apply(index, job, res)
                    mask_key = (res.job_id, res.start, res.placement)
                # A job that would not fit even when everything running ends blocks no one.
            fq.done(job, False)
    finally:
        if mask is not None:
            mask.lift(index)
        for p in reversed(out.placements):
            give_back(index, jobs_of[p.job_id], p)
        for victim in reversed(preempted):
            take(index, victim.job, victim.placement)
        index.releases = releases0
    return out


def _could_fit_unmasked(index: CapacityIndex, job: Job, mask: Mask) -> bool:
    """Cheap bound: could lifting the mask free enough idle devices for ``job``?"""
    if job.gpu_milli < WHOLE or job.devices_per_task == 0:
        return True
    idle = sum(index.class_free.get(c, 0) for c in index.matching_classes(job.selector))
    return idle + mask.devices() >= job.tasks * job.devices_per_task
