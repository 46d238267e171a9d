"""Placement: given free capacity and a job, where its gang goes (or None).

Pure with respect to its inputs: ``place`` may tentatively take capacity while it
searches, but always gives it back, and returns a ``Placement`` for the caller to
commit with ``take``. A gang is placed all or nothing.

Policies:

- ``accord``: topology first (a gang goes to the narrowest domain that holds it:
  one node, one leaf switch, one spine, one block, in that order; inside a node
  one island, then one PCIe switch, then one NUMA node), then best fit among
  domains and nodes so whole islands and nodes stay free, and for single tasks
  the node whose expected fragmentation grows least (FGD-style, counting the
  GPUs each task type would strand for lack of CPU or memory, see
  ``fragmentation.py``), plus, when the workload has device-type constraints,
  the supply pressure of the device class taken, so unconstrained work leaves
  scarce types to the work that can only run there. Ties go to the fullest node
  and device (best fit). CPU-only tasks go where they strand the fewest GPUs.
- ``best-fit``: the same without the fragmentation measure.
- ``first-fit``: the first node in registration order with room; lowest devices.
- ``random``: a random node with room (seeded), topology-oblivious.

A required topology level is always honoured by every policy.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from accord.services.scheduling.capacity import CapacityIndex, NodeCap, Signature
from accord.services.scheduling.fragmentation import Workload, after_taking
from accord.services.scheduling.model import WHOLE, Job, Placement, TaskPlacement
from accord.services.scheduling.topology import choose_devices

POLICIES = ("accord", "best-fit", "first-fit", "random")
_GANG_LEVELS = ("node", "leaf", "spine", "block", None)


@dataclass(slots=True)
class Policy:
    """How to choose among feasible places."""

    name: str = "accord"
    workload: Workload | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    max_domains: int = 16
    """Domains tried per level before giving up on that level (bounds cycle latency)."""
    memo: dict[tuple[Any, ...], dict[int, Any]] = field(default_factory=dict)
    """Per task shape, per node-signature number: scores; cleared when the workload changes."""
    memo_owner: int = -1
    """``uid`` of the index whose signature numbers ``memo`` uses."""

    def set_workload(self, workload: Workload | None) -> None:
        """Use a new task-type mix for the fragmentation measure."""
        self.workload = workload
        self.memo.clear()

    def memo_for(self, index: CapacityIndex, shape: tuple[Any, ...]) -> dict[int, Any]:
        """The score memo of one task shape on ``index`` (bounded; reset for another index)."""
        if self.memo_owner != index.uid or len(self.memo) > 4096:
            self.memo.clear()
            self.memo_owner = index.uid
        per = self.memo.get(shape)
        if per is None or len(per) > 100_000:
            per = self.memo[shape] = {}
        return per

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown placement policy {self.name!r}; choose from {POLICIES}")


def take(index: CapacityIndex, job: Job, placement: Placement) -> None:
    """Commit a placement's capacity; raises ``SchedulingError`` and takes nothing if any is not free."""
    done: list[TaskPlacement] = []
    try:
        for t in placement.tasks:
            index.allocate(t.node, t.devices, job.gpu_milli, job.cpu_milli, job.memory_mib)
            done.append(t)
    except Exception:
        for t in done:
            index.release(t.node, t.devices, job.gpu_milli, job.cpu_milli, job.memory_mib)
        raise


def give_back(index: CapacityIndex, job: Job, placement: Placement) -> None:
    """Release a placement's capacity."""
    for t in placement.tasks:
        index.release(t.node, t.devices, job.gpu_milli, job.cpu_milli, job.memory_mib)


def place(index: CapacityIndex, job: Job, policy: Policy, keep: bool = False) -> Placement | None:
    """Where ``job`` fits now under ``policy``, or None.

    ``index`` is left unchanged, unless ``keep``: then a placement found is also
    taken (saves a second pass over the gang's nodes when the caller commits it).
    """
    releases = index.releases
    flag = _Keep() if keep else None
    try:
        p = _place(index, job, policy, flag)
        if flag is not None and p is not None and not flag.kept:
            take(index, job, p)
        return p
    finally:
        index.releases = releases  # tentative give-backs are not real releases


