"""The ``accord.scheduling.v1.Scheduler`` gRPC service over a ``SchedulerShard``.

Mutating calls become commands committed through the scheduling shard (any member
may receive them: the host forwards proposals to the shard leader). Reads
(``GetJob``, ``ListJobs``, ``ListNodes``) are served from the local replica after a
ReadIndex barrier, so they see every committed change. ``WatchPlacements``
streams the events this member applies (a member that catches up by installing a
snapshot publishes nothing for the commands the snapshot covers; ``GetJob`` and
``ListJobs`` always tell the current state).

Errors map to status codes: malformed input (bad selector syntax, bad names,
impossible shapes) is ``INVALID_ARGUMENT``; an unknown job or node is
``NOT_FOUND``; a duplicate job id is ``ALREADY_EXISTS``; a job no registered node
could ever hold is refused at submit with ``FAILED_PRECONDITION``, as are
operations the job's or node's state forbids; a shard without a leader is
``UNAVAILABLE`` (safe to retry with the same ``request_id``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, NoReturn, TypeVar

import grpc

from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc
from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.launch import TaskLaunch, task_launches
from accord.services.scheduling.model import Job, Node, Placement
from accord.services.scheduling.replicated import Event, SchedulerShard, ShardUnavailable
from accord.services.scheduling.state import JOB_STATUSES, RUNNING, TaskRecord

T = TypeVar("T")
_grpc_mod: Any = scheduling_pb2_grpc  # the generated module carries no annotations

_NOT_FOUND = ("does not exist", "is not registered", "not found")
_PRECONDITION = ("already ended", "is not running", "declared dead", "has running jobs",
                 "not schedulable", "could hold", "can be held", "can be released")


def code_for(message: str) -> grpc.StatusCode:
    """The status code for a ``SchedulingError`` message."""
    if any(s in message for s in _NOT_FOUND):
        return grpc.StatusCode.NOT_FOUND
    if "already exists" in message:
        return grpc.StatusCode.ALREADY_EXISTS
    if any(s in message for s in _PRECONDITION):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INVALID_ARGUMENT


async def _call(context: grpc.aio.ServicerContext, call: Awaitable[T]) -> T:
    try:
        return await call
    except SchedulingError as e:
        await _abort(context, code_for(str(e)), str(e))
    except ShardUnavailable as e:
        await _abort(context, grpc.StatusCode.UNAVAILABLE, str(e))


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("abort returned")  # pragma: no cover - abort always raises


# ----- protobuf <-> wire dicts ----------------------------------------------------------


def _attr_value(a: pb.Attribute) -> str | int | float | bool:
    which = a.WhichOneof("value")
    if which is None:
        raise SchedulingError(f"device attribute {a.name!r} has no value")
    v: str | int | float | bool = getattr(a, which)
    return v


def node_to_wire(spec: pb.NodeSpec) -> dict[str, Any]:
    """A ``NodeSpec`` as the state machine's node dict (validated later by ``Node.from_wire``)."""
    d: dict[str, Any] = {
        "name": spec.name, "cpu_milli": spec.cpu_milli, "memory_mib": spec.memory_mib,
        "devices": [{
            "index": dv.index, "vendor": dv.vendor, "model": dv.model, "memory": dv.memory,
            "arch": dv.arch, "capability": dv.capability, "island": dv.island,
            "pcie_switch": dv.pcie_switch, "numa": dv.numa,
            "attributes": [[a.name, _attr_value(a)] for a in dv.attributes],
        } for dv in spec.devices],
        "numa_cpus": list(spec.numa_cpus), "nics": [[n.name, n.numa] for n in spec.nics],
    }
    for key in ("address", "leaf", "spine", "block"):
        if getattr(spec, key):
            d[key] = getattr(spec, key)
    return d


def _attribute(name: str, v: str | int | float | bool) -> pb.Attribute:
    if isinstance(v, bool):
        return pb.Attribute(name=name, flag=v)
    if isinstance(v, int):
        return pb.Attribute(name=name, integer=v)
    if isinstance(v, float):
        return pb.Attribute(name=name, number=v)
    return pb.Attribute(name=name, text=v)


def node_to_pb(node: Node) -> pb.NodeSpec:
    """A node as its ``NodeSpec`` message."""
    return pb.NodeSpec(
        name=node.name, address=node.address, cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        devices=[pb.Device(index=d.index, vendor=d.vendor, model=d.model, memory=d.memory,
                           arch=d.arch, capability=d.capability, island=d.island,
                           pcie_switch=d.pcie_switch, numa=d.numa,
                           attributes=[_attribute(k, v) for k, v in d.attributes])
                 for d in node.devices],
        numa_cpus=list(node.numa_cpus), nics=[pb.Nic(name=n.name, numa=n.numa) for n in node.nics],
        leaf=node.leaf, spine=node.spine, block=node.block,
    )


