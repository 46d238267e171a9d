"""Property tests for fragmentation-guided placement with a workload mix.

The accord policy scores single tasks by the growth of the fill-based fragmentation
measure plus the supply pressure of device classes; whatever the mix says, a
placement must still never overcommit a device, CPU or memory, never split a gang,
honour selectors and required topology, leave the index unchanged while searching,
and be a function of its inputs (the same history gives the same placements).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.services.scheduling.fragmentation import Workload
from accord.services.scheduling.model import WHOLE, Job, Node
from accord.services.scheduling.placement import Policy, place
from accord.services.scheduling.scheduler import CycleConfig, run_cycle
from accord.services.scheduling.selectors import compile_selector
from accord.services.scheduling.state import SchedulerStateMachine
from tests.scheduling.helpers import check_invariants, clusters, counter, jobs, register_all

Made = list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]]


def _run(nodes: list[Node], batch: list[Job], mix: list[Job], finish: list[int]) -> Made:
    """Submit ``batch``, run cycles (finishing some jobs between them); the placements made."""
    sm = SchedulerStateMachine()
    register_all(sm, nodes)
    nid = counter()
    for j in batch:
        assert sm.apply({"id": nid(), "op": "submit_job", "job": j.to_wire(), "now": 0.0})["ok"]
    policy = Policy("accord")
    policy.set_workload(Workload.from_jobs(mix))
    cfg = CycleConfig(policy, expected_finish=True)
    made: Made = []
    for step, x in enumerate(finish):
        now = float(step + 1)
        before = sm.snapshot()
        res = run_cycle(sm.index, sm.pending_jobs(), sm.running_view(), now, cfg)
        assert sm.snapshot() == before, "run_cycle changed the replica"
        out = sm.apply({"id": nid(), "op": "place_jobs", "now": now,
                        "placements": [p.to_wire() for p in res.placements],
                        "preemptions": res.preemptions})
        assert out["ok"] and not out["rejected"], out
        made.extend((p.job_id, tuple((t.node, t.devices) for t in p.tasks)) for p in res.placements)
        check_invariants(sm)
        if sm.running:
            jid = sorted(sm.running)[x % len(sm.running)]
            assert sm.apply({"id": nid(), "op": "job_finished", "job_id": jid, "now": now})["ok"]
    return made


@settings(deadline=None, max_examples=40)
@given(nodes=clusters(max_nodes=8), batch=jobs(count=10), mix=jobs(prefix="m", count=8),
       finish=st.lists(st.integers(0, 100), min_size=2, max_size=6))
def test_scored_placement_keeps_invariants_and_is_deterministic(
        nodes: list[Node], batch: list[Job], mix: list[Job], finish: list[int]) -> None:
    first = _run(nodes, batch, mix, finish)
    assert _run(nodes, batch, mix, finish) == first, "same history, different placements"


@settings(deadline=None, max_examples=40)
@given(nodes=clusters(max_nodes=6), batch=jobs(count=8), mix=jobs(prefix="m", count=8))
def test_single_place_with_workload_fits_and_is_pure(nodes: list[Node], batch: list[Job],
                                                     mix: list[Job]) -> None:
    sm = SchedulerStateMachine()
    register_all(sm, nodes)
    policy = Policy("accord")
    policy.set_workload(Workload.from_jobs(mix))
    for j in batch:
        before = sm.snapshot()
        p = place(sm.index, j, policy)
        assert sm.snapshot() == before, "place changed the index"
        if p is None:
            continue
        assert len(p.tasks) == j.tasks, "gang split"
        pred = compile_selector(j.selector)
        for t in p.tasks:
            nc = sm.index.nodes[t.node]
            assert nc.schedulable
            assert len(set(t.devices)) == len(t.devices) == j.devices_per_task
            for i in t.devices:
                pos = nc.pos_of[i]
                assert pred(nc.node.devices[pos].attrs()), "selector violated"
                assert nc.free[pos] >= j.gpu_milli, "device overcommitted"
                if j.gpu_milli == WHOLE:
                    assert nc.free[pos] == WHOLE
        per_node: dict[str, int] = {}
        for t in p.tasks:
            per_node[t.node] = per_node.get(t.node, 0) + 1
        for name, n in per_node.items():
            nc = sm.index.nodes[name]
            assert nc.free_cpu >= n * j.cpu_milli and nc.free_mem >= n * j.memory_mib, "cpu/mem"
        # Commit it so later jobs see a partly used cluster.
        out = sm.apply({"id": f"p-{j.id}", "op": "submit_job", "job": j.to_wire(), "now": 0.0})
        assert out["ok"]
        out = sm.apply({"id": f"q-{j.id}", "op": "place_jobs", "now": 0.0,
                        "placements": [p.to_wire()], "preemptions": []})
        assert out["ok"] and not out["rejected"], out
        check_invariants(sm)
