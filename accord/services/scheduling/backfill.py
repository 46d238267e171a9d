"""EASY backfill: a reservation for the blocked head job, and the rule for jumping it.

When the job at the head of the order cannot be placed, ``reserve`` finds its
*shadow time*: releasing running jobs in order of their expected end (start +
runtime estimate), the first moment it would fit, and the placement it would get
then. A later job may start now only if it cannot delay that: either it ends (by
its own estimate) before the shadow time, or it uses none of the reserved
capacity that is idle now. ``Mask`` holds that idle reserved capacity out of the
index while backfill candidates are placed.

With exact estimates the head starts no later than its shadow time: every
reserved device is either idle-and-masked now or held by a job that ends by then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.model import Job, Placement, Running
from accord.services.scheduling.placement import Policy, give_back, place, take


@dataclass(slots=True, frozen=True)
class Reservation:
    """The blocked head job, when it will fit, and where."""

    job_id: str
    start: float
    placement: Placement


def reserve(index: CapacityIndex, head: Job, running: Iterable[Running], policy: Policy,
            now: float) -> Reservation | None:
    """The head job's shadow time and placement, or None if it would not fit even on an idle cluster.

    Running jobs are grouped by expected end; the earliest group after whose end
    the head fits is found by galloping then bisecting, so a cluster with
    thousands of running jobs costs O(log n) placement searches, not O(n).
    """
    groups: list[list[Running]] = []
    for r in sorted(running, key=lambda r: (max(r.expected_end, now), r.job.id)):
        if groups and max(groups[-1][0].expected_end, now) == max(r.expected_end, now):
            groups[-1].append(r)
        else:
            groups.append([r])
    if not groups:
        return None
    upto = -1  # groups[0..upto] are released
    releases = index.releases

    def move_to(g: int) -> None:
        nonlocal upto
        while upto < g:
            upto += 1
            for r in groups[upto]:
                give_back(index, r.job, r.placement)
        while upto > g:
            for r in reversed(groups[upto]):
                take(index, r.job, r.placement)
            upto -= 1

    def fits(g: int) -> Placement | None:
        move_to(g)
        return place(index, head, policy)

    try:
        lo, step, g = -1, 1, 0
        found: tuple[int, Placement] | None = None
        while True:
            p = fits(g)
            if p is not None:
                found = (g, p)
                break
            if g == len(groups) - 1:
                return None
            lo = g
            g = min(len(groups) - 1, g + step)
            step *= 2
        hi = found[0]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            p = fits(mid)
            if p is not None:
                hi, found = mid, (mid, p)
            else:
                lo = mid
        return Reservation(head.id, max(groups[hi][0].expected_end, now), found[1])
    finally:
        move_to(-1)
        index.releases = releases


@dataclass(slots=True)
class Mask:
    """Reserved capacity that is idle now, held out of the index while backfilling."""

    held: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    """(node, device index or -1, milli, cpu, mem) as taken."""

    @staticmethod
    def apply(index: CapacityIndex, job: Job, res: Reservation) -> Mask:
        """Take whatever part of the reservation is idle now."""
        m = Mask()
        for t in res.placement.tasks:
            nc = index.nodes.get(t.node)
            if nc is None or not nc.schedulable:
                continue
            for d in t.devices:
                p = nc.pos_of.get(d)
                if p is None or not nc.healthy[p]:
                    continue
                amount = min(nc.free[p], job.gpu_milli)
                if amount > 0:
                    index.allocate(t.node, [d], amount, 0, 0)
                    m.held.append((t.node, d, amount, 0, 0))
            cpu = min(nc.free_cpu, job.cpu_milli)
            mem = min(nc.free_mem, job.memory_mib)
            if cpu or mem:
                index.allocate(t.node, [], 0, cpu, mem)
                m.held.append((t.node, -1, 0, cpu, mem))
        return m

    def devices(self) -> int:
        """Devices (whole or in part) held."""
        return sum(1 for _, d, _, _, _ in self.held if d >= 0)

    def lift(self, index: CapacityIndex) -> None:
        """Give the held capacity back (does not count as a release)."""
        releases = index.releases
        for node, d, milli, cpu, mem in reversed(self.held):
            index.release(node, [d] if d >= 0 else [], milli, cpu, mem)
        index.releases = releases
        self.held.clear()


def may_ignore_mask(job: Job, res: Reservation, now: float) -> bool:
    """A job that ends, by its estimate, before the shadow time may use reserved capacity."""
    return now + job.estimated_runtime <= res.start