def job_to_wire(spec: pb.JobSpec, job_id: str) -> dict[str, Any]:
    """A ``JobSpec`` as the state machine's job dict (defaults for unset optional fields)."""
    d: dict[str, Any] = {
        "id": job_id, "priority": spec.priority, "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib, "selector": spec.selector,
        "topology": [spec.topology_level or None, spec.topology_required],
        "preemptible": spec.preemptible, "submit_time": spec.submit_time,
    }
    if spec.tenant:
        d["tenant"] = spec.tenant
    if spec.queue:
        d["queue"] = spec.queue
    for key in ("tasks", "devices_per_task", "gpu_milli", "estimated_runtime", "grace",
                "max_restarts"):
        if spec.HasField(key):
            d[key] = getattr(spec, key)
    if spec.command:
        d["command"] = list(spec.command)
    if spec.workdir:
        d["workdir"] = spec.workdir
    if spec.topology_required and not spec.topology_level:
        raise SchedulingError(f"job {job_id}: topology_required needs a topology_level")
    return d


def job_to_pb(job: Job) -> pb.JobSpec:
    """A job as its ``JobSpec`` message."""
    return pb.JobSpec(
        id=job.id, tenant=job.tenant, queue=job.queue, priority=job.priority, tasks=job.tasks,
        devices_per_task=job.devices_per_task, gpu_milli=job.gpu_milli, cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib, selector=job.selector,
        topology_level=job.topology.level or "", topology_required=job.topology.required,
        estimated_runtime=job.estimated_runtime, preemptible=job.preemptible,
        submit_time=job.submit_time, command=list(job.command), workdir=job.workdir,
        grace=job.grace, max_restarts=job.max_restarts,
    )


def launch_to_pb(t: TaskLaunch) -> pb.TaskLaunch:
    """One task's launch facts as a message."""
    return pb.TaskLaunch(rank=t.rank, host=t.host, address=t.address, devices=list(t.devices),
                         vendor=t.vendor or "", numa_nodes=list(t.numa_nodes), cpus=t.cpus,
                         nics=list(t.nics), env=dict(t.env), argv=list(t.argv))


def _launches(job: Job, placement: Placement | None, port: int | None, nodes: dict[str, Node]
              ) -> list[pb.TaskLaunch]:
    if placement is None or port is None:
        return []
    return [launch_to_pb(t) for t in task_launches(job, placement, nodes, port)]


def event_to_pb(ev: Event) -> pb.PlacementEvent:
    """A shard event as a ``PlacementEvent``."""
    tasks = (_launches(ev.job, ev.placement, ev.master_port, ev.nodes)
             if ev.job is not None else [])
    out = pb.PlacementEvent(index=ev.index, kind=ev.kind, job_id=ev.job_id, reason=ev.reason,
                            tasks=tasks, attempt=ev.attempt)
    if ev.job is not None:
        out.spec.CopyFrom(job_to_pb(ev.job))
    return out


def task_to_pb(t: TaskRecord) -> pb.TaskStatus:
    """One task's reported status as a message."""
    out = pb.TaskStatus(rank=t.rank, node=t.node, state=t.state, start_time=t.start_time or 0.0,
                        end_time=t.end_time or 0.0, reason=t.reason)
    if t.exit_code is not None:
        out.exit_code = t.exit_code
    return out


