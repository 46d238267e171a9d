"""The replicated state machine and the service functions around it."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from accord.services.scheduling.launch import task_launches
from accord.services.scheduling.model import Job, SchedulingError, Topology
from accord.services.scheduling.placement import Policy
from accord.services.scheduling.queueing import QueueConfig
from accord.services.scheduling.scheduler import CycleConfig
from accord.services.scheduling.service import SchedulingService
from accord.services.scheduling.state import SchedulerStateMachine
from accord.services.scheduling.topology import make_cluster, make_node
from tests.scheduling.helpers import check_invariants


def _service(nodes: int = 2, **kw: Any) -> tuple[SchedulingService, SchedulerStateMachine, list[float]]:
    sm = SchedulerStateMachine()
    log: list[bytes] = []

    async def propose(cmd: dict[str, Any]) -> dict[str, Any]:
        data = msgpack.packb(cmd)
        log.append(data)
        return sm.apply(data)

    clock = [0.0]
    svc = SchedulingService(sm, propose, clock=lambda: clock[0], **kw)
    svc.log = log  # type: ignore[attr-defined]
    return svc, sm, clock


async def _with_nodes(svc: SchedulingService, n: int, **kw: Any) -> None:
    for node in make_cluster(n, nodes_per_leaf=2, **kw):
        await svc.register_node(node)


async def test_submit_place_launch_finish() -> None:
    svc, sm, clock = _service()
    await _with_nodes(svc, 2)
    await svc.submit_job(Job("train", tasks=2, devices_per_task=8, selector="vendor == nvidia"))
    out = await svc.run_cycle()
    assert out["accepted"] == ["train"]
    launches = svc.launch_info("train")
    assert [tl.rank for tl in launches] == [0, 1]
    assert {tl.host for tl in launches} == {"node-00000", "node-00001"}
    for tl in launches:
        assert tl.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert tl.env["MASTER_ADDR"] == launches[0].address
        assert tl.env["WORLD_SIZE"] == "16" and tl.env["NODE_RANK"] == str(tl.rank)
        assert f"--node-rank={tl.rank}" in tl.argv
    clock[0] = 10.0
    await svc.job_finished("train")
    assert svc.get_job("train")["status"] == "succeeded"  # type: ignore[index]
    check_invariants(sm)


def test_vendor_visibility_and_affinity() -> None:
    amd = make_node("amd0", vendor="amd", gpus=8, numa_nodes=2)
    intel = make_node("xe0", vendor="intel", gpus=4, islands=2, numa_nodes=2)
    nodes = {n.name: n for n in (amd, intel)}
    from accord.services.scheduling.model import Placement, TaskPlacement

    la = task_launches(Job("a", devices_per_task=2), Placement("a", (TaskPlacement(0, "amd0", (4, 5)),)),
                       nodes, 29500)[0]
    assert la.env["ROCR_VISIBLE_DEVICES"] == "4,5" and "HIP_VISIBLE_DEVICES" not in la.env
    assert la.numa_nodes == (1,) and la.cpus == "56-111"
    li = task_launches(Job("i", devices_per_task=1), Placement("i", (TaskPlacement(0, "xe0", (0,)),)),
                       nodes, 29501)[0]
    assert li.env["ZE_AFFINITY_MASK"] == "0" and li.env["MASTER_PORT"] == "29501"
    frac = task_launches(Job("f", gpu_milli=250), Placement("f", (TaskPlacement(0, "amd0", (0,)),)),
                         nodes, 29502)[0]
    assert frac.env["ACCORD_GPU_FRACTION"] == "0.250"


async def test_fractional_jobs_share_a_device() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("n0", gpus=1))
    for i in range(3):
        await svc.submit_job(Job(f"f{i}", gpu_milli=400))
    out = await svc.run_cycle()
    assert sorted(out["accepted"]) == ["f0", "f1"]
    assert sm.index.nodes["n0"].free == [200]
    check_invariants(sm)


async def test_node_dead_requeues_and_drain_blocks() -> None:
    svc, sm, _ = _service()
    await _with_nodes(svc, 2)
    await svc.submit_job(Job("big", tasks=2, devices_per_task=8))
    await svc.run_cycle()
    out = await svc.node_dead("node-00001")
    assert out["requeued"] == ["big"]
    assert svc.get_job("big")["status"] == "pending"  # type: ignore[index]
    assert (await svc.run_cycle())["accepted"] == []  # only one node left
    await svc.drain("node-00000")
    await svc.submit_job(Job("small", devices_per_task=1))
    assert (await svc.run_cycle())["accepted"] == []
    with pytest.raises(SchedulingError, match="dead"):
        await svc.heartbeat("node-00001")
    await svc.register_node(sm.nodes["node-00001"].node)
    await svc.undrain("node-00000")
    assert sorted((await svc.run_cycle())["accepted"]) == ["big"]
    check_invariants(sm)


async def test_failed_device_requeues_its_job_only() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("n0", gpus=8))
    await svc.submit_job(Job("a", devices_per_task=4))
    await svc.submit_job(Job("b", devices_per_task=4))
    await svc.run_cycle()
    dev_a = sm.jobs["a"].placement.tasks[0].devices[0]  # type: ignore[union-attr]
    out = await svc.heartbeat("n0", unhealthy=[dev_a])
    assert out["requeued"] == ["a"]
    assert sm.jobs["b"].status == "running"
    assert (await svc.run_cycle())["accepted"] == []  # 3 healthy idle devices < 4
    await svc.heartbeat("n0", unhealthy=[])
    assert (await svc.run_cycle())["accepted"] == ["a"]
    check_invariants(sm)


async def test_bad_input_is_refused_and_changes_nothing() -> None:
    svc, sm, _ = _service()
    await _with_nodes(svc, 1)
    before = sm.snapshot()
    bad_jobs: list[dict[str, Any]] = [
        {"id": "x", "tasks": 0}, {"id": "x", "gpu_milli": 1500}, {"id": "x", "selector": "vendor =="},
        {"id": "bad id!"}, {"id": "x", "devices_per_task": 2, "gpu_milli": 500},
        {"id": "x", "topology": ["rack", True]}, {"id": "x", "estimated_runtime": -1},
    ]
    for bad in bad_jobs:
        with pytest.raises(SchedulingError):
            await svc.submit_job(bad)
    with pytest.raises(SchedulingError):
        await svc.register_node({"name": "n", "cpu_milli": 1, "memory_mib": 1,
                                 "devices": [{"index": 0, "vendor": "acme", "model": "x", "memory": 1}]})
    with pytest.raises(SchedulingError):
        await svc.cancel_job("nope")
    assert not sm.jobs, "no refused job was created"
    fresh = SchedulerStateMachine()
    fresh.restore(before)
    assert not fresh.jobs and len(fresh.nodes) == len(sm.nodes)
    # Straight to the state machine: malformed commands get an error result, no state change.
    snap = sm.snapshot()
    for cmd in [b"\xc1garbage", {"op": "drain"}, {"id": "q1", "op": "nope"},
                {"id": "q2", "op": "place_jobs", "placements": "x"},
                {"id": "q3", "op": "heartbeat", "node": "node-00000", "unhealthy": [99]},
                {"id": "q4", "op": "submit_job", "job": {"id": "j", "tasks": "2"}}]:
        res = sm.apply(cmd)  # type: ignore[arg-type]
        assert res["ok"] is False and res["error"]
    restored = SchedulerStateMachine()
    restored.restore(snap)
    assert [r.to_wire() for r in restored.jobs.values()] == [r.to_wire() for r in sm.jobs.values()]
    assert restored.index.totals() == sm.index.totals()


async def test_place_jobs_revalidates_stale_decisions() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("n0", gpus=8))
    await svc.submit_job(Job("a", devices_per_task=8))
    await svc.submit_job(Job("b", devices_per_task=8))
    decision = {"job": "b", "tasks": [["n0", list(range(8))]]}
    r1 = sm.apply({"id": "x1", "op": "place_jobs", "placements": [{"job": "a", "tasks": [["n0", list(range(8))]]}]})
    assert r1["accepted"] == ["a"]
    r2 = sm.apply({"id": "x2", "op": "place_jobs", "placements": [decision]})
    assert r2["accepted"] == [] and "not free" in r2["rejected"]["b"]
    r3 = sm.apply({"id": "x3", "op": "place_jobs", "placements": [{"job": "b", "tasks": [["n0", [0, 0, 1, 2, 3, 4, 5, 6]]]}]})
    assert r3["accepted"] == []
    check_invariants(sm)


async def test_required_topology_and_selector_checked_on_apply() -> None:
    svc, sm, _ = _service()
    await _with_nodes(svc, 4)  # leaves of 2 nodes
    await svc.submit_job(Job("g", tasks=2, devices_per_task=8, topology=Topology("leaf", True)))
    cross = {"job": "g", "tasks": [["node-00001", list(range(8))], ["node-00002", list(range(8))]]}
    res = sm.apply({"id": "t1", "op": "place_jobs", "placements": [cross]})
    assert "more than one leaf" in res["rejected"]["g"]
    await svc.submit_job(Job("amd", selector="vendor == amd"))
    res = sm.apply({"id": "t2", "op": "place_jobs", "placements": [{"job": "amd", "tasks": [["node-00000", [0]]]}]})
    assert "selector" in res["rejected"]["amd"]
    out = await svc.run_cycle()
    assert out["accepted"] == ["g"]
    assert len({t.node for t in sm.jobs["g"].placement.tasks}) == 2  # type: ignore[union-attr]
    check_invariants(sm)


async def test_priority_preemption_prefers_checkpointed_victims() -> None:
    svc, sm, clock = _service(cycle=CycleConfig(Policy("accord")))
    await svc.register_node(make_node("n0", gpus=8))
    for name in ("low1", "low2"):
        await svc.submit_job(Job(name, devices_per_task=4, preemptible=True, priority=0))
    await svc.run_cycle()
    clock[0] = 5.0
    await svc.checkpoint_committed("low2")
    await svc.submit_job(Job("urgent", devices_per_task=4, priority=5))
    out = await svc.run_cycle()
    assert out["preempted"] == ["low2"] and out["accepted"] == ["urgent"]
    assert sm.jobs["low2"].status == "pending" and sm.jobs["low2"].requeues == 1
    assert sm.jobs["low1"].status == "running"
    check_invariants(sm)


async def test_non_preemptible_and_equal_priority_are_safe() -> None:
    svc, _sm, _ = _service()
    await svc.register_node(make_node("n0", gpus=8))
    await svc.submit_job(Job("pinned", devices_per_task=8, priority=0, preemptible=False))
    await svc.run_cycle()
    await svc.submit_job(Job("urgent", devices_per_task=8, priority=9))
    out = await svc.run_cycle()
    assert out["preempted"] == [] and out["accepted"] == []


async def test_quota_with_borrowing_and_reclaim() -> None:
    svc, sm, _ = _service()
    await _with_nodes(svc, 2)
    await svc.set_queue(QueueConfig("research", nominal_gpus=8, borrowing_limit=8))
    await svc.set_queue(QueueConfig("prod", nominal_gpus=8, borrowing_limit=0))
    for i in range(3):
        await svc.submit_job(Job(f"r{i}", queue="research", tenant="r", devices_per_task=8, preemptible=True))
    out = await svc.run_cycle()
    assert sorted(out["accepted"]) == ["r0", "r1"], "borrowed up to nominal + limit, not beyond"
    await svc.submit_job(Job("p0", queue="prod", tenant="p", devices_per_task=8))
    out = await svc.run_cycle()
    assert out["accepted"] == ["p0"] and len(out["preempted"]) == 1, "prod reclaims its quota"
    await svc.submit_job(Job("p1", queue="prod", tenant="p", devices_per_task=8))
    assert (await svc.run_cycle())["accepted"] == [], "prod may not borrow"
    check_invariants(sm)


async def test_fair_share_alternates_tenants() -> None:
    svc, _sm, _ = _service()
    await svc.register_node(make_node("n0", gpus=8))
    for i in range(6):
        await svc.submit_job(Job(f"a{i}", tenant="a", devices_per_task=1, submit_time=float(i + 1)))
    for i in range(2):
        await svc.submit_job(Job(f"b{i}", tenant="b", devices_per_task=1, submit_time=100.0 + i))
    await svc.set_tenant_weight("a", 1.0)
    res = svc.decide()
    order = [p.job_id for p in res.placements]
    assert set(order) >= {"b0", "b1"}, "the late tenant still gets its share"
    assert order.index("b0") < order.index("a3")


async def test_snapshot_restore_and_idempotent_retry() -> None:
    svc, sm, _ = _service()
    await _with_nodes(svc, 2)
    await svc.submit_job(Job("a", devices_per_task=4), request_id="req-1")
    again = await svc.submit_job(Job("a", devices_per_task=4), request_id="req-1")
    assert again["duplicate"]
    await svc.run_cycle()
    copy = SchedulerStateMachine()
    copy.restore(sm.snapshot())
    assert copy.snapshot() == sm.snapshot()
    check_invariants(copy)
    with pytest.raises(SchedulingError):
        copy.restore(b"not a snapshot")
    assert copy.snapshot() == sm.snapshot()
    # Replaying the whole log on a fresh replica gives the same state.
    replica = SchedulerStateMachine()
    for data in svc.log:  # type: ignore[attr-defined]
        replica.apply(data)
    assert replica.snapshot() == sm.snapshot()
