"""Trace-driven simulation of the scheduler, with pluggable policies and baselines.

Everything goes through the real code: nodes are registered, jobs submitted,
decisions computed by ``scheduler.run_cycle`` and committed as ``place_jobs``
commands to a ``SchedulerStateMachine``, exactly as the shard leader does. Only
time is simulated.

Two experiments:

- ``replay``: jobs arrive at their (optionally compressed) trace times and run
  for their durations; measures allocation, idle GPUs while jobs wait,
  fragmentation, queueing delay, job completion time and per-cycle latency.
- ``saturate``: the FGD-paper experiment. Jobs arrive one after another and never
  leave; each is placed at once or dropped; the arrived demand grows past the
  cluster's capacity (resampling the trace when it runs out) and the unallocated
  GPUs are recorded at given arrived-demand levels.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from accord.services.scheduling.fragmentation import TaskType, Workload
from accord.services.scheduling.model import Job, Node
from accord.services.scheduling.placement import Policy, place
from accord.services.scheduling.scheduler import CycleConfig, run_cycle
from accord.services.scheduling.state import SchedulerStateMachine
from accord.services.scheduling.traces import TraceJob

POLICY_NAMES = ("accord", "fifo-first-fit", "fifo-backfill", "random", "best-fit")
WORKLOAD_REFRESH = 250
"""Arrivals between refreshes of the task-type mix the fragmentation measure uses."""


def named_config(name: str, seed: int = 0) -> CycleConfig:
    """The cycle configuration of a named policy or baseline."""
    if name == "accord":
        return CycleConfig(Policy("accord"), fair_share=True, expected_finish=True, backfill=True,
                           preemption=True)
    if name == "best-fit":
        return CycleConfig(Policy("best-fit"), fair_share=False, backfill=True, preemption=False)
    if name == "fifo-first-fit":
        return CycleConfig(Policy("first-fit"), fair_share=False, backfill=False,
                           strict_order=True, preemption=False)
    if name == "fifo-backfill":
        return CycleConfig(Policy("first-fit"), fair_share=False, backfill=True, preemption=False)
    if name == "random":
        return CycleConfig(Policy("random", rng=random.Random(seed)), fair_share=False,
                           backfill=False, strict_order=True, preemption=False)
    raise ValueError(f"unknown policy {name!r}; choose from {POLICY_NAMES}")


def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class _Cluster:
    """A state machine fed with commands, with command ids counted."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.sm = SchedulerStateMachine()
        self.seq = 0
        for n in nodes:
            self.cmd("register_node", node=n.to_wire(), now=0.0)
        self.total_gpus = self.sm.index.total_devices

    def cmd(self, op: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        out = self.sm.apply({"id": f"sim-{self.seq}", "op": op, **fields})
        if not out.get("ok"):
            raise RuntimeError(f"simulator command {op} failed: {out.get('error')}")
        return out


def _task_type(j: Job) -> TaskType:
    return TaskType.of(j)


@dataclass(slots=True)
class ReplayResult:
    """Figures of one replay."""

    policy: str
    jobs: int
    finished: int
    unplaced: int
    allocation_rate: float
    idle_while_waiting: float
    fragmentation: float
    queue_delay_mean: float
    queue_delay_p99: float
    jct_mean: float
    jct_p99: float
    cycle_ms_mean: float
    cycle_ms_p99: float
    cycle_ms_max: float
    cycles: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {k: getattr(self, k) for k in self.__slots__}


def replay(nodes: Sequence[Node], jobs: Sequence[TraceJob], policy: str, *, time_scale: float = 1.0,
           cycle_interval: float = 10.0, seed: int = 0, horizon: float | None = None) -> ReplayResult:
    """Replay ``jobs`` on ``nodes`` under ``policy``; arrivals are divided by ``time_scale``."""
    wall0 = time.perf_counter()
    cl = _Cluster(nodes)
    cfg = named_config(policy, seed)
    types: Counter[TaskType] = Counter()
    events: list[tuple[float, int, int, str]] = []  # (time, kind 0=finish 1=arrival 2=tick, seq, job)
    by_id = {}
    for i, tj in enumerate(jobs):
        j = replace(tj.job, submit_time=tj.arrival / time_scale)
        by_id[j.id] = (j, tj.duration)
        heapq.heappush(events, (j.submit_time, 1, i, j.id))
    gen: dict[str, int] = {}
    starts: dict[str, float] = {}
    first_start: dict[str, float] = {}
    finish: dict[str, float] = {}
    allocated = 0.0
    area_alloc = 0.0
    area_idle_wait = 0.0
    frag_samples: list[float] = []
    last_t = 0.0
    t0 = events[0][0] if events else 0.0
    t_last_arrival = max((e[0] for e in events), default=0.0)
    last_t = t0
    next_cycle = t0
    tick_pending = False
    arrivals = 0
    lat: list[float] = []
    seq = len(jobs)
    while events:
        t = events[0][0]
        if horizon is not None and t > t0 + horizon:
            break
        waiting = bool(cl.sm.pending)
        if t <= t_last_arrival:
            # Utilisation is measured while jobs keep arriving, not over the drain tail.
            area_alloc += allocated * (t - last_t)
            if waiting:
                area_idle_wait += (cl.total_gpus - allocated) * (t - last_t)
            last_t = t
        while events and events[0][0] == t:
            _, kind, _, jid = heapq.heappop(events)
            if kind == 0:
                g, _, jid2 = jid.partition("#")
                if cl.sm.jobs[jid2].status == "running" and gen.get(jid2) == int(g):
                    cl.cmd("job_finished", job_id=jid2, now=t)
                    allocated -= cl.sm.jobs[jid2].job.gpus
                    finish[jid2] = t
            elif kind == 1:
                j = by_id[jid][0]
                cl.cmd("submit_job", job=j.to_wire(), now=t)
                types[_task_type(j)] += 1
                arrivals += 1
                if cfg.policy.name == "accord" and (arrivals == 1 or arrivals % WORKLOAD_REFRESH == 0):
                    cfg.policy.set_workload(Workload(types))
            else:
                tick_pending = False
        if not cl.sm.pending:
            continue
        if t < next_cycle:
            if not tick_pending:
                seq += 1
                heapq.heappush(events, (next_cycle, 2, seq, ""))
                tick_pending = True
            continue
        next_cycle = t + cycle_interval
        c0 = time.perf_counter()
        res = run_cycle(cl.sm.index, cl.sm.pending_jobs(), cl.sm.running_view(), t, cfg,
                        cl.sm.queues, cl.sm.tenant_weights)
        lat.append((time.perf_counter() - c0) * 1000)
        if not res.placements and not res.preemptions:
            continue
        out = cl.cmd("place_jobs", placements=[p.to_wire() for p in res.placements],
                     preemptions=res.preemptions, now=t)
        for vid in out["preempted"]:
            allocated -= cl.sm.jobs[vid].job.gpus
        for jid in out["accepted"]:
            j, dur = by_id[jid]
            allocated += j.gpus
            gen[jid] = gen.get(jid, 0) + 1
            starts[jid] = t
            first_start.setdefault(jid, t)
            if dur is not None:
                seq += 1
                heapq.heappush(events, (t + dur, 0, seq, f"{gen[jid]}#{jid}"))
        if cfg.policy.workload is not None and len(lat) % 50 == 1:
            frag_samples.append(cfg.policy.workload.cluster_frag(cl.sm.index))
        elif len(lat) % 50 == 1:
            frag_samples.append(Workload(types).cluster_frag(cl.sm.index))
    span = max(last_t - t0, 1e-9)
    qd = [first_start[j] - by_id[j][0].submit_time for j in first_start]
    jct = [finish[j] - by_id[j][0].submit_time for j in finish]
    return ReplayResult(
        policy=policy, jobs=len(jobs), finished=len(finish), unplaced=len(jobs) - len(first_start),
        allocation_rate=area_alloc / span / max(cl.total_gpus, 1),
        idle_while_waiting=area_idle_wait / span,
        fragmentation=sum(frag_samples) / len(frag_samples) if frag_samples else 0.0,
        queue_delay_mean=sum(qd) / len(qd) if qd else 0.0, queue_delay_p99=_pct(qd, 0.99),
        jct_mean=sum(jct) / len(jct) if jct else 0.0, jct_p99=_pct(jct, 0.99),
        cycle_ms_mean=sum(lat) / len(lat) if lat else 0.0, cycle_ms_p99=_pct(lat, 0.99),
        cycle_ms_max=max(lat) if lat else 0.0, cycles=len(lat),
        wall_s=time.perf_counter() - wall0,
    )


@dataclass(slots=True)
class SaturationResult:
    """Unallocated GPUs at each arrived-demand level."""

    policy: str
    total_gpus: int
    levels: list[float] = field(default_factory=list)
    allocated: list[float] = field(default_factory=list)
    unallocated: list[float] = field(default_factory=list)
    fragmented: list[float] = field(default_factory=list)
    failed_jobs: int = 0
    place_ms_mean: float = 0.0
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {k: getattr(self, k) for k in self.__slots__}


def saturate(nodes: Sequence[Node], jobs: Sequence[TraceJob], policy: str,
             levels: Sequence[float] = (0.9, 1.0, 1.1, 1.2), seed: int = 0) -> SaturationResult:
    """Arrive jobs (then resampled ones) until demand passes ``max(levels)`` x capacity; nothing leaves."""
    wall0 = time.perf_counter()
    cl = _Cluster(nodes)
    cfg = named_config(policy, seed)
    rng = random.Random(seed)
    types: Counter[TaskType] = Counter()
    out = SaturationResult(policy, cl.total_gpus)
    arrived = 0.0
    allocated = 0.0
    want = sorted(levels)
    i = 0
    place_s = 0.0
    n = 0
    gpu_jobs = [tj.job for tj in jobs]
    measure = Workload.from_jobs(gpu_jobs)
    while want:
        base = gpu_jobs[i] if i < len(gpu_jobs) else rng.choice(gpu_jobs)
        job = replace(base, id=f"s{i}")
        i += 1
        types[_task_type(job)] += 1
        if cfg.policy.name == "accord" and (i == 1 or i % WORKLOAD_REFRESH == 0):
            cfg.policy.set_workload(Workload(types))
        cl.cmd("submit_job", job=job.to_wire(), now=float(i))
        arrived += job.gpus
        c0 = time.perf_counter()
        p = place(cl.sm.index, job, cfg.policy)
        place_s += time.perf_counter() - c0
        n += 1
        if p is not None:
            res = cl.cmd("place_jobs", placements=[p.to_wire()], preemptions=[], now=float(i))
            if res["accepted"]:
                allocated += job.gpus
        else:
            out.failed_jobs += 1
            cl.cmd("cancel_job", job_id=job.id, now=float(i))
        while want and arrived >= want[0] * cl.total_gpus:
            out.levels.append(want.pop(0))
            out.allocated.append(round(allocated, 3))
            out.unallocated.append(round(cl.total_gpus - allocated, 3))
            out.fragmented.append(round(measure.cluster_frag(cl.sm.index), 3))
    out.place_ms_mean = place_s * 1000 / max(n, 1)
    out.wall_s = time.perf_counter() - wall0
    return out


def scale_for_load(jobs: Sequence[TraceJob], total_gpus: int, load: float) -> float:
    """The arrival compression giving an offered load of ``load`` x capacity over the arrival window.

    Work is counted only inside the (compressed) window, so a few jobs far longer
    than the window do not make a light trace look heavy. Found by bisection.
    """
    timed = [tj for tj in jobs if tj.duration is not None]
    if len(timed) < 2 or total_gpus <= 0:
        return 1.0
    span = max(tj.arrival for tj in timed) - min(tj.arrival for tj in timed)
    if span <= 0:
        return 1.0

    def offered(scale: float) -> float:
        window = span / scale
        work = sum(tj.job.gpus * min(tj.duration or 0.0, window) for tj in timed)
        return work / (window * total_gpus)

    lo, hi = 1.0, 1e7
    if offered(hi) < load:
        return hi
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if offered(mid) < load:
            lo = mid
        else:
            hi = mid
    return hi
