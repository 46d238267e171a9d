"""The scheduling shard's replicated state machine.

``apply(command) -> result`` over msgpack-encodable dict commands; ``snapshot()``
and ``restore()``. Every replica applying the same log reaches the same state:
apply never reads a clock (times come inside commands), never draws random
numbers, and iterates only insertion-ordered containers.

Decisions are computed by the leader (``scheduler.run_cycle``) and committed as
``place_jobs`` commands; apply re-validates every placement against the state at
that point of the log (job still pending, node alive and not drained, devices
free, selector and required topology honoured) and rejects, deterministically,
any that is stale. Every command carries an ``id``; a command applied again with
the same id (a client retry after a leader failover) returns the first result and
changes nothing. Together these make a leader crash mid-cycle harmless: nothing
is placed twice, and nothing pending is lost.

Commands (``op``): register_node, heartbeat, submit_job, cancel_job, hold_job,
release_job, place_jobs, job_finished, task_status, checkpoint, node_dead, drain, undrain,
set_queue, set_tenant.

Tasks: each placement is the job's ``starts``-th *attempt*; its tasks start as
``placed``, and the agents running them report (``task_status``) ``running`` and then
``exited`` with the exit code, or ``lost`` (the agent restarted and could not keep it).
A report for another attempt, or a ``running`` report for a job no longer running, is
refused (the agent then stops that task); an ``exited`` report for the last attempt of
a job that ended meanwhile (cancelled, failed) is recorded and changes nothing else, so
``jobs show`` tells how each stopped task ended. The job succeeds when every task exited 0; the first non-zero
exit is a *failure*, as are its node dying and one of its devices failing: a failure
requeues the job while ``failures <= max_restarts``, after that the job is ``held``
(``failed`` when ``max_restarts`` is 0) and stays put; devices are freed in every case.
A preemption or a lost task requeues without counting as a failure. As in Slurm, an
operator may hold a pending job (``hold_job``: out of the queue, nothing freed since
nothing was placed) and release a held one (``release_job``: back in the queue, its
failures counted from zero again, so a job held for failing gets ``max_restarts`` more
once its cause is fixed); a held job may also be cancelled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import Job, Node, Placement, Running, check_name
from accord.services.scheduling.placement import give_back, take
from accord.services.scheduling.queueing import QueueConfig
from accord.services.scheduling.selectors import compile_selector
from accord.services.scheduling.topology import domain_of

SNAPSHOT_VERSION = 1
MAX_REMEMBERED_COMMANDS = 100_000
PORT_BASE = 29500
PORT_RANGE = 1000
MAX_ORPHAN_TIMEOUT = 3600.0
"""The longest orphan timeout an agent may register (an hour)."""

PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = "pending", "running", "succeeded", "failed", "cancelled"
HELD = "held"
"""Out of the queue until released or cancelled: held by an operator while pending, or
failed more often than ``max_restarts`` allows."""
ENDED = (SUCCEEDED, FAILED, CANCELLED)
JOB_STATUSES = (PENDING, RUNNING, HELD, *ENDED)
TASK_STATES = ("placed", "running", "exited", "lost")


@dataclass(slots=True)
class TaskRecord:
    """One task of a job's current (or last) attempt, as its agent reported it."""

    rank: int
    node: str
    state: str = "placed"
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    """``-N``: killed by signal N."""
    reason: str = ""

    def to_wire(self) -> list[Any]:
        """Encode compactly (a job holds one per task)."""
        return [self.rank, self.node, self.state, self.start_time, self.end_time,
                self.exit_code, self.reason]

    @staticmethod
    def from_wire(d: list[Any]) -> TaskRecord:
        """Decode a snapshot entry."""
        return TaskRecord(*d)


