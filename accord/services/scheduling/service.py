"""Service-level functions the gRPC servicer and the CLI call.

``SchedulingService`` validates input (raising ``SchedulingError`` before anything
is proposed), turns each request into a command with an id, and hands it to
``propose``: an async callable that commits the command through the scheduling
shard's Raft group and returns the state machine's result. Reads are served from
the local replica (the caller decides whether a ReadIndex barrier comes first).

``run_cycle`` is what the shard leader calls periodically: it computes decisions
on its replica and commits them in chunks of ``chunk`` placements; a leader that
dies between chunks loses nothing (pending jobs stay pending for the next
leader) and duplicates nothing (apply re-validates every placement).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.launch import TaskLaunch, task_launches
from accord.services.scheduling.model import Job, Node, check_name
from accord.services.scheduling.queueing import QueueConfig
from accord.services.scheduling.scheduler import CycleConfig, CycleResult, run_cycle
from accord.services.scheduling.state import RUNNING, SchedulerStateMachine

Propose = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class SchedulingService:
    """The scheduler's API, over a replica and a way to commit commands."""

    def __init__(self, state: SchedulerStateMachine, propose: Propose, *,
                 clock: Callable[[], float] = time.time, cycle: CycleConfig | None = None,
                 chunk: int = 256, origin: str | None = None) -> None:
        self.state = state
        self.propose = propose
        self.clock = clock
        self.cycle = cycle or CycleConfig()
        self.chunk = max(1, chunk)
        self._origin = origin or uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)

    def _id(self, request_id: str | None) -> str:
        return request_id if request_id else f"{self._origin}-{next(self._seq)}"

    async def _commit(self, op: str, request_id: str | None, **fields: Any) -> dict[str, Any]:
        cmd = {"id": self._id(request_id), "op": op, "now": self.clock(), **fields}
        result = await self.propose(cmd)
        if not result.get("ok", False):
            raise SchedulingError(str(result.get("error", "command rejected")))
        return result

    async def register_node(self, node: Node | dict[str, Any], request_id: str | None = None,
                            agent: str = "", orphan_timeout: float | None = None
                            ) -> dict[str, Any]:
        """Add a node (or refresh an idle one's inventory); ``agent``: its agent's endpoint;
        ``orphan_timeout``: the seconds without a heartbeat after which that agent stops
        its tasks by itself (``NodeStatus.orphan_timeout``)."""
        wire = node.to_wire() if isinstance(node, Node) else node
        Node.from_wire(wire)
        extra: dict[str, Any] = {}
        if agent:
            extra["agent"] = agent
        if orphan_timeout is not None:
            extra["orphan_timeout"] = float(orphan_timeout)
        return await self._commit("register_node", request_id, node=wire, **extra)

    async def heartbeat(self, node: str, unhealthy: Iterable[int] = (), request_id: str | None = None
                        ) -> dict[str, Any]:
        """Record a node's heartbeat and its failed devices (their jobs are requeued)."""
        check_name(node, "node")
        bad = sorted(set(unhealthy))
        return await self._commit("heartbeat", request_id, node=node, unhealthy=bad)

    async def submit_job(self, job: Job | dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
        """Queue a job; its submit time is set here if the caller left it 0."""
        wire = job.to_wire() if isinstance(job, Job) else dict(job)
        if not wire.get("submit_time"):
            wire["submit_time"] = self.clock()
        parsed = Job.from_wire(wire)
        if parsed.id in self.state.jobs and request_id is None:
            raise SchedulingError(f"job {parsed.id} already exists")
        return await self._commit("submit_job", request_id, job=parsed.to_wire())

    async def cancel_job(self, job_id: str, request_id: str | None = None) -> dict[str, Any]:
        """Cancel a pending or running job (a running one frees its devices)."""
        check_name(job_id, "job id")
        return await self._commit("cancel_job", request_id, job_id=job_id)

    async def hold_job(self, job_id: str, request_id: str | None = None) -> dict[str, Any]:
        """Keep a pending job out of the queue until released."""
        check_name(job_id, "job id")
        return await self._commit("hold_job", request_id, job_id=job_id)

    async def release_job(self, job_id: str, request_id: str | None = None) -> dict[str, Any]:
        """Put a held job back in the queue with its failures counted from zero."""
        check_name(job_id, "job id")
        return await self._commit("release_job", request_id, job_id=job_id)

    async def job_finished(self, job_id: str, ok: bool = True, request_id: str | None = None) -> dict[str, Any]:
        """Report that a running job ended."""
        check_name(job_id, "job id")
        return await self._commit("job_finished", request_id, job_id=job_id, ok=bool(ok))

    async def task_status(self, job_id: str, rank: int, attempt: int, node: str, state: str,
                          exit_code: int | None = None, reason: str = "",
                          request_id: str | None = None) -> dict[str, Any]:
        """An agent's report on one task: ``running``, ``exited`` (with its code) or ``lost``."""
        check_name(job_id, "job id")
        check_name(node, "node")
        if state not in ("running", "exited", "lost"):
            raise SchedulingError(f"task state {state!r} is not one of running, exited, lost")
        fields: dict[str, Any] = {"job_id": job_id, "rank": rank, "attempt": attempt,
                                  "node": node, "state": state, "reason": reason[:512]}
        if state == "exited":
            fields["exit_code"] = int(exit_code if exit_code is not None else -1)
        return await self._commit("task_status", request_id, **fields)

    async def checkpoint_committed(self, job_id: str, request_id: str | None = None) -> dict[str, Any]:
        """Note a job's newly committed checkpoint (makes it a cheaper preemption victim)."""
        check_name(job_id, "job id")
        return await self._commit("checkpoint", request_id, job_id=job_id)

    async def drain(self, node: str, request_id: str | None = None) -> dict[str, Any]:
        """Stop placing new work on a node (running jobs stay)."""
        check_name(node, "node")
        return await self._commit("drain", request_id, node=node)

    async def undrain(self, node: str, request_id: str | None = None) -> dict[str, Any]:
        """Let a drained node take work again."""
        check_name(node, "node")
        return await self._commit("undrain", request_id, node=node)

    async def node_dead(self, node: str, request_id: str | None = None) -> dict[str, Any]:
        """Membership declared a node dead: requeue its jobs, place nothing there."""
        check_name(node, "node")
        return await self._commit("node_dead", request_id, node=node)

    async def set_queue(self, queue: QueueConfig | dict[str, Any], request_id: str | None = None
                        ) -> dict[str, Any]:
        """Create or change a queue's quota."""
        wire = queue.to_wire() if isinstance(queue, QueueConfig) else queue
        QueueConfig.from_wire(wire)
        return await self._commit("set_queue", request_id, queue=wire)

    async def set_tenant_weight(self, tenant: str, weight: float, request_id: str | None = None
                                ) -> dict[str, Any]:
        """Set a tenant's fair-share weight."""
        check_name(tenant, "tenant")
        return await self._commit("set_tenant", request_id, tenant=tenant, weight=weight)

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """A job's record from the local replica."""
        return self.state.get_job(job_id)

    def list_jobs(self, status: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        """Job records from the local replica."""
        return self.state.list_jobs(status, tenant)

    def list_nodes(self) -> list[dict[str, Any]]:
        """Node records from the local replica."""
        return [s.to_wire() for s in self.state.nodes.values()]

    def launch_info(self, job_id: str) -> list[TaskLaunch]:
        """Per-task launch facts (host, devices, env, affinity, rendezvous) of a running job."""
        r = self.state.jobs.get(job_id)
        if r is None or r.status != RUNNING or r.placement is None or r.master_port is None:
            raise SchedulingError(f"job {job_id} is not running")
        nodes = {n: s.node for n, s in self.state.nodes.items()}
        return task_launches(r.job, r.placement, nodes, r.master_port)

    def decide(self) -> CycleResult:
        """Compute one cycle's decisions on the local replica (commits nothing)."""
        st = self.state
        return run_cycle(st.index, st.pending_jobs(), st.running_view(), self.clock(), self.cycle,
                         st.queues, st.tenant_weights)

    async def run_cycle(self) -> dict[str, Any]:
        """Leader only: decide and commit; returns what was accepted and rejected."""
        res = self.decide()
        accepted: list[str] = []
        rejected: dict[str, str] = {}
        chunks = [res.placements[i:i + self.chunk] for i in range(0, len(res.placements), self.chunk)]
        preempt = list(res.preemptions)
        for i, chunk in enumerate(chunks or [[]]):
            if not chunk and not preempt:
                break
            out = await self._commit("place_jobs", None, placements=[p.to_wire() for p in chunk],
                                     preemptions=preempt if i == 0 else [])
            accepted.extend(out["accepted"])
            rejected.update(out["rejected"])
        return {"accepted": accepted, "rejected": rejected, "preempted": preempt,
                "reservation": res.reservation.job_id if res.reservation else None}
