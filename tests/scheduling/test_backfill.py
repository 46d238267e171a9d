"""EASY backfill: with exact runtime estimates, backfilled jobs never delay the reserved job."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.services.scheduling.model import Job, Topology
from accord.services.scheduling.placement import Policy
from accord.services.scheduling.scheduler import CycleConfig, run_cycle
from accord.services.scheduling.state import SchedulerStateMachine
from accord.services.scheduling.topology import make_cluster
from tests.scheduling.helpers import check_invariants, counter, register_all


def _simulate(n_nodes: int, specs: list[tuple[int, int, int, bool]], policy: str
              ) -> tuple[dict[str, float], list[tuple[str, float]], SchedulerStateMachine]:
    """Run to completion; return start times and every (reserved job, shadow time) seen."""
    sm = SchedulerStateMachine()
    register_all(sm, make_cluster(n_nodes, gpus=8, nodes_per_leaf=2, leaves_per_spine=2))
    nid = counter()
    durations = {}
    for i, (tasks, dpt, dur, leaf) in enumerate(specs):
        job = Job(id=f"j{i:03d}", tasks=tasks, devices_per_task=dpt, estimated_runtime=float(dur),
                  topology=Topology("leaf", True) if leaf else Topology(), submit_time=float(i) * 1e-3)
        durations[job.id] = float(dur)
        assert sm.apply({"id": nid(), "op": "submit_job", "job": job.to_wire(), "now": 0.0})["ok"]
    cfg = CycleConfig(Policy(policy), fair_share=False, backfill=True, preemption=False)
    ends: list[tuple[float, str]] = []
    starts: dict[str, float] = {}
    reservations: list[tuple[str, float]] = []
    now = 0.0
    for _ in range(10 * len(specs) + 10):
        while ends and ends[0][0] <= now:
            _, jid = heapq.heappop(ends)
            assert sm.apply({"id": nid(), "op": "job_finished", "job_id": jid, "now": now})["ok"]
        res = run_cycle(sm.index, sm.pending_jobs(), sm.running_view(), now, cfg)
        if res.reservation is not None:
            reservations.append((res.reservation.job_id, res.reservation.start))
        out = sm.apply({"id": nid(), "op": "place_jobs", "now": now,
                        "placements": [p.to_wire() for p in res.placements], "preemptions": []})
        for jid in out["accepted"]:
            starts[jid] = now
            heapq.heappush(ends, (now + durations[jid], jid))
        check_invariants(sm)
        if not ends:
            break
        now = ends[0][0]
    return starts, reservations, sm


@settings(deadline=None)
@given(n_nodes=st.integers(2, 6),
       specs=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4, 8]), st.integers(1, 40),
                                st.booleans()), min_size=2, max_size=14),
       policy=st.sampled_from(["accord", "first-fit", "best-fit"]))
def test_backfill_never_delays_the_reserved_job(n_nodes: int, specs: list[tuple[int, int, int, bool]],
                                               policy: str) -> None:
    # Every job fits the empty cluster (leaf-bound gangs fit one leaf of 2 nodes).
    specs = [(min(t, 2) if leaf else t, d, dur, leaf) for t, d, dur, leaf in specs
             if t * d <= 8 * (2 if leaf else n_nodes)]
    starts, reservations, _sm = _simulate(n_nodes, specs, policy)
    assert len(starts) == len(specs), "every job eventually runs"
    for jid, shadow in reservations:
        assert starts[jid] <= shadow + 1e-9, f"{jid} reserved for {shadow} but started {starts[jid]}"


def test_backfill_fills_the_hole_with_a_short_job() -> None:
    # 2 nodes x 8: a 12-GPU job runs for 100; the 16-GPU head waits; a 4-GPU job of 50 fits the gap.
    specs = [(3, 4, 100, False), (2, 8, 10, False), (1, 4, 50, False), (1, 4, 500, False)]
    starts, reservations, _ = _simulate(2, specs, "accord")
    assert reservations and reservations[0] == ("j001", 100.0)
    assert starts["j002"] == 0.0, "short job backfilled"
    assert starts["j001"] == 100.0
    assert starts["j003"] >= 110.0, "a long job must not jump the reserved head"
