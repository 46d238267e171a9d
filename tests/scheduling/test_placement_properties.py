"""Property tests: whatever happens, no device is allocated twice, gangs are whole,
selectors and required topology are honoured, and drained or dead nodes get no new work."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.services.scheduling.model import Job, Node
from accord.services.scheduling.placement import Policy, place
from accord.services.scheduling.scheduler import CycleConfig, run_cycle
from accord.services.scheduling.state import SchedulerStateMachine
from tests.scheduling.helpers import check_invariants, clusters, counter, jobs, register_all

OPS = st.lists(st.tuples(st.sampled_from(["cycle", "finish", "dead", "drain", "undrain", "sick",
                                          "cancel", "register"]),
                         st.integers(0, 1000)), min_size=3, max_size=25)


@settings(deadline=None)
@given(nodes=clusters(), batch=jobs(), ops=OPS, policy=st.sampled_from(["accord", "best-fit",
                                                                          "first-fit", "random"]))
def test_invariants_hold_under_any_history(nodes: list[Node], batch: list[Job],
                                           ops: list[tuple[str, int]], policy: str) -> None:
    sm = SchedulerStateMachine()
    register_all(sm, nodes)
    nid = counter()
    for j in batch:
        assert sm.apply({"id": nid(), "op": "submit_job", "job": j.to_wire(), "now": 0.0})["ok"]
    cfg = CycleConfig(Policy(policy))
    now = 0.0
    blocked: set[str] = set()
    for op, x in ops:
        now += 1.0
        node = nodes[x % len(nodes)].name
        if op == "cycle":
            before = sm.snapshot()
            res = run_cycle(sm.index, sm.pending_jobs(), sm.running_view(), now, cfg)
            assert sm.snapshot() == before, "run_cycle changed the replica"
            for p in res.placements:
                assert not {t.node for t in p.tasks} & blocked, "placed on a drained or dead node"
            out = sm.apply({"id": nid(), "op": "place_jobs", "now": now,
                            "placements": [p.to_wire() for p in res.placements],
                            "preemptions": res.preemptions})
            assert out["ok"]
            assert not out["rejected"], out["rejected"]
        elif op == "finish" and sm.running:
            jid = list(sm.running)[x % len(sm.running)]
            assert sm.apply({"id": nid(), "op": "job_finished", "job_id": jid, "now": now})["ok"]
        elif op == "cancel" and sm.jobs:
            jid = list(sm.jobs)[x % len(sm.jobs)]
            sm.apply({"id": nid(), "op": "cancel_job", "job_id": jid, "now": now})
        elif op == "dead":
            on = [j for j in sm.running if any(t.node == node for t in sm.jobs[j].placement.tasks)]  # type: ignore[union-attr]
            out = sm.apply({"id": nid(), "op": "node_dead", "node": node, "now": now})
            assert sorted(out["requeued"]) == sorted(on)
            assert all(sm.jobs[j].status == "pending" for j in on)
            blocked.add(node)
        elif op == "drain":
            sm.apply({"id": nid(), "op": "drain", "node": node, "now": now})
            blocked.add(node)
        elif op == "undrain":
            sm.apply({"id": nid(), "op": "undrain", "node": node, "now": now})
            if sm.nodes[node].alive:
                blocked.discard(node)
        elif op == "register":
            out = sm.apply({"id": nid(), "op": "register_node", "node": sm.nodes[node].node.to_wire(),
                            "now": now})
            assert out["ok"]
            if not sm.nodes[node].drained:
                blocked.discard(node)
        elif op == "sick" and sm.nodes[node].alive:
            devs = [d.index for d in sm.nodes[node].node.devices]
            sm.apply({"id": nid(), "op": "heartbeat", "node": node, "now": now,
                      "unhealthy": devs[: x % 2 + (x % 3 == 0)]})
        check_invariants(sm)


@settings(deadline=None)
@given(nodes=clusters(max_nodes=6), batch=jobs(count=6))
def test_place_is_pure_and_all_or_nothing(nodes: list[Node], batch: list[Job]) -> None:
    sm = SchedulerStateMachine()
    register_all(sm, nodes)
    for policy in ("accord", "first-fit", "random", "best-fit"):
        for j in batch:
            before = sm.snapshot()
            sigs = {k: dict(v) for k, v in sm.index.sigs.items()}
            p = place(sm.index, j, Policy(policy))
            assert sm.snapshot() == before
            assert {k: dict(v) for k, v in sm.index.sigs.items()} == sigs
            if p is not None:
                assert len(p.tasks) == j.tasks
                assert all(len(t.devices) == j.devices_per_task for t in p.tasks)
