"""GPU fragmentation in the style of FGD (Weng et al., USENIX ATC'23), extended to CPU and memory.

A node's idle GPU capacity is *fragmented* with respect to a task type when that
task cannot use it. FGD asks whether *one* more task of the type fits; here the
question is how much of the idle capacity the type could use if it filled the
node with copies of itself: ``n`` copies fit, limited by the devices it accepts
(whole idle devices for a whole-device task, ``free // share`` slots per device
for a fractional one), by the node's free CPU and by its free memory, and the
fragmented amount is the idle capacity minus what those ``n`` copies would use.
So a CPU-heavy task on a CPU-poor node counts the GPUs it strands, not only the
GPUs it leaves once the node's CPU is gone; when CPU and memory are plentiful the
two measures agree for single-device whole tasks. (Task types built by
``TaskType.of`` leave memory out, as FGD does, so the mix has few, popular types;
memory then limits no copy count, though placement still checks it.)
On the Alibaba openb trace the fill count is what matters: its GPU-heavy nodes
have 12 cores per GPU, tasks asking for more strand GPUs long before a node's last
GPU is taken, and the one-step measure does not see it (saturation benchmark:
408 unallocated GPUs with the one-step measure, 288 with the fill count).

A node's fragmentation is the expectation over the workload's mix of task types;
the fragmentation-guided choice puts a task where that expectation grows least.

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


@dataclass(slots=True)
class _Group:
    """Task types that differ only in CPU and memory: their device slots are counted once."""

    devices: int
    milli: int
    ok: frozenset[int]
    members: list[tuple[int, int, float]]
    """(cpu, memory, weight) per type."""


class Workload:
    """The task-type mix the fragmentation measure is taken against (top ``limit`` types)."""

    def __init__(self, counts: Counter[TaskType], limit: int = 48) -> None:
        top = [(t, n) for t, n in counts.most_common(limit) if t.devices > 0]
        total = sum(n for _, n in top)
        self.types: list[tuple[TaskType, float]] = [(t, n / total) for t, n in top] if total else []
        self._match: list[frozenset[int]] = []
        self._groups: list[_Group] = []
        self._constrained = False
        self._unmatched = 0.0
        """Weight of the types no device class here accepts (all idle capacity is theirs to miss)."""
        self._cache: dict[Signature, float] = {}
        self._owner: tuple[int, int] = (-1, -1)
        """(index uid, device classes) the caches were computed for."""
        self._pressure: tuple[int, dict[int, float]] = (-1, {})

    @staticmethod
    def from_jobs(jobs: Iterable[Job], limit: int = 48) -> Workload:
        """The mix of task types among ``jobs`` (each task of a gang counts)."""
        c: Counter[TaskType] = Counter()
        for j in jobs:
            c[TaskType.of(j)] += j.tasks
        return Workload(c, limit)

    def _sync(self, index: CapacityIndex) -> None:
        """Recompute selector matches (and drop cached values) when the index or its classes change."""
        owner = (index.uid, len(index.class_keys))
        if owner == self._owner:
            return
        self._owner = owner
        self._cache.clear()
        self._pressure = (-1, {})
        self._match = [frozenset(index.matching_classes(t.selector)) for t, _ in self.types]
        every = frozenset(range(len(index.class_keys)))
        self._constrained = any(ok != every for ok in self._match)
        groups: dict[tuple[int, int, frozenset[int]], _Group] = {}
        for (t, w), ok in zip(self.types, self._match, strict=True):
            if not ok:
                continue  # matches no device here: every node is fully fragmented for it, alike
            key = (t.devices, t.milli, ok)
            g = groups.get(key)
            if g is None:
                g = groups[key] = _Group(t.devices, t.milli, ok, [])
            g.members.append((t.cpu, t.mem, w))
        self._groups = list(groups.values())
        self._unmatched = sum(w for (_t, w), ok in zip(self.types, self._match, strict=True) if not ok)

    def node_frag(self, index: CapacityIndex, sig: Signature) -> float:
        """Expected fragmented thousandths of a node in state ``sig``."""
        self._sync(index)
        hit = self._cache.get(sig)
        if hit is not None:
            return hit
        if len(self._cache) > 200_000:
            self._cache.clear()  # bounded memory on long runs; values are cheap to recompute
        _, devs, cpu, mem = sig
        total_free = 0
        for _c, f in devs:
            total_free += f
        if total_free == 0:
            self._cache[sig] = 0.0
            return 0.0
        frag = self._unmatched * total_free
        for g in self._groups:
            slots = _slots(devs, g.devices, g.milli, g.ok)
            use = g.milli * g.devices
            for tcpu, tmem, w in g.members:
                n = slots
                if n and tcpu > 0:
                    n = min(n, cpu // tcpu)
                if n and tmem > 0:
                    n = min(n, mem // tmem)
                frag += w * (total_free - n * use)
        self._cache[sig] = frag
        return frag

    def has_constraints(self, index: CapacityIndex) -> bool:
        """Whether some task type in the mix accepts only some of the index's device classes."""
        self._sync(index)
        return self._constrained

    def class_pressure(self, index: CapacityIndex) -> dict[int, float]:
        """Per device class, how much the mix relies on that class's idle devices.

        ``sum(w_t * idle_all / idle(t))`` over the task types ``t`` that accept the
        class, where ``idle(t)`` counts the wholly idle devices of every class ``t``
        accepts. A type that accepts any device adds the same to every class; a type
        confined to a few scarce classes adds much to those. Taking ``g`` thousandths
        from class ``c`` costs about ``g * pressure[c]`` of the mix's access to idle
        capacity, which is what the placement adds to the fragmentation growth so
        unconstrained work leaves scarce, demanded device types to the work that
        can only run there (a supply effect the per-node measure cannot see).
        Cached until the index changes.
        """
        self._sync(index)
        if self._pressure[0] == index.version:
            return self._pressure[1]
        free = index.class_free
        idle_all = sum(free.values())
        out: dict[int, float] = {c: 0.0 for c in range(len(index.class_keys))}
        for (_t, w), ok in zip(self.types, self._match, strict=True):
            if not ok:
                continue
            reach = sum(free.get(c, 0) for c in ok)
            share = w * idle_all / max(reach, 1)
            for c in ok:
                out[c] += share
        self._pressure = (index.version, out)
        return out

    def cluster_frag(self, index: CapacityIndex) -> float:
        """Expected fragmented GPUs over all schedulable nodes (in GPUs, not thousandths)."""
        total = 0.0
        for sig, names in index.sigs.items():
            total += self.node_frag(index, sig) * len(names)
        return total / WHOLE


def _slots(devs: tuple[tuple[int, int], ...], devices: int, milli: int, ok: frozenset[int]) -> int:
    """Copies of a task (``devices`` x ``milli``, on classes ``ok``) the idle devices alone can hold."""
    slots = 0
    if milli < WHOLE:
        for c, f in devs:
            if c in ok and f >= milli:
                slots += f // milli
        return slots
    for c, f in devs:
        if c in ok and f == WHOLE:
            slots += 1
    return slots // devices


def after_taking(sig: Signature, taken: list[tuple[int, int]], milli: int, cpu: int, mem: int) -> Signature:
    """The signature a node would have after a task takes ``milli`` of each (class, free) device."""
    devs = list(sig[1])
    for item in taken:
        i = devs.index(item)
        devs[i] = (item[0], item[1] - milli)
    devs.sort()
    return (sig[0], tuple(devs), sig[2] - cpu, sig[3] - mem)
