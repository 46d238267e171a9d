"""Queue order: priorities, weighted dominant-resource fair share, quotas with borrowing.

Order within a cycle: higher priority first; among equal priorities the tenant
with the smallest weighted dominant share (DRF over GPUs and CPU) goes next, and
its share grows as its jobs are placed during the cycle; within a tenant, earlier
submission first, or (``expected_finish``) earlier submission + runtime estimate. ``fair_share=False`` gives plain (priority, submit time) order.

Quotas are per queue: ``nominal_gpus`` is guaranteed; a queue may *borrow* idle
capacity beyond it up to ``borrowing_limit`` more (None: no limit). A queue over
its nominal quota is borrowing, and its preemptible jobs may be reclaimed by a
queue still under its own (see ``preemption.py``). Quotas only gate admission;
*where* a job goes is decided by the one capacity model in ``placement.py``, so
nothing is admitted that cannot be placed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import Job, check_name


@dataclass(slots=True, frozen=True)
class QueueConfig:
    """A queue's quota."""

    name: str
    nominal_gpus: float | None = None
    """Guaranteed GPUs; None means no quota (the queue may use everything)."""
    borrowing_limit: float | None = None
    """GPUs it may use beyond nominal when others leave them idle; None: no limit."""

    @staticmethod
    def from_wire(d: object) -> QueueConfig:
        """Decode and validate."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise SchedulingError("queue: expected a mapping with a string 'name'")
        nominal = d.get("nominal_gpus")
        borrow = d.get("borrowing_limit")
        for label, v in (("nominal_gpus", nominal), ("borrowing_limit", borrow)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise SchedulingError(f"queue {d['name']}: {label} must be a number >= 0 or null")
        return QueueConfig(check_name(d["name"], "queue name"),
                           None if nominal is None else float(nominal),
                           None if borrow is None else float(borrow))

    def to_wire(self) -> dict[str, object]:
        """Encode as a msgpack-friendly dict."""
        return {"name": self.name, "nominal_gpus": self.nominal_gpus,
                "borrowing_limit": self.borrowing_limit}

    def limit(self) -> float:
        """Most GPUs the queue may hold, borrowing included."""
        if self.nominal_gpus is None or self.borrowing_limit is None:
            return float("inf")
        return self.nominal_gpus + self.borrowing_limit


@dataclass(slots=True)
class Usage:
    """What each tenant and queue holds now."""

    total_gpus: float
    total_cpu: float
    tenant_gpus: dict[str, float] = field(default_factory=dict)
    tenant_cpu: dict[str, float] = field(default_factory=dict)
    queue_gpus: dict[str, float] = field(default_factory=dict)

    def add(self, job: Job, sign: float = 1.0) -> None:
        """Charge (or with ``sign=-1`` refund) a job's resources."""
        self.tenant_gpus[job.tenant] = self.tenant_gpus.get(job.tenant, 0.0) + sign * job.gpus
        cpu = sign * job.cpu_milli * job.tasks
        self.tenant_cpu[job.tenant] = self.tenant_cpu.get(job.tenant, 0.0) + cpu
        self.queue_gpus[job.queue] = self.queue_gpus.get(job.queue, 0.0) + sign * job.gpus

    def dominant_share(self, tenant: str) -> float:
        """DRF: the larger of the tenant's GPU and CPU shares."""
        g = self.tenant_gpus.get(tenant, 0.0) / self.total_gpus if self.total_gpus else 0.0
        c = self.tenant_cpu.get(tenant, 0.0) / self.total_cpu if self.total_cpu else 0.0
        return max(g, c)


def quota_block(job: Job, usage: Usage, queues: Mapping[str, QueueConfig]) -> str | None:
    """Why the job's queue may not take it now (its quota plus borrowing), or None."""
    q = queues.get(job.queue)
    if q is None:
        return None
    used = usage.queue_gpus.get(job.queue, 0.0)
    if used + job.gpus > q.limit() + 1e-9:
        return f"queue {job.queue} would exceed its quota plus borrowing limit ({q.limit():g} GPUs)"
    return None


def is_borrowing(queue: str, usage: Usage, queues: Mapping[str, QueueConfig]) -> bool:
    """Whether a queue holds more than its nominal quota."""
    q = queues.get(queue)
    if q is None or q.nominal_gpus is None:
        return False
    return usage.queue_gpus.get(queue, 0.0) > q.nominal_gpus + 1e-9


class FairQueue:
    """Yields pending jobs in scheduling order; ``placed`` updates shares mid-cycle."""

    def __init__(self, pending: Iterable[Job], usage: Usage, weights: Mapping[str, float] | None = None,
                 fair_share: bool = True, expected_finish: bool = False) -> None:
        self.usage = usage
        self.weights = weights or {}
        self.fair_share = fair_share
        self.expected_finish = expected_finish
        self._by_tenant: dict[str, list[Job]] = {}
        self._pos: dict[str, int] = {}
        self._heap: list[tuple[int, float, float, str, str]] = []
        jobs = sorted(pending, key=lambda j: (-j.priority, self._when(j), j.id))
        if not fair_share:
            self._by_tenant[""] = jobs
        else:
            for j in jobs:
                self._by_tenant.setdefault(j.tenant, []).append(j)
        for t in self._by_tenant:
            self._pos[t] = 0
            self._push(t)

    def _push(self, tenant: str) -> None:
        jobs = self._by_tenant[tenant]
        i = self._pos[tenant]
        if i >= len(jobs):
            return
        head = jobs[i]
        share = 0.0
        if self.fair_share:
            share = self.usage.dominant_share(tenant) / max(self.weights.get(tenant, 1.0), 1e-9)
        heapq.heappush(self._heap, (-head.priority, share, self._when(head), head.id, tenant))

    def _when(self, job: Job) -> float:
        """Order key within a priority: submit time, or submit time + runtime estimate.

        Earliest expected finish first lets a short job pass a long one submitted a
        little earlier (lower mean completion time) but never starves anyone: a job
        is only passed by jobs whose submit + estimate is smaller, a finite set.
        """
        return job.submit_time + job.estimated_runtime if self.expected_finish else job.submit_time

    def pop(self) -> Job | None:
        """The next job to consider, or None when all have been considered."""
        if not self._heap:
            return None
        _, _, _, _, tenant = heapq.heappop(self._heap)
        job = self._by_tenant[tenant][self._pos[tenant]]
        self._pos[tenant] += 1
        self._last = tenant
        return job

    def done(self, job: Job, placed: bool) -> None:
        """Report the outcome for the job ``pop`` returned last."""
        if placed:
            self.usage.add(job)
        self._push(self._last)