@dataclass(slots=True)
class NodeStatus:
    """A registered node and what membership and operators say about it."""

    node: Node
    alive: bool = True
    drained: bool = False
    last_heartbeat: float = 0.0
    unhealthy: list[int] = field(default_factory=list)
    agent: str = ""
    """``host:port`` of the node agent's own service (task logs), as it registered."""
    orphan_timeout: float | None = None
    """Seconds of failed heartbeats after which the node's agent stops its tasks by
    itself, as it registered (None: no agent said so, e.g. a node registered by hand,
    whose death is declared as soon as it is suspected): the scheduler
    declares the node dead no sooner than this (and its jobs' stop grace) after its
    last heartbeat, so a job requeued elsewhere never runs beside its tasks there."""

    def to_wire(self) -> dict[str, Any]:
        """Encode as a msgpack-friendly dict."""
        return {"node": self.node.to_wire(), "alive": self.alive, "drained": self.drained,
                "last_heartbeat": self.last_heartbeat, "unhealthy": list(self.unhealthy),
                "agent": self.agent, "orphan_timeout": self.orphan_timeout}


@dataclass(slots=True)
class JobRecord:
    """A job and its life so far."""

    job: Job
    status: str = PENDING
    placement: Placement | None = None
    start_time: float | None = None
    end_time: float | None = None
    last_checkpoint: float | None = None
    master_port: int | None = None
    starts: int = 0
    requeues: int = 0
    reason: str = ""
    failures: int = 0
    """Failures so far (see the module docstring); past ``max_restarts`` the job is held."""
    tasks: list[TaskRecord] = field(default_factory=list)
    """The tasks of attempt ``starts`` (kept after the job ends, for ``jobs show``)."""

    def to_wire(self) -> dict[str, Any]:
        """Encode as a msgpack-friendly dict (also the ``get_job`` answer)."""
        return {
            "job": self.job.to_wire(), "status": self.status,
            "placement": self.placement.to_wire() if self.placement else None,
            "start_time": self.start_time, "end_time": self.end_time,
            "last_checkpoint": self.last_checkpoint, "master_port": self.master_port,
            "starts": self.starts, "requeues": self.requeues, "reason": self.reason,
            "failures": self.failures, "tasks": [t.to_wire() for t in self.tasks],
        }

    @staticmethod
    def from_wire(d: dict[str, Any]) -> JobRecord:
        """Decode a snapshot entry."""
        return JobRecord(
            job=Job.from_wire(d["job"]), status=d["status"],
            placement=Placement.from_wire(d["placement"]) if d["placement"] else None,
            start_time=d["start_time"], end_time=d["end_time"],
            last_checkpoint=d["last_checkpoint"], master_port=d["master_port"],
            starts=d["starts"], requeues=d["requeues"], reason=d["reason"],
            failures=d.get("failures", 0),
            tasks=[TaskRecord.from_wire(t) for t in d.get("tasks", [])],
        )


def _err(msg: str) -> dict[str, Any]:
    return {"ok": False, "error": msg}