class SchedulerServicer(scheduling_pb2_grpc.SchedulerServicer):
    """``accord.scheduling.v1.Scheduler`` on one member."""

    def __init__(self, shard: SchedulerShard) -> None:
        self.shard = shard

    @property
    def _svc(self) -> Any:
        return self.shard.service

    def _job_info(self, job_id: str) -> pb.JobInfo:
        sm = self.shard.sm
        r = sm.jobs[job_id]
        tasks: list[pb.TaskLaunch] = []
        if r.status == RUNNING and r.placement is not None:
            nodes = {t.node: sm.nodes[t.node].node for t in r.placement.tasks}
            tasks = _launches(r.job, r.placement, r.master_port, nodes)
        return pb.JobInfo(spec=job_to_pb(r.job), status=r.status, tasks=tasks,
                          start_time=r.start_time or 0.0, end_time=r.end_time or 0.0,
                          master_port=r.master_port or 0, starts=r.starts, requeues=r.requeues,
                          reason=r.reason, task_status=[task_to_pb(t) for t in r.tasks],
                          failures=r.failures)

    def _jobs_on(self, node: str) -> list[str]:
        sm = self.shard.sm
        out = []
        for jid in sm.running:
            p = sm.jobs[jid].placement
            if p is not None and any(t.node == node for t in p.tasks):
                out.append(jid)
        return out

    # ----- agents ------------------------------------------------------------------------

    async def RegisterNode(self, request: pb.RegisterNodeRequest,
                           context: grpc.aio.ServicerContext) -> pb.RegisterNodeResponse:
        """Add a node or refresh an idle one's inventory."""
        async def run() -> pb.RegisterNodeResponse:
            wire = node_to_wire(request.node)
            Node.from_wire(wire)
            orphan = (request.orphan_timeout if request.HasField("orphan_timeout")
                      else None)
            out = await self._svc.register_node(wire, request.request_id or None,
                                                agent=request.agent_endpoint,
                                                orphan_timeout=orphan)
            return pb.RegisterNodeResponse(node=str(out["node"]))
        return await _call(context, run())

    async def Heartbeat(self, request: pb.HeartbeatRequest,
                        context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        """A node is alive; ``unhealthy`` lists its failed devices."""
        async def run() -> pb.HeartbeatResponse:
            out = await self._svc.heartbeat(request.node, list(request.unhealthy),
                                            request.request_id or None)
            return pb.HeartbeatResponse(requeued=list(out.get("requeued", [])))
        return await _call(context, run())

    # ----- jobs ----------------------------------------------------------------------------

    async def SubmitJob(self, request: pb.SubmitJobRequest,
                        context: grpc.aio.ServicerContext) -> pb.SubmitJobResponse:
        """Queue a job; refused when no registered node could ever hold it."""
        async def run() -> pb.SubmitJobResponse:
            job_id = request.job.id or f"job-{uuid.uuid4().hex[:10]}"
            wire = job_to_wire(request.job, job_id)
            if not wire.get("submit_time"):
                wire["submit_time"] = self.shard.clock()
            job = Job.from_wire(wire)
            await self.shard.barrier()
            if not self.shard.fits_somewhere(job):
                raise SchedulingError(
                    f"job {job_id}: no registered node could hold it even when idle "
                    f"({job.tasks} task(s) x {job.devices_per_task} device(s), "
                    f"selector {job.selector!r}); register matching nodes first")
            out = await self._svc.submit_job(wire, request.request_id or None)
            self.shard.kick()
            return pb.SubmitJobResponse(job_id=str(out["job_id"]))
        return await _call(context, run())

    async def CancelJob(self, request: pb.CancelJobRequest,
                        context: grpc.aio.ServicerContext) -> pb.CancelJobResponse:
        """Cancel a pending or running job."""
        async def run() -> pb.CancelJobResponse:
            await self._svc.cancel_job(request.job_id, request.request_id or None)
            return pb.CancelJobResponse()
        return await _call(context, run())

    async def HoldJob(self, request: pb.HoldJobRequest,
                      context: grpc.aio.ServicerContext) -> pb.HoldJobResponse:
        """Keep a pending job out of the queue until it is released (Slurm's hold)."""
        async def run() -> pb.HoldJobResponse:
            await self._svc.hold_job(request.job_id, request.request_id or None)
            return pb.HoldJobResponse()
        return await _call(context, run())

    async def ReleaseJob(self, request: pb.ReleaseJobRequest,
                         context: grpc.aio.ServicerContext) -> pb.ReleaseJobResponse:
        """Put a held job back in the queue, its failures counted from zero."""
        async def run() -> pb.ReleaseJobResponse:
            await self._svc.release_job(request.job_id, request.request_id or None)
            return pb.ReleaseJobResponse()  # applying it kicks the leader's cycle
        return await _call(context, run())

    async def JobFinished(self, request: pb.JobFinishedRequest,
                          context: grpc.aio.ServicerContext) -> pb.JobFinishedResponse:
        """A launcher reports that a running job ended."""
        async def run() -> pb.JobFinishedResponse:
            await self._svc.job_finished(request.job_id, not request.failed,
                                         request.request_id or None)
            return pb.JobFinishedResponse()
        return await _call(context, run())

    async def ReportTask(self, request: pb.ReportTaskRequest,
                         context: grpc.aio.ServicerContext) -> pb.ReportTaskResponse:
        """An agent reports a task running, exited (with its code) or lost."""
        async def run() -> pb.ReportTaskResponse:
            await self._svc.task_status(request.job_id, request.rank, request.attempt,
                                        request.node, request.state, request.exit_code,
                                        request.reason, request.request_id or None)
            r = self.shard.sm.jobs.get(request.job_id)
            return pb.ReportTaskResponse(job_status=r.status if r else "")
        return await _call(context, run())

    async def GetJob(self, request: pb.GetJobRequest,
                     context: grpc.aio.ServicerContext) -> pb.JobInfo:
        """One job, with per-task launch facts while it runs."""
        async def run() -> pb.JobInfo:
            await self.shard.barrier()
            if request.job_id not in self.shard.sm.jobs:
                raise SchedulingError(f"job {request.job_id!r} does not exist")
            return self._job_info(request.job_id)
        return await _call(context, run())

    async def ListJobs(self, request: pb.ListJobsRequest,
                       context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        """Jobs, optionally filtered by status and tenant."""
        async def run() -> pb.ListJobsResponse:
            if request.status and request.status not in JOB_STATUSES:
                raise SchedulingError(f"status {request.status!r}: use one of "
                                      f"{', '.join(JOB_STATUSES)} (or none: every job)")
            await self.shard.barrier()
            sm = self.shard.sm
            if request.node:
                ids = self._jobs_on(request.node)
            else:
                ids = [r.job.id for r in sm.jobs.values()
                       if (not request.status or r.status == request.status)
                       and (not request.tenant or r.job.tenant == request.tenant)]
            return pb.ListJobsResponse(jobs=[self._job_info(j) for j in ids])
        return await _call(context, run())

    async def WatchPlacements(self, request: pb.WatchPlacementsRequest,
                              context: grpc.aio.ServicerContext) -> AsyncIterator[pb.PlacementEvent]:
        """Stream placement, requeue, preemption, cancel and finish events."""
        async for ev in self.shard.events.subscribe(request.start_index):
            if request.job_id and ev.job_id != request.job_id:
                continue
            if request.node and request.node not in ev.task_nodes:
                continue
            yield event_to_pb(ev)

    # ----- operators --------------------------------------------------------------------------

    async def DrainNode(self, request: pb.NodeRequest,
                        context: grpc.aio.ServicerContext) -> pb.NodeResponse:
        """Place nothing new on a node; its running jobs stay."""
        async def run() -> pb.NodeResponse:
            out = await self._svc.drain(request.node, request.request_id or None)
            return pb.NodeResponse(running_jobs=list(out.get("running", [])))
        return await _call(context, run())

    async def UndrainNode(self, request: pb.NodeRequest,
                          context: grpc.aio.ServicerContext) -> pb.NodeResponse:
        """Let a drained node take work again."""
        async def run() -> pb.NodeResponse:
            await self._svc.undrain(request.node, request.request_id or None)
            return pb.NodeResponse(running_jobs=self._jobs_on(request.node))
        return await _call(context, run())

    async def ListNodes(self, request: pb.ListNodesRequest,
                        context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        """Every registered node and what membership and operators say about it."""
        async def run() -> pb.ListNodesResponse:
            await self.shard.barrier()
            return pb.ListNodesResponse(nodes=[
                pb.NodeInfo(spec=node_to_pb(st.node), alive=st.alive, drained=st.drained,
                            last_heartbeat=st.last_heartbeat, unhealthy=list(st.unhealthy),
                            running_jobs=self._jobs_on(name), agent_endpoint=st.agent,
                            orphan_timeout=st.orphan_timeout)
                for name, st in self.shard.sm.nodes.items()
            ])
        return await _call(context, run())

    async def Status(self, request: pb.StatusRequest,
                     context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        """Who leads the scheduling shard, as this member sees it (no barrier)."""
        member, leader, term, applied = self.shard.leader_info()
        return pb.StatusResponse(member_id=member, leader_id=leader, term=term,
                                 is_leader=self.shard.is_leader(), applied_index=applied,
                                 pending_jobs=len(self.shard.sm.pending),
                                 running_jobs=len(self.shard.sm.running))


def add_scheduler_service(server: grpc.aio.Server, shard: SchedulerShard) -> SchedulerServicer:
    """Register the scheduler service on ``server``; returns the servicer."""
    servicer = SchedulerServicer(shard)
    _grpc_mod.add_SchedulerServicer_to_server(servicer, server)
    return servicer
