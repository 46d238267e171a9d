"""GPU fragmentation in the style of FGD (Weng et al., USENIX ATC'23).

A node's idle GPU capacity is *fragmented* with respect to a task type when that
task cannot use it: all of it if the task cannot run on the node at all (too
little CPU or memory, no device of a type it accepts, too few idle devices), or
else the slices of devices too small for the task (partial devices for a
whole-device task, devices with less than its share for a fractional task) plus
devices of types it does not accept. A node's fragmentation is the expectation
over the workload's mix of task types; the fragmentation-guided choice puts a
task where that expectation grows least.

Values are in thousandths of a GPU. Results are cached per node *signature*
(see ``capacity.py``), since nodes in the same state fragment the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from accord.services.scheduling.capacity import CapacityIndex, Signature
from accord.services.scheduling.model import WHOLE, Job


@dataclass(slots=True, frozen=True)
class TaskType:
    """One kind of task in the workload mix."""

    devices: int
    milli: int
    cpu: int
    mem: int
    selector: str

    @staticmethod
    def of(job: Job) -> TaskType:
        """A job's task type; memory is left out (as in FGD) so the mix has few, popular types."""
        return TaskType(job.devices_per_task, job.gpu_milli, job.cpu_milli, 0, job.selector)


class Workload:
    """The task-type mix the fragmentation measure is taken against (top ``limit`` types)."""

    def __init__(self, counts: Counter[TaskType], limit: int = 48) -> None:
        top = [(t, n) for t, n in counts.most_common(limit) if t.devices > 0]
        total = sum(n for _, n in top)
        self.types: list[tuple[TaskType, float]] = [(t, n / total) for t, n in top] if total else []
        self._match: dict[int, list[frozenset[int]]] = {}
        self._cache: dict[Signature, float] = {}
        self._cache_classes = -1

    @staticmethod
    def from_jobs(jobs: Iterable[Job], limit: int = 48) -> Workload:
        """The mix of task types among ``jobs`` (each task of a gang counts)."""
        c: Counter[TaskType] = Counter()
        for j in jobs:
            c[TaskType.of(j)] += j.tasks
        return Workload(c, limit)

    def _matches(self, index: CapacityIndex) -> list[frozenset[int]]:
        n = len(index.class_keys)
        if n != self._cache_classes:
            self._cache.clear()
            self._cache_classes = n
            self._match[n] = [frozenset(index.matching_classes(t.selector)) for t, _ in self.types]
        return self._match[n]

    def node_frag(self, index: CapacityIndex, sig: Signature) -> float:
        """Expected fragmented thousandths of a node in state ``sig``."""
        hit = self._cache.get(sig)
        if hit is not None and self._cache_classes == len(index.class_keys):
            return hit
        match = self._matches(index)
        if len(self._cache) > 200_000:
            self._cache.clear()  # bounded memory on long runs; values are cheap to recompute
        _, devs, cpu, mem = sig
        total_free = 0
        for _c, f in devs:
            total_free += f
        if total_free == 0:
            self._cache[sig] = 0.0
            return 0.0
        frag = 0.0
        for (t, w), ok in zip(self.types, match, strict=True):
            frag += w * _frag_for(devs, cpu, mem, t, ok, total_free)
        self._cache[sig] = frag
        return frag

    def cluster_frag(self, index: CapacityIndex) -> float:
        """Expected fragmented GPUs over all schedulable nodes (in GPUs, not thousandths)."""
        total = 0.0
        for sig, names in index.sigs.items():
            total += self.node_frag(index, sig) * len(names)
        return total / WHOLE


def _frag_for(
    devs: tuple[tuple[int, int], ...], cpu: int, mem: int, t: TaskType, ok: frozenset[int],
    total_free: int,
) -> int:
    """Fragmented thousandths of one node state for one task type."""
    if t.cpu > cpu or t.mem > mem:
        return total_free
    usable = 0
    frag = 0
    if t.milli < WHOLE:
        for c, f in devs:
            if c in ok and f >= t.milli:
                usable += 1
            else:
                frag += f
        return total_free if usable == 0 else frag
    for c, f in devs:
        if c in ok and f == WHOLE:
            usable += 1
        else:
            frag += f
    return total_free if usable < t.devices else frag


def after_taking(sig: Signature, taken: list[tuple[int, int]], milli: int, cpu: int, mem: int) -> Signature:
    """The signature a node would have after a task takes ``milli`` of each (class, free) device."""
    devs = list(sig[1])
    for item in taken:
        i = devs.index(item)
        devs[i] = (item[0], item[1] - milli)
    devs.sort()
    return (sig[0], tuple(devs), sig[2] - cpu, sig[3] - mem)