class SchedulerStateMachine:
    """Nodes, jobs, queues and free capacity of one scheduling shard."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeStatus] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.queues: dict[str, QueueConfig] = {}
        self.tenant_weights: dict[str, float] = {}
        self.index = CapacityIndex()
        self.clock = 0.0
        self.applied: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.ports: dict[str, set[int]] = {}
        self.pending: dict[str, None] = {}
        self.running: dict[str, None] = {}
        self._ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "register_node": self._register_node, "heartbeat": self._heartbeat,
            "submit_job": self._submit_job, "cancel_job": self._cancel_job,
            "hold_job": self._hold_job, "release_job": self._release_job,
            "place_jobs": self._place_jobs, "job_finished": self._job_finished,
            "task_status": self._task_status,
            "checkpoint": self._checkpoint, "node_dead": self._node_dead,
            "drain": self._drain, "undrain": self._undrain, "set_queue": self._set_queue,
            "set_tenant": self._set_tenant,
        }

    # ----- the state-machine interface ---------------------------------------

    def apply(self, command: dict[str, Any] | bytes) -> dict[str, Any]:
        """Apply one committed command; bad commands get ``{"ok": False, "error": ...}`` and change nothing."""
        if isinstance(command, (bytes, bytearray)):
            try:
                command = msgpack.unpackb(command, raw=False, strict_map_key=False)
            except Exception as e:
                return _err(f"command is not valid msgpack: {e}")
        if not isinstance(command, dict):
            return _err("command must be a mapping")
        cid = command.get("id")
        if not isinstance(cid, str) or not cid:
            return _err("command needs a non-empty string 'id'")
        seen = self.applied.get(cid)
        if seen is not None:
            return {**seen, "duplicate": True}
        op = self._ops.get(str(command.get("op", "")))
        if op is None:
            return _err(f"unknown op {command.get('op')!r}; known: {', '.join(self._ops)}")
        now = command.get("now", self.clock)
        if isinstance(now, bool) or not isinstance(now, (int, float)):
            return _err("'now' must be a number")
        try:
            result = op(command)
        except SchedulingError as e:
            result = _err(str(e))
        else:
            self.clock = max(self.clock, float(now))
        self.applied[cid] = result
        while len(self.applied) > MAX_REMEMBERED_COMMANDS:
            self.applied.popitem(last=False)
        return result

    def snapshot(self) -> bytes:
        """The whole state, msgpack-encoded, versioned."""
        data: bytes = msgpack.packb({
            "version": SNAPSHOT_VERSION, "clock": self.clock,
            "nodes": [s.to_wire() for s in self.nodes.values()],
            "jobs": [r.to_wire() for r in self.jobs.values()],
            "queues": [q.to_wire() for q in self.queues.values()],
            "tenants": [[t, w] for t, w in self.tenant_weights.items()],
            "applied": [[k, v] for k, v in self.applied.items()],
        }, use_bin_type=True)
        return data

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's (validated before anything changes)."""
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as e:
            raise SchedulingError(f"snapshot is not valid msgpack: {e}") from e
        if not isinstance(d, dict) or d.get("version") != SNAPSHOT_VERSION:
            raise SchedulingError(f"snapshot version must be {SNAPSHOT_VERSION}")
        fresh = SchedulerStateMachine()
        fresh.clock = float(d["clock"])
        for s in d["nodes"]:
            node = Node.from_wire(s["node"])
            fresh.nodes[node.name] = NodeStatus(node, s["alive"], s["drained"],
                                                s["last_heartbeat"], list(s["unhealthy"]),
                                                s.get("agent", ""), s.get("orphan_timeout"))
            fresh.index.add_node(node, schedulable=s["alive"] and not s["drained"])
            for i in s["unhealthy"]:
                fresh.index.set_health(node.name, i, False)
        for q in d["queues"]:
            qc = QueueConfig.from_wire(q)
            fresh.queues[qc.name] = qc
        fresh.tenant_weights = {t: float(w) for t, w in d["tenants"]}
        for jd in d["jobs"]:
            rec = JobRecord.from_wire(jd)
            fresh.jobs[rec.job.id] = rec
            if rec.status == PENDING:
                fresh.pending[rec.job.id] = None
            elif rec.status == RUNNING and rec.placement is not None:
                fresh.running[rec.job.id] = None
                fresh._take_unchecked(rec.job, rec.placement)
                if rec.master_port is not None:
                    fresh.ports.setdefault(rec.placement.tasks[0].node, set()).add(rec.master_port)
        fresh.applied = OrderedDict((k, v) for k, v in d["applied"])
        for name in ("nodes", "jobs", "queues", "tenant_weights", "index", "clock", "applied",
                     "ports", "pending", "running"):
            setattr(self, name, getattr(fresh, name))

    # ----- views for the leader and the API ---------------------------------------

    def pending_jobs(self) -> list[Job]:
        """Jobs waiting for a placement, in submission order."""
        return [self.jobs[j].job for j in self.pending]

    def running_view(self) -> dict[str, Running]:
        """Running jobs as the scheduler sees them."""
        out = {}
        for jid in self.running:
            r = self.jobs[jid]
            assert r.placement is not None and r.start_time is not None
            out[jid] = Running(r.job, r.placement, r.start_time, r.last_checkpoint)
        return out

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """A job's record, or None."""
        r = self.jobs.get(job_id)
        return r.to_wire() if r else None

    def list_jobs(self, status: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        """Job records, optionally filtered."""
        return [r.to_wire() for r in self.jobs.values()
                if (status is None or r.status == status) and (tenant is None or r.job.tenant == tenant)]

    # ----- helpers ----------------------------------------------------------------

    def _take_unchecked(self, job: Job, placement: Placement) -> None:
        take(self.index, job, placement)

    def _requeue(self, jid: str, reason: str, *, failure: bool = False) -> bool:
        """Put a running job back in the queue; a failure past its budget holds it instead.

        Returns True when the job went back to pending."""
        r = self.jobs[jid]
        if r.status != RUNNING or r.placement is None:
            return False
        self._release(r)
        self.running.pop(jid, None)
        if failure:
            r.failures += 1
            if r.failures > r.job.max_restarts:
                r.status = HELD if r.job.max_restarts > 0 else FAILED
                r.reason = (f"{reason}; failed {r.failures} time(s), more than its "
                            f"max_restarts {r.job.max_restarts}")
                r.end_time = self.clock
                return False
        r.status = PENDING
        r.requeues += 1
        r.reason = reason
        self.pending[jid] = None
        return True

    def _release(self, r: JobRecord) -> None:
        assert r.placement is not None
        alive = [t for t in r.placement.tasks if t.node in self.index.nodes]
        give_back(self.index, r.job, Placement(r.placement.job_id, tuple(alive)))
        if r.master_port is not None:
            self.ports.get(r.placement.tasks[0].node, set()).discard(r.master_port)
        r.placement = None
        r.master_port = None

    def _jobs_on(self, node: str) -> list[str]:
        out = []
        for jid in self.running:
            p = self.jobs[jid].placement
            if p is not None and any(t.node == node for t in p.tasks):
                out.append(jid)
        return out

    def tasks_stopped_by(self, name: str) -> float | None:
        """The time by which the tasks running on node ``name`` are surely stopped if
        its agent lost the cluster right after its last heartbeat: that heartbeat, plus
        the orphan timeout the agent registered, plus the longest stop grace (SIGTERM to
        SIGKILL) of the jobs there. None when no task runs there (no job with a command)
        or no agent promised to stop them (the node may be declared dead as soon as it is
        suspected)."""
        st = self.nodes.get(name)
        if st is None or st.orphan_timeout is None:
            return None
        jobs = [j for j in self._jobs_on(name) if self.jobs[j].job.command]
        if not jobs:  # placement-only jobs: no agent runs anything for them
            return None
        return st.last_heartbeat + st.orphan_timeout + max(self.jobs[j].job.grace for j in jobs)

    def _node(self, cmd: dict[str, Any]) -> NodeStatus:
        name = cmd.get("node")
        if not isinstance(name, str) or name not in self.nodes:
            raise SchedulingError(f"node {name!r} is not registered")
        return self.nodes[name]

    def _job(self, cmd: dict[str, Any]) -> JobRecord:
        jid = cmd.get("job_id")
        if not isinstance(jid, str) or jid not in self.jobs:
            raise SchedulingError(f"job {jid!r} does not exist")
        return self.jobs[jid]

    # ----- commands -----------------------------------------------------------------

    def _register_node(self, cmd: dict[str, Any]) -> dict[str, Any]:
        node = Node.from_wire(cmd.get("node"))
        agent = cmd.get("agent", "")
        if not isinstance(agent, str) or len(agent) > 300:
            raise SchedulingError("register_node: 'agent' must be a host:port string")
        orphan = cmd.get("orphan_timeout")
        if orphan is not None and (not isinstance(orphan, (int, float))
                                   or not 0 <= orphan <= MAX_ORPHAN_TIMEOUT):
            raise SchedulingError(f"register_node: 'orphan_timeout' must be 0..{MAX_ORPHAN_TIMEOUT:g} "
                                  "seconds")
        orphan = None if orphan is None else float(orphan)
        old = self.nodes.get(node.name)
        if old is not None and self._jobs_on(node.name):
            if old.node != node:
                raise SchedulingError(f"node {node.name} has running jobs; its inventory cannot change")
            old.alive = True
            old.last_heartbeat = float(cmd.get("now", self.clock))
            old.agent = agent
            old.orphan_timeout = orphan
            self.index.set_schedulable(node.name, not old.drained)
            return {"ok": True, "node": node.name}
        drained = old.drained if old is not None else False
        self.index.add_node(node, schedulable=not drained)
        self.nodes[node.name] = NodeStatus(node, True, drained, float(cmd.get("now", self.clock)),
                                           agent=agent, orphan_timeout=orphan)
        return {"ok": True, "node": node.name}

    def _heartbeat(self, cmd: dict[str, Any]) -> dict[str, Any]:
        st = self._node(cmd)
        if not st.alive:
            raise SchedulingError(f"node {st.node.name} was declared dead; register it again")
        bad = cmd.get("unhealthy", [])
        known = {d.index for d in st.node.devices}
        if not isinstance(bad, list) or not all(isinstance(i, int) and i in known for i in bad):
            raise SchedulingError(f"heartbeat {st.node.name}: 'unhealthy' must list device indices of the node")
        st.last_heartbeat = max(st.last_heartbeat, float(cmd.get("now", self.clock)))
        requeued: list[str] = []
        ended: list[str] = []
        newly_bad = [i for i in bad if i not in st.unhealthy]
        for jid in self._jobs_on(st.node.name):
            p = self.jobs[jid].placement
            assert p is not None
            if any(t.node == st.node.name and set(t.devices) & set(newly_bad) for t in p.tasks):
                if self._requeue(jid, f"device failed on {st.node.name}", failure=True):
                    requeued.append(jid)
                else:
                    ended.append(jid)
        for i in newly_bad:
            self.index.set_health(st.node.name, i, False)
        for i in [i for i in st.unhealthy if i not in bad]:
            self.index.set_health(st.node.name, i, True, self._used_milli(st.node.name, i))
        st.unhealthy = sorted(bad)
        return {"ok": True, "requeued": requeued, "ended": ended}

    def _used_milli(self, node: str, index: int) -> int:
        used = 0
        for jid in self.running:
            r = self.jobs[jid]
            assert r.placement is not None
            for t in r.placement.tasks:
                if t.node == node and index in t.devices:
                    used += r.job.gpu_milli
        return used

    def _submit_job(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = Job.from_wire(cmd.get("job"))
        if job.id in self.jobs:
            raise SchedulingError(f"job {job.id} already exists")
        self.jobs[job.id] = JobRecord(job)
        self.pending[job.id] = None
        return {"ok": True, "job_id": job.id}

    def _cancel_job(self, cmd: dict[str, Any]) -> dict[str, Any]:
        r = self._job(cmd)
        if r.status in ENDED:
            raise SchedulingError(f"job {r.job.id} already ended ({r.status})")
        if r.status == RUNNING:
            self._release(r)
            self.running.pop(r.job.id, None)
        self.pending.pop(r.job.id, None)
        r.status = CANCELLED
        r.end_time = float(cmd.get("now", self.clock))
        return {"ok": True}

    def _hold_job(self, cmd: dict[str, Any]) -> dict[str, Any]:
        r = self._job(cmd)
        if r.status != PENDING:
            raise SchedulingError(f"job {r.job.id} is {r.status}: only a pending job can be "
                                  "held (cancel a running one)")
        self.pending.pop(r.job.id, None)
        r.status = HELD
        r.reason = "held by an operator"
        return {"ok": True}

    def _release_job(self, cmd: dict[str, Any]) -> dict[str, Any]:
        r = self._job(cmd)
        if r.status != HELD:
            raise SchedulingError(f"job {r.job.id} is {r.status}: only a held job can be "
                                  "released")
        r.status = PENDING
        r.failures = 0
        r.end_time = None
        r.reason = "released"
        self.pending[r.job.id] = None
        return {"ok": True}

    def _job_finished(self, cmd: dict[str, Any]) -> dict[str, Any]:
        r = self._job(cmd)
        if r.status != RUNNING:
            raise SchedulingError(f"job {r.job.id} is not running ({r.status})")
        self._release(r)
        self.running.pop(r.job.id, None)
        r.status = SUCCEEDED if cmd.get("ok", True) else FAILED
        r.end_time = float(cmd.get("now", self.clock))
        return {"ok": True}

    def _task_status(self, cmd: dict[str, Any]) -> dict[str, Any]:
        r = self._job(cmd)
        attempt, rank, state = cmd.get("attempt"), cmd.get("rank"), cmd.get("state")
        if not isinstance(attempt, int) or not isinstance(rank, int) or state not in TASK_STATES[1:]:
            raise SchedulingError("task_status needs an int 'attempt' and 'rank' and a 'state' "
                                  "of running, exited or lost")
        if attempt != r.starts or (r.status != RUNNING and state == "running"):
            raise SchedulingError(f"job {r.job.id} attempt {attempt} is not running "
                                  f"(the job is {r.status} at attempt {r.starts})")
        if not 0 <= rank < len(r.tasks):
            raise SchedulingError(f"job {r.job.id} has no rank {rank}")
        t = r.tasks[rank]
        node = cmd.get("node")
        if node != t.node:
            raise SchedulingError(f"job {r.job.id} rank {rank} runs on {t.node}, not {node!r}")
        code = cmd.get("exit_code")
        if state == "exited" and (isinstance(code, bool) or not isinstance(code, int)):
            raise SchedulingError("an exited task needs an int 'exit_code'")
        now = float(cmd.get("now", self.clock))
        reason = str(cmd.get("reason", ""))[:512]
        if t.state in ("exited", "lost"):
            return {"ok": True}  # already final (a late 'running' report)
        if state == "running":
            t.state, t.start_time = "running", now
            return {"ok": True}
        t.state, t.end_time, t.reason = state, now, reason
        if t.start_time is None:
            t.start_time = now
        self.clock = max(self.clock, now)
        if r.status != RUNNING:
            # The attempt already ended (cancelled, failed, requeued): record how its task
            # ended, change nothing else.
            t.exit_code = code if state == "exited" else None
            return {"ok": True}
        if state == "lost":
            self._requeue(r.job.id, f"rank {rank} lost on {t.node}: {reason or 'agent restarted'}")
            return {"ok": True, "requeued": [r.job.id]}
        t.exit_code = code
        if code != 0:
            why = f"rank {rank} exited with {code}" + (f" ({reason})" if reason else "")
            if self._requeue(r.job.id, why, failure=True):
                return {"ok": True, "requeued": [r.job.id]}
            return {"ok": True, "ended": [r.job.id]}
        if all(x.state == "exited" and x.exit_code == 0 for x in r.tasks):
            self._release(r)
            self.running.pop(r.job.id, None)
            r.status, r.end_time, r.reason = SUCCEEDED, now, ""
            return {"ok": True, "ended": [r.job.id]}
        return {"ok": True}

    def _checkpoint(self, cmd: dict[str, Any]) -> dict[str, Any]:
        r = self._job(cmd)
        if r.status != RUNNING:
            raise SchedulingError(f"job {r.job.id} is not running ({r.status})")
        r.last_checkpoint = float(cmd.get("now", self.clock))
        return {"ok": True}

    def _node_dead(self, cmd: dict[str, Any]) -> dict[str, Any]:
        st = self._node(cmd)
        requeued = []
        ended = []
        for jid in self._jobs_on(st.node.name):
            for t in self.jobs[jid].tasks:
                if t.node == st.node.name and t.state in ("placed", "running"):
                    t.state, t.reason = "lost", f"node {st.node.name} died"
                    t.end_time = float(cmd.get("now", self.clock))
            if self._requeue(jid, f"node {st.node.name} died", failure=True):
                requeued.append(jid)
            else:
                ended.append(jid)
        st.alive = False
        self.index.set_schedulable(st.node.name, False)
        return {"ok": True, "requeued": requeued, "ended": ended}

    def _drain(self, cmd: dict[str, Any]) -> dict[str, Any]:
        st = self._node(cmd)
        st.drained = True
        self.index.set_schedulable(st.node.name, False)
        return {"ok": True, "running": self._jobs_on(st.node.name)}

    def _undrain(self, cmd: dict[str, Any]) -> dict[str, Any]:
        st = self._node(cmd)
        st.drained = False
        self.index.set_schedulable(st.node.name, st.alive)
        return {"ok": True}

    def _set_queue(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = QueueConfig.from_wire(cmd.get("queue"))
        self.queues[q.name] = q
        return {"ok": True}

    def _set_tenant(self, cmd: dict[str, Any]) -> dict[str, Any]:
        tenant = check_name(str(cmd.get("tenant", "")), "tenant")
        w = cmd.get("weight")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0:
            raise SchedulingError(f"tenant {tenant}: weight must be a number > 0")
        self.tenant_weights[tenant] = float(w)
        return {"ok": True}

    def _place_jobs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        raw_p = cmd.get("placements", [])
        raw_v = cmd.get("preemptions", [])
        if not isinstance(raw_p, list) or not isinstance(raw_v, list):
            raise SchedulingError("place_jobs: 'placements' and 'preemptions' must be lists")
        placements = [Placement.from_wire(p) for p in raw_p]
        now = float(cmd.get("now", self.clock))
        preempted = []
        for vid in raw_v:
            r = self.jobs.get(vid) if isinstance(vid, str) else None
            if r is not None and r.status == RUNNING and r.job.preemptible:
                self._requeue(vid, "preempted")
                preempted.append(vid)
        accepted: list[str] = []
        rejected: dict[str, str] = {}
        for p in placements:
            why = self._check(p)
            if why is None:
                try:
                    take(self.index, self.jobs[p.job_id].job, p)
                except SchedulingError as e:
                    why = str(e)
            if why is not None:
                rejected[p.job_id] = why
                continue
            r = self.jobs[p.job_id]
            r.status = RUNNING
            r.placement = p
            r.start_time = now
            r.starts += 1
            r.reason = ""
            r.end_time = None
            r.tasks = [TaskRecord(t.rank, t.node) for t in p.tasks]
            r.master_port = self._alloc_port(p.tasks[0].node)
            self.pending.pop(p.job_id, None)
            self.running[p.job_id] = None
            accepted.append(p.job_id)
        return {"ok": True, "accepted": accepted, "rejected": rejected, "preempted": preempted}

    def _alloc_port(self, node: str) -> int | None:
        used = self.ports.setdefault(node, set())
        for port in range(PORT_BASE, PORT_BASE + PORT_RANGE):
            if port not in used:
                used.add(port)
                return port
        return None

    def _check(self, p: Placement) -> str | None:
        """Why placement ``p`` may not be applied now (stale or invalid), or None."""
        r = self.jobs.get(p.job_id)
        if r is None:
            return "no such job"
        if r.status != PENDING:
            return f"job is {r.status}, not pending"
        job = r.job
        if len(p.tasks) != job.tasks:
            return f"placement has {len(p.tasks)} tasks, job has {job.tasks}"
        pred = compile_selector(job.selector)
        nodes = []
        for t in p.tasks:
            st = self.nodes.get(t.node)
            if st is None or not st.alive or st.drained:
                return f"node {t.node} is not schedulable"
            if len(t.devices) != job.devices_per_task:
                return f"task {t.rank} has {len(t.devices)} devices, job wants {job.devices_per_task}"
            by_index = {d.index: d for d in st.node.devices}
            for i in t.devices:
                d = by_index.get(i)
                if d is None or not pred(d.attrs()):
                    return f"device {t.node}/{i} does not match the job's selector"
            nodes.append(st.node)
        level = job.topology.level
        if job.topology.required and level is not None:
            if len({domain_of(n, level) for n in nodes}) != 1:
                return f"tasks span more than one {level}"
            if level == "island":
                node = nodes[0]
                by_index = {d.index: d for d in node.devices}
                if len({by_index[i].island for t in p.tasks for i in t.devices}) > 1:
                    return "devices span more than one island"
        return None
