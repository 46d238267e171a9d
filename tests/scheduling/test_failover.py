"""Leader failover mid-cycle: no placement is lost or duplicated, and replay is deterministic.

The scheduling shard's log is modelled as a list of committed commands. Leader A
computes a cycle and commits only some of its chunks before it dies; one more
chunk may be in flight and be retried later under its original id (or never
arrive); some committed commands are retried (duplicates). Leader B replays the
log, computes its own cycle from that state and commits it. Every replica that
replays the final log reaches the same state, and that state is sound.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.services.scheduling.model import Job, Node
from accord.services.scheduling.placement import Policy
from accord.services.scheduling.scheduler import CycleConfig, run_cycle
from accord.services.scheduling.state import RUNNING, SchedulerStateMachine
from tests.scheduling.helpers import check_invariants, clusters, jobs


def _replay(log: list[dict[str, Any]]) -> tuple[SchedulerStateMachine, list[dict[str, Any]]]:
    sm = SchedulerStateMachine()
    results = [sm.apply(msgpack.packb(cmd)) for cmd in log]  # through the wire encoding
    return sm, results


def _cycle_chunks(sm: SchedulerStateMachine, leader: str, now: float, chunk: int) -> list[dict[str, Any]]:
    res = run_cycle(sm.index, sm.pending_jobs(), sm.running_view(), now, CycleConfig(Policy("accord")))
    cmds = []
    ps = [p.to_wire() for p in res.placements]
    for i in range(0, max(len(ps), 1), chunk):
        cmds.append({"id": f"{leader}-place-{i}", "op": "place_jobs", "now": now,
                     "placements": ps[i:i + chunk], "preemptions": res.preemptions if i == 0 else []})
    return cmds


@settings(deadline=None)
@given(nodes=clusters(max_nodes=8), first=jobs("a", 10), second=jobs("b", 6), data=st.data())
def test_leader_failover_mid_cycle(nodes: list[Node], first: list[Job], second: list[Job],
                                   data: st.DataObject) -> None:
    log: list[dict[str, Any]] = [
        {"id": f"reg-{n.name}", "op": "register_node", "node": n.to_wire(), "now": 0.0} for n in nodes
    ]
    log += [{"id": f"sub-{j.id}", "op": "submit_job", "job": j.to_wire(), "now": 0.0} for j in first]
    chunk = data.draw(st.integers(1, 3), label="chunk")

    # Leader A: a replica of the log so far; decides; commits a prefix of its chunks; dies.
    a, _ = _replay(log)
    a_cmds = _cycle_chunks(a, "A", 1.0, chunk)
    committed = data.draw(st.integers(0, len(a_cmds)), label="committed")
    log += a_cmds[:committed]
    in_flight = a_cmds[committed] if committed < len(a_cmds) else None
    # Client retries of already committed commands (same ids).
    for cmd in data.draw(st.lists(st.sampled_from(log), max_size=3), label="retries"):
        log.append(dict(cmd))
    log += [{"id": f"sub-{j.id}", "op": "submit_job", "job": j.to_wire(), "now": 2.0} for j in second]
    if in_flight is not None and data.draw(st.booleans(), label="in-flight lands before B"):
        log.append(in_flight)

    # Leader B: replays the committed log, decides from that state, commits everything.
    b, _ = _replay(log)
    check_invariants(b)
    log += _cycle_chunks(b, "B", 3.0, chunk)
    if in_flight is not None and data.draw(st.booleans(), label="stale A chunk retried late"):
        log.append(dict(in_flight))

    final, results = _replay(log)
    check_invariants(final)
    # Deterministic: a second replica replaying the same log is byte-identical.
    again, _ = _replay(log)
    assert again.snapshot() == final.snapshot()
    # Snapshot/restore round trip.
    restored = SchedulerStateMachine()
    restored.restore(final.snapshot())
    assert restored.snapshot() == final.snapshot()
    check_invariants(restored)

    # Nothing lost: every submitted job exists, is pending or running.
    submitted = {j.id for j in first} | {j.id for j in second}
    assert set(final.jobs) == submitted
    assert all(final.jobs[j].status in ("pending", RUNNING) for j in submitted)
    # Nothing duplicated: a job accepted by a committed command is accepted exactly once
    # (no preemption requeues here unless the command preempted it), and it is running.
    accepted: dict[str, int] = {}
    preempted: set[str] = set()
    for cmd, res in zip(log, results, strict=True):
        if cmd["op"] == "place_jobs" and not res.get("duplicate"):
            for jid in res["accepted"]:
                accepted[jid] = accepted.get(jid, 0) + 1
            preempted |= set(res["preempted"])
    for jid, n in accepted.items():
        assert n == 1 or jid in preempted, f"{jid} placed {n} times"
        if jid not in preempted:
            assert final.jobs[jid].status == RUNNING, f"{jid} accepted but not running"
    # Every job that is running was accepted by some committed command.
    assert {j for j in submitted if final.jobs[j].status == RUNNING} <= set(accepted)


def test_retried_command_is_not_applied_twice() -> None:
    sm = SchedulerStateMachine()
    from accord.services.scheduling.topology import make_node

    sm.apply({"id": "r", "op": "register_node", "node": make_node("n0").to_wire()})
    sm.apply({"id": "s", "op": "submit_job", "job": Job("j", devices_per_task=8).to_wire()})
    cmd = {"id": "p1", "op": "place_jobs", "now": 1.0,
           "placements": [{"job": "j", "tasks": [["n0", list(range(8))]]}], "preemptions": []}
    first = sm.apply(cmd)
    assert first["accepted"] == ["j"]
    snap = sm.snapshot()
    again = sm.apply(cmd)
    assert again["duplicate"] and again["accepted"] == ["j"]
    assert sm.snapshot() == snap
    # The same decision under a new id is stale: the job is no longer pending.
    stale = sm.apply({**cmd, "id": "p2"})
    assert stale["accepted"] == [] and "not pending" in stale["rejected"]["j"]


async def test_service_leader_dies_between_chunks() -> None:
    import pytest

    from accord.services.scheduling.service import SchedulingService
    from accord.services.scheduling.topology import make_cluster

    log: list[bytes] = []
    leader_a = SchedulerStateMachine()
    budget = {"left": 100}

    async def propose_a(cmd: dict[str, Any]) -> dict[str, Any]:
        if budget["left"] == 0:
            raise ConnectionError("leader lost its term")
        budget["left"] -= 1
        data = msgpack.packb(cmd)
        log.append(data)
        return leader_a.apply(data)

    svc_a = SchedulingService(leader_a, propose_a, clock=lambda: 1.0, chunk=1, origin="A")
    for n in make_cluster(5):  # 40 GPUs for 3 x 8 + 3 x 4
        await svc_a.register_node(n)
    for i in range(6):
        await svc_a.submit_job(Job(f"j{i}", devices_per_task=4 if i % 2 else 8))
    budget["left"] = 2  # two chunks commit, then A is deposed
    with pytest.raises(ConnectionError):
        await svc_a.run_cycle()
    leader_b, _ = _replay([msgpack.unpackb(d) for d in log])

    async def propose_b(cmd: dict[str, Any]) -> dict[str, Any]:
        data = msgpack.packb(cmd)
        log.append(data)
        return leader_b.apply(data)

    svc_b = SchedulingService(leader_b, propose_b, clock=lambda: 2.0, chunk=1, origin="B")
    out = await svc_b.run_cycle()
    assert not out["rejected"]
    assert sum(r.status == RUNNING for r in leader_b.jobs.values()) == 6
    check_invariants(leader_b)
    final, _ = _replay([msgpack.unpackb(d) for d in log])
    assert final.snapshot() == leader_b.snapshot()