class _Keep:
    """Asks a gang search to leave a successful placement taken, and says whether it did."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept = False


def _place(index: CapacityIndex, job: Job, policy: Policy, keep: _Keep | None) -> Placement | None:
    if job.devices_per_task == 0:
        taken: list[TaskPlacement] = []
        try:
            for _ in range(job.tasks):
                nc = _cpu_only(index, job, policy)
                if nc is None:
                    return None
                _take_task(index, job, nc, [], taken)
            return Placement(job.id, tuple(taken))
        finally:
            _undo(index, job, taken)
    classes = index.matching_classes(job.selector)
    if not classes:
        return None
    if job.gpu_milli == WHOLE:
        need = job.tasks * job.devices_per_task
        classes = tuple(c for c in classes if index.class_free.get(c, 0) >= need)
        if not classes:
            return None
    level = job.topology.level
    if job.tasks == 1 and level != "island":
        return _single(index, job, classes, policy)
    return _gang(index, job, classes, policy, keep)


# ----- one node's fit ----------------------------------------------------------


def _devices_on(nc: NodeCap, job: Job, cls: int, policy: Policy, island: int | None) -> list[int] | None:
    """Device positions for one task of ``job`` on ``nc`` from class ``cls``, or None."""
    if nc.free_cpu < job.cpu_milli or nc.free_mem < job.memory_mib:
        return None
    devs = nc.node.devices
    if job.gpu_milli < WHOLE:
        cand = [p for p, c in enumerate(nc.cls) if c == cls and nc.free[p] >= job.gpu_milli
                and (island is None or devs[p].island == island)]
        if not cand:
            return None
        if policy.name == "random":
            return [policy.rng.choice(cand)]
        if policy.name == "first-fit":
            return [cand[0]]
        return [min(cand, key=lambda p: (nc.free[p], p))]
    k = job.devices_per_task
    if nc.whole_free(cls) < k:
        return None
    free = [p for p in nc.free_positions(cls) if island is None or devs[p].island == island]
    if len(free) < k:
        return None
    if policy.name == "first-fit":
        return free[:k]
    if policy.name == "random":
        return sorted(policy.rng.sample(free, k))
    return choose_devices(devs, free, k)


def _to_indices(nc: NodeCap, positions: Iterable[int]) -> tuple[int, ...]:
    return tuple(nc.node.devices[p].index for p in positions)


# ----- single task ---------------------------------------------------------------


def _single(index: CapacityIndex, job: Job, classes: tuple[int, ...], policy: Policy) -> Placement | None:
    nc_pos: tuple[NodeCap, list[int]] | None
    if policy.name == "first-fit":
        nc_pos = _first_fit(index.nodes.values(), job, classes, policy)
    elif policy.name == "random":
        nc_pos = _random_fit(index.nodes.values(), job, classes, policy)
    else:
        nc_pos = _scored_single(index, job, classes, policy)
    if nc_pos is None:
        return None
    nc, pos = nc_pos
    return Placement(job.id, (TaskPlacement(0, nc.node.name, _to_indices(nc, pos)),))


def _first_fit(nodes: Iterable[NodeCap], job: Job, classes: tuple[int, ...], policy: Policy
               ) -> tuple[NodeCap, list[int]] | None:
    for nc in nodes:
        if not nc.schedulable:
            continue
        for c in classes:
            pos = _devices_on(nc, job, c, policy, None)
            if pos is not None:
                return nc, pos
    return None


def _random_fit(nodes: Iterable[NodeCap], job: Job, classes: tuple[int, ...], policy: Policy
                ) -> tuple[NodeCap, list[int]] | None:
    fits = []
    for nc in nodes:
        if not nc.schedulable or nc.free_cpu < job.cpu_milli or nc.free_mem < job.memory_mib:
            continue
        for c in classes:
            if _quick_fit(nc, job, c):
                fits.append((nc, c))
                break
    if not fits:
        return None
    nc, c = policy.rng.choice(fits)
    pos = _devices_on(nc, job, c, policy, None)
    return None if pos is None else (nc, pos)


def _quick_fit(nc: NodeCap, job: Job, c: int) -> bool:
    if job.gpu_milli == WHOLE:
        return nc.whole_free(c) >= job.devices_per_task
    return any(cc == c and f >= job.gpu_milli for cc, f in zip(nc.cls, nc.free, strict=True))


def _scored_single(index: CapacityIndex, job: Job, classes: tuple[int, ...], policy: Policy
                   ) -> tuple[NodeCap, list[int]] | None:
    """Best fit guided by fragmentation, one evaluation per node signature (memoized).

    The key per option is (fragmentation growth + supply pressure of its device
    class, idle capacity left on the node, free share of the device): least
    fragmentation first, then best fit. Pressure only differs between options
    when the workload has device-type constraints (see ``Workload.class_pressure``).
    """
    wl = policy.workload if policy.name == "accord" else None
    shape = (job.devices_per_task, job.gpu_milli, job.cpu_milli, job.memory_mib, classes)
    memo = policy.memo_for(index, shape)
    pressure: dict[int, float] | None = None
    take_milli = job.devices_per_task * job.gpu_milli
    if wl is not None and len(classes) > 1 and wl.has_constraints(index):
        pressure = wl.class_pressure(index)
    best: tuple[float, int, int] | None = None
    best_pick: tuple[str, int, int] | None = None
    sig_of = index.sig_of
    for sid, names in index.groups.items():
        ev = memo.get(sid, _MISS)
        if ev is _MISS:
            ev = memo[sid] = _evaluate(index, sig_of[sid], job, classes, wl)
        if ev is None:
            continue
        for delta, free_total, c, f in ev:
            if pressure is not None:
                delta = round(delta + take_milli * pressure[c], 6)
            k = (delta, free_total, f)
            if best is None or k < best:
                best = k
                best_pick = (next(iter(names)), c, f)
    if best_pick is None:
        return None
    name, c, f = best_pick
    nc = index.nodes[name]
    if job.gpu_milli == WHOLE:
        pos = _devices_on(nc, job, c, policy, None)
    else:
        cand = [p for p, cc in enumerate(nc.cls) if cc == c and nc.free[p] == f]
        ok = cand and nc.free_cpu >= job.cpu_milli and nc.free_mem >= job.memory_mib
        pos = cand[:1] if ok else None
    return None if pos is None else (nc, pos)


_MISS = object()


def _evaluate(index: CapacityIndex, sig: Signature, job: Job, classes: tuple[int, ...],
              wl: Workload | None) -> list[tuple[float, int, int, int]] | None:
    """The ways to put one task of ``job`` on a node in state ``sig``: (growth, idle left, class, share).

    One entry per device class (its best share choice), or None if the task does not fit.
    """
    _, devs, cpu, mem = sig
    if cpu < job.cpu_milli or mem < job.memory_mib:
        return None
    k = job.devices_per_task
    milli = job.gpu_milli
    cls_set = set(classes)
    if milli == WHOLE:
        counts: dict[int, int] = {}
        for c, f in devs:
            if f == WHOLE and c in cls_set:
                counts[c] = counts.get(c, 0) + 1
        options = [(c, WHOLE) for c, n in sorted(counts.items()) if n >= k]
    else:
        options = sorted({(c, f) for c, f in devs if c in cls_set and f >= milli})
    if not options:
        return None
    before = wl.node_frag(index, sig) if wl is not None else 0.0
    free_total = sum(f for _, f in devs)
    best: dict[int, tuple[float, int, int, int]] = {}
    for c, f in options:
        delta = 0.0
        if wl is not None:
            after = after_taking(sig, [(c, f)] * k, milli, job.cpu_milli, job.memory_mib)
            delta = wl.node_frag(index, after) - before
        # Least fragmentation growth; then best fit: least left on the node, fullest device.
        entry = (round(delta, 6), free_total, c, f)
        cur = best.get(c)
        if cur is None or (entry[0], entry[1], entry[3]) < (cur[0], cur[1], cur[3]):
            best[c] = entry
    return [best[c] for c in sorted(best)]


def _cpu_only(index: CapacityIndex, job: Job, policy: Policy) -> NodeCap | None:
    """A node for a task that needs no devices."""
    def fits(nc: NodeCap) -> bool:
        return nc.schedulable and nc.free_cpu >= job.cpu_milli and nc.free_mem >= job.memory_mib

    if policy.name == "first-fit":
        return next((nc for nc in index.nodes.values() if fits(nc)), None)
    if policy.name == "random":
        fits_l = [nc for nc in index.nodes.values() if fits(nc)]
        return policy.rng.choice(fits_l) if fits_l else None
    wl = policy.workload if policy.name == "accord" else None
    memo = policy.memo_for(index, ("cpu-only", job.cpu_milli, job.memory_mib))
    best: tuple[float, int, int] | None = None
    pick: str | None = None
    sig_of = index.sig_of
    for sid, names in index.groups.items():
        key = memo.get(sid, _MISS)
        if key is _MISS:
            sig = sig_of[sid]
            key = None
            if sig[2] >= job.cpu_milli and sig[3] >= job.memory_mib:
                delta = 0.0
                if wl is not None:
                    after = (sig[0], sig[1], sig[2] - job.cpu_milli, sig[3] - job.memory_mib)
                    delta = wl.node_frag(index, after) - wl.node_frag(index, sig)
                # Ties: the node with the least idle GPU capacity (CPU-only nodes first), then least CPU.
                key = (round(delta, 6), sum(f for _, f in sig[1]), sig[2])
            memo[sid] = key
        if key is not None and (best is None or key < best):
            best, pick = key, next(iter(names))
    return None if pick is None else index.nodes[pick]


# ----- gangs ---------------------------------------------------------------------


def _gang(index: CapacityIndex, job: Job, classes: tuple[int, ...], policy: Policy,
          keep: _Keep | None) -> Placement | None:
    topo = job.topology
    scored = policy.name in ("accord", "best-fit")
    if topo.level is not None and topo.required:
        # Required: the named domain, or (topology-aware policies) anything narrower first.
        all_levels = ("island", *_GANG_LEVELS)
        upto = all_levels[: all_levels.index(topo.level) + 1]
        levels: tuple[str | None, ...] = (
            upto if scored and topo.level != "island" else (topo.level,))
        if topo.level != "island":
            levels = tuple(lv for lv in levels if lv != "island")
    elif scored:
        levels = ("island", *_GANG_LEVELS) if topo.level == "island" else _GANG_LEVELS
    else:
        levels = (None,)
    if policy.name in ("accord", "best-fit"):
        # Best fit across device types: the type with the least idle capacity that can hold it.
        classes = tuple(sorted(classes, key=lambda c: (index.class_free.get(c, 0), c)))
    for cls in classes:
        for level in levels:
            for domain in _domains(index, job, cls, level, policy):
                got = _fill(index, job, cls, level, domain, policy, keep)
                if got is not None:
                    return got
    return None


def _domains(index: CapacityIndex, job: Job, cls: int, level: str | None, policy: Policy) -> list[str]:
    """Candidate domains at ``level`` that have enough idle devices, best fit first."""
    need = job.tasks * job.devices_per_task if job.gpu_milli == WHOLE else 0
    if level is None:
        return [""]
    if level in ("node", "island"):
        out: list[str] = []
        for k, bucket in sorted(index.buckets.get(cls, {}).items()):
            if k < max(need, 1):
                continue
            for name in bucket:
                out.append(name)
                if len(out) >= policy.max_domains:
                    return out
        return out
    cands = [(free, dom) for (c, lv, dom), free in index.domain_free.items()
             if c == cls and lv == level and free >= max(need, 1)]
    if policy.name == "random":
        policy.rng.shuffle(cands)
    else:
        cands.sort()
    return [dom for _, dom in cands[: policy.max_domains]]


def _fill(index: CapacityIndex, job: Job, cls: int, level: str | None, domain: str, policy: Policy,
          keep: _Keep | None = None) -> Placement | None:
    """Place every task inside one domain, tentatively; give it all back unless ``keep`` and it fit."""
    taken: list[TaskPlacement] = []

    def done() -> Placement:
        p = Placement(job.id, tuple(taken))
        if keep is not None:
            taken.clear()  # leave the capacity taken for the caller
            keep.kept = True
        return p

    try:
        if level in ("node", "island"):
            nc = index.nodes[domain]
            islands = [None] if level == "node" else sorted({d.island for d in nc.node.devices})
            for isl in islands:
                got = _fill_nodes(index, job, cls, [nc], policy, taken, isl)
                if got:
                    return done()
                _undo(index, job, taken)
            return None
        if policy.name in ("accord", "best-fit") and job.gpu_milli == WHOLE:
            leaves = index.leaves_of(level or "", domain)
            leaves.sort(key=lambda lf: -index.domain_free.get((cls, "leaf", lf), 0))
            for leaf in leaves:
                while len(taken) < job.tasks:
                    bf = _best_fit_in_leaf(index, job, cls, leaf)
                    if bf is None:
                        break
                    nc = bf
                    pos = _devices_on(nc, job, cls, policy, None)
                    if pos is None:
                        break
                    _take_task(index, job, nc, pos, taken)
                if len(taken) == job.tasks:
                    return done()
            return None
        nodes = list(index.nodes_in(level or "", domain))
        if _fill_nodes(index, job, cls, nodes, policy, taken, None):
            return done()
        return None
    finally:
        _undo(index, job, taken)


def _best_fit_in_leaf(index: CapacityIndex, job: Job, cls: int, leaf: str) -> NodeCap | None:
    buckets = index.leaf_buckets.get((cls, leaf))
    if not buckets:
        return None
    for k in sorted(buckets):
        if k < job.devices_per_task:
            continue
        for name in buckets[k]:
            nc = index.nodes[name]
            if nc.free_cpu >= job.cpu_milli and nc.free_mem >= job.memory_mib:
                return nc
    return None


def _fill_nodes(index: CapacityIndex, job: Job, cls: int, nodes: list[NodeCap], policy: Policy,
                taken: list[TaskPlacement], island: int | None) -> bool:
    """Place the remaining tasks on ``nodes`` (first-fit order, or random for ``random``)."""
    order = [nc for nc in nodes if nc.schedulable]
    if policy.name == "random":
        policy.rng.shuffle(order)
    for nc in order:
        while len(taken) < job.tasks:
            pos = _devices_on(nc, job, cls, policy, island)
            if pos is None:
                break
            _take_task(index, job, nc, pos, taken)
        if len(taken) == job.tasks:
            return True
    return False


def _take_task(index: CapacityIndex, job: Job, nc: NodeCap, pos: list[int], taken: list[TaskPlacement]) -> None:
    idx = _to_indices(nc, pos)
    index.allocate(nc.node.name, idx, job.gpu_milli, job.cpu_milli, job.memory_mib)
    taken.append(TaskPlacement(len(taken), nc.node.name, idx))


def _undo(index: CapacityIndex, job: Job, taken: list[TaskPlacement]) -> None:
    for t in taken:
        index.release(t.node, t.devices, job.gpu_milli, job.cpu_milli, job.memory_mib)
    taken.clear()
