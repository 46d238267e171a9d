"""Task state in the replicated state machine: attempts, exits, failures, held jobs."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from accord.services.scheduling.model import Job, SchedulingError
from accord.services.scheduling.service import SchedulingService
from accord.services.scheduling.state import SchedulerStateMachine
from accord.services.scheduling.topology import make_node
from tests.scheduling.helpers import check_invariants


def _service() -> tuple[SchedulingService, SchedulerStateMachine, list[float]]:
    sm = SchedulerStateMachine()

    async def propose(cmd: dict[str, Any]) -> dict[str, Any]:
        return sm.apply(msgpack.packb(cmd))

    clock = [100.0]
    return SchedulingService(sm, propose, clock=lambda: clock[0]), sm, clock


async def _placed(svc: SchedulingService, job: Job) -> None:
    await svc.submit_job(job)
    out = await svc.run_cycle()
    assert out["accepted"] == [job.id]


async def test_every_task_exiting_0_succeeds_and_frees_the_devices() -> None:
    svc, sm, clock = _service()
    for n in ("a", "b"):
        await svc.register_node(make_node(n, gpus=2), agent=f"{n}:7000")
    await _placed(svc, Job("j", tasks=2, devices_per_task=2, command=("python", "train.py")))
    r = sm.jobs["j"]
    assert [(t.rank, t.node, t.state) for t in r.tasks] == [(0, "a", "placed"), (1, "b", "placed")]
    await svc.task_status("j", 0, 1, "a", "running")
    clock[0] = 105.0
    await svc.task_status("j", 1, 1, "b", "running")
    clock[0] = 110.0
    await svc.task_status("j", 0, 1, "a", "exited", 0)
    assert r.status == "running"  # rank 1 still runs
    clock[0] = 111.0
    await svc.task_status("j", 1, 1, "b", "exited", 0)
    assert (r.status, r.end_time) == ("succeeded", 111.0)
    assert [(t.start_time, t.end_time, t.exit_code) for t in r.tasks] == [
        (100.0, 110.0, 0), (105.0, 111.0, 0)]
    assert sm.index.total_devices == 4 and not sm.running
    assert sm.nodes["a"].agent == "a:7000"
    check_invariants(sm)
    # Snapshots carry the tasks and the agent endpoints.
    other = SchedulerStateMachine()
    other.restore(sm.snapshot())
    assert other.jobs["j"].tasks == r.tasks and other.nodes["b"].agent == "b:7000"


async def test_failures_requeue_until_max_restarts_then_hold() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("a", gpus=1))
    await _placed(svc, Job("j", devices_per_task=1, max_restarts=1, command=("x",)))
    await svc.task_status("j", 0, 1, "a", "exited", 2)
    r = sm.jobs["j"]
    assert (r.status, r.failures, r.requeues) == ("pending", 1, 1)
    assert "rank 0 exited with 2" in r.reason
    # A late report about attempt 1 is refused: it may not touch attempt 2.
    await svc.run_cycle()
    assert r.starts == 2
    with pytest.raises(SchedulingError, match="attempt 1 is not running"):
        await svc.task_status("j", 0, 1, "a", "running")
    await svc.task_status("j", 0, 2, "a", "exited", -9)
    assert (r.status, r.failures) == ("held", 2)
    assert "more than its max_restarts 1" in r.reason
    assert not sm.pending and not sm.running
    # Nothing places it again; cancel ends it.
    assert (await svc.run_cycle())["accepted"] == []
    await svc.cancel_job("j")
    assert r.status == "cancelled"


async def test_a_job_held_for_failing_is_released_with_its_failures_counted_again() -> None:
    """Slurm's ``scontrol release``: once its cause is fixed, a job held after too many
    failures goes back to the queue with ``max_restarts`` failures to spend again."""
    svc, sm, _ = _service()
    await svc.register_node(make_node("a", gpus=1))
    await _placed(svc, Job("j", devices_per_task=1, max_restarts=0, command=("x",)))
    await svc.task_status("j", 0, 1, "a", "exited", 2)
    r = sm.jobs["j"]
    assert r.status == "failed"  # max_restarts 0: failed, not held, and never released
    with pytest.raises(SchedulingError, match="only a held job can be released"):
        await svc.release_job("j")
    await _placed(svc, Job("h", devices_per_task=1, max_restarts=1, command=("x",)))
    await svc.task_status("h", 0, 1, "a", "exited", 2)
    await svc.run_cycle()
    await svc.task_status("h", 0, 2, "a", "exited", 2)
    r = sm.jobs["h"]
    assert (r.status, r.failures, r.starts) == ("held", 2, 2) and r.end_time is not None
    other = SchedulerStateMachine()  # a snapshot keeps it held
    other.restore(sm.snapshot())
    assert other.jobs["h"].status == "held"
    await svc.release_job("h")
    assert (r.status, r.failures, r.end_time, r.reason) == ("pending", 0, None, "released")
    assert (await svc.run_cycle())["accepted"] == ["h"]
    assert r.starts == 3
    await svc.task_status("h", 0, 3, "a", "exited", 2)  # one failure of the new budget
    assert (r.status, r.failures) == ("pending", 1)
    check_invariants(sm)


async def test_an_operator_holds_a_pending_job_and_releases_it() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("a", gpus=1))
    await _placed(svc, Job("first", devices_per_task=1, command=("x",)))
    await svc.submit_job(Job("second", devices_per_task=1, command=("x",)))
    await svc.submit_job(Job("third", devices_per_task=1, command=("x",)))
    await svc.hold_job("second")
    assert (sm.jobs["second"].status, list(sm.pending)) == ("held", ["third"])
    with pytest.raises(SchedulingError, match="running: only a pending job can be held"):
        await svc.hold_job("first")
    with pytest.raises(SchedulingError, match="held: only a pending job can be held"):
        await svc.hold_job("second")
    with pytest.raises(SchedulingError, match="does not exist"):
        await svc.hold_job("ghost")
    await svc.task_status("first", 0, 1, "a", "exited", 0)
    assert (await svc.run_cycle())["accepted"] == ["third"]  # the held one is passed over
    await svc.task_status("third", 0, 1, "a", "exited", 0)
    assert (await svc.run_cycle())["accepted"] == []
    await svc.release_job("second")
    assert (await svc.run_cycle())["accepted"] == ["second"]
    with pytest.raises(SchedulingError, match="running: only a held job can be released"):
        await svc.release_job("second")
    await svc.submit_job(Job("fourth", devices_per_task=1, command=("x",)))
    await svc.hold_job("fourth")
    await svc.cancel_job("fourth")  # a held job can be cancelled
    assert sm.jobs["fourth"].status == "cancelled"
    check_invariants(sm)


async def test_max_restarts_0_fails_and_a_lost_task_or_preemption_is_not_a_failure() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("a", gpus=2))
    await _placed(svc, Job("once", devices_per_task=1, max_restarts=0, command=("x",)))
    await svc.task_status("once", 0, 1, "a", "lost", reason="agent restarted")
    r = sm.jobs["once"]
    assert (r.status, r.failures, r.requeues) == ("pending", 0, 1)
    await svc.run_cycle()
    await svc.task_status("once", 0, 2, "a", "exited", 1)
    assert r.status == "failed"
    # A node death is a failure.
    await _placed(svc, Job("n", devices_per_task=1, max_restarts=0, command=("x",)))
    await svc.task_status("n", 0, 1, "a", "running")
    out = await svc.node_dead("a")
    assert out["ended"] == ["n"] and sm.jobs["n"].status == "failed"
    assert sm.jobs["n"].tasks[0].state == "lost"


async def test_exit_after_cancel_is_recorded_and_changes_nothing_else() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("a", gpus=1))
    await _placed(svc, Job("c", devices_per_task=1, command=("sleep", "60")))
    await svc.task_status("c", 0, 1, "a", "running")
    await svc.cancel_job("c")
    await svc.task_status("c", 0, 1, "a", "exited", -15)
    r = sm.jobs["c"]
    assert r.status == "cancelled" and (r.tasks[0].state, r.tasks[0].exit_code) == ("exited", -15)
    with pytest.raises(SchedulingError, match="is not running"):
        await svc.task_status("c", 0, 1, "a", "running")


async def test_bad_reports_are_refused_and_change_nothing() -> None:
    svc, sm, _ = _service()
    await svc.register_node(make_node("a", gpus=1))
    await _placed(svc, Job("j", devices_per_task=1, command=("x",)))
    before = sm.snapshot()
    cases = [
        (dict(job_id="nope", rank=0, attempt=1, node="a", state="running"), "does not exist"),
        (dict(job_id="j", rank=3, attempt=1, node="a", state="running"), "no rank 3"),
        (dict(job_id="j", rank=0, attempt=1, node="b", state="running"), "runs on a"),
        (dict(job_id="j", rank=0, attempt=1, node="a", state="exited"), "int 'exit_code'"),
        (dict(job_id="j", rank=0, attempt=1, node="a", state="dancing"), "a 'state' of"),
        (dict(job_id="j", rank="0", attempt=1, node="a", state="running"), "int 'attempt'"),
    ]
    for i, (fields, msg) in enumerate(cases):
        out = sm.apply({"id": f"bad-{i}", "op": "task_status", "now": 1.0, **fields})
        assert out["ok"] is False and msg in out["error"], (fields, out)
    with pytest.raises(SchedulingError, match="not one of running, exited, lost"):
        await svc.task_status("j", 0, 1, "a", "paused")
    after = sm.snapshot()
    assert msgpack.unpackb(after)["jobs"] == msgpack.unpackb(before)["jobs"]


@pytest.mark.parametrize("field,value,msg", [
    ("command", ["ok", 3], "command must be"),
    ("command", [""], "program is empty"),
    ("grace", -1, "grace must be in"),
    ("grace", 1e9, "grace must be in"),
    ("max_restarts", -1, "max_restarts must be in"),
    ("workdir", "a\0b", "workdir is not"),
])
def test_job_fields_are_validated(field: str, value: object, msg: str) -> None:
    wire = Job("j").to_wire()
    wire[field] = value
    with pytest.raises(SchedulingError, match=msg):
        Job.from_wire(wire)
    # Old records without the new fields still decode, with the defaults.
    old = {k: v for k, v in Job("j").to_wire().items()
           if k not in ("command", "workdir", "grace", "max_restarts")}
    j = Job.from_wire(old)
    assert (j.command, j.workdir, j.grace, j.max_restarts) == ((), "", 10.0, 3)
