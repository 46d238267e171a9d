"""The GPU scheduler from Python — ``client.scheduler``: jobs, placements, nodes.

::

    job_id = await client.scheduler.submit(JobSpec(tasks=2, devices_per_task=8,
                                                   selector="vendor == nvidia"))
    async with client.scheduler.watch_placements(job_id) as events:
        async for ev in events:
            if ev.kind == "placed":
                launch(ev.tasks)        # host, devices, env, torchrun argv per rank
                break
    ...
    await client.scheduler.job_finished(job_id)

Every mutation (submit, cancel, hold, release, job finished, drain, undrain, register,
heartbeat) carries one request id, generated once per call and kept across its retries; the
scheduler applies a request id once, so these calls are retried like reads. Results
are frozen dataclasses (:class:`Job`, :class:`TaskLaunch`, :class:`PlacementEvent`,
:class:`Node`), not protobuf.

:meth:`SchedulerApi.watch_placements` resumes across disconnects: it remembers the log
index of the last event and reopens the stream on the next endpoint from the index
after it. A member replays from a buffer of its last 1024 scheduler events
(``ShardConfig.event_buffer``), so a watch that stays disconnected while more than that
many events happen can miss some; a job's state is always readable with :meth:`get`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from accord.client.errors import ClientError, NotFound, Unavailable
from accord.client.tasklogs import LogChunk, check_request, read_log
from accord.client.transport import EndpointPool
from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc

_rpc: Any = scheduling_pb2_grpc

JOB_STATES = ("pending", "running", "held", "succeeded", "failed", "cancelled")
"""What :attr:`Job.status` can be."""
EVENT_KINDS = ("placed", "requeued", "preempted", "cancelled", "finished")
"""What :attr:`PlacementEvent.kind` can be."""
TOPOLOGY_LEVELS = ("island", "node", "leaf", "spine", "block")
"""Levels a gang can be kept within (:attr:`JobSpec.topology_level`)."""


def request_id() -> str:
    """A fresh request id (one per logical call, kept across its retries)."""
    return f"py-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job asks for: a gang of ``tasks`` tasks placed all or nothing."""

    id: str = ""
    """Empty: the scheduler picks one."""
    tenant: str = ""
    queue: str = ""
    priority: int = 0
    tasks: int = 1
    devices_per_task: int = 1
    """0 for CPU-only tasks."""
    gpu_milli: int | None = None
    """Share of each device in thousandths (default: whole devices)."""
    cpu_milli: int = 0
    memory_mib: int = 0
    selector: str = ""
    """Device selector, e.g. ``"vendor == nvidia && memory >= 80GiB"``."""
    topology_level: str = ""
    """Keep the gang within one domain of this level (see :data:`TOPOLOGY_LEVELS`)."""
    topology_required: bool = False
    """Wait rather than place the gang across domains of ``topology_level``."""
    estimated_runtime: float | None = None
    """Seconds (for backfill); default one hour."""
    preemptible: bool = False
    submit_time: float = 0.0
    """Set by the server when 0."""
    command: tuple[str, ...] = ()
    """What each task runs (argv), started by the node's agent; empty: nothing."""
    workdir: str = ""
    """The tasks' working directory (empty: the agent's per-task one)."""
    grace: float | None = None
    """Seconds from SIGTERM to SIGKILL when a task is stopped (default 10)."""
    max_restarts: int | None = None
    """Failures requeued before the job is held (default 3)."""

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"a job needs at least one task, got tasks={self.tasks}")
        if self.devices_per_task < 0:
            raise ValueError(f"devices_per_task must be >= 0, got {self.devices_per_task}")
        if self.topology_level and self.topology_level not in TOPOLOGY_LEVELS:
            raise ValueError(f"topology_level must be one of {', '.join(TOPOLOGY_LEVELS)}, "
                             f"got {self.topology_level!r}")
        if self.topology_required and not self.topology_level:
            raise ValueError("topology_required needs a topology_level")

    def to_pb(self) -> pb.JobSpec:
        """The wire message."""
        m = pb.JobSpec(id=self.id, tenant=self.tenant, queue=self.queue, priority=self.priority,
                       tasks=self.tasks, devices_per_task=self.devices_per_task,
                       cpu_milli=self.cpu_milli, memory_mib=self.memory_mib,
                       selector=self.selector, topology_level=self.topology_level,
                       topology_required=self.topology_required, preemptible=self.preemptible,
                       submit_time=self.submit_time, command=list(self.command),
                       workdir=self.workdir)
        if self.grace is not None:
            m.grace = self.grace
        if self.max_restarts is not None:
            m.max_restarts = self.max_restarts
        if self.gpu_milli is not None:
            m.gpu_milli = self.gpu_milli
        if self.estimated_runtime is not None:
            m.estimated_runtime = self.estimated_runtime
        return m

    @classmethod
    def from_pb(cls, m: pb.JobSpec) -> JobSpec:
        """From the wire message."""
        return cls(id=m.id, tenant=m.tenant, queue=m.queue, priority=int(m.priority),
                   tasks=int(m.tasks) if m.HasField("tasks") else 1,
                   devices_per_task=(int(m.devices_per_task) if m.HasField("devices_per_task")
                                     else 1),
                   gpu_milli=int(m.gpu_milli) if m.HasField("gpu_milli") else None,
                   cpu_milli=int(m.cpu_milli), memory_mib=int(m.memory_mib), selector=m.selector,
                   topology_level=m.topology_level, topology_required=m.topology_required,
                   estimated_runtime=(float(m.estimated_runtime)
                                      if m.HasField("estimated_runtime") else None),
                   preemptible=m.preemptible, submit_time=float(m.submit_time),
                   command=tuple(m.command), workdir=m.workdir,
                   grace=float(m.grace) if m.HasField("grace") else None,
                   max_restarts=int(m.max_restarts) if m.HasField("max_restarts") else None)


@dataclass(frozen=True, slots=True)
class TaskLaunch:
    """What one task's launcher needs: where, which devices, and its environment."""

    rank: int
    host: str
    address: str
    devices: tuple[int, ...]
    vendor: str
    numa_nodes: tuple[int, ...]
    cpus: str
    nics: tuple[str, ...]
    env: dict[str, str]
    """Device visibility plus MASTER_ADDR/PORT, WORLD_SIZE, NODE_RANK..."""
    argv: tuple[str, ...]
    """torchrun arguments."""

    @classmethod
    def from_pb(cls, t: pb.TaskLaunch) -> TaskLaunch:
        """From the wire message."""
        return cls(int(t.rank), t.host, t.address, tuple(t.devices), t.vendor,
                   tuple(t.numa_nodes), t.cpus, tuple(t.nics), dict(t.env), tuple(t.argv))

    def to_pb(self) -> pb.TaskLaunch:
        """The wire message."""
        return pb.TaskLaunch(rank=self.rank, host=self.host, address=self.address,
                             devices=list(self.devices), vendor=self.vendor,
                             numa_nodes=list(self.numa_nodes), cpus=self.cpus,
                             nics=list(self.nics), env=dict(self.env), argv=list(self.argv))


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """How one task of the current attempt is doing, as its agent reported."""

    rank: int
    node: str
    state: str
    """placed, running, exited or lost."""
    start_time: float
    end_time: float
    exit_code: int | None
    """-N: killed by signal N; None while it runs."""
    reason: str

    @classmethod
    def from_pb(cls, t: pb.TaskStatus) -> TaskStatus:
        """From the wire message."""
        return cls(int(t.rank), t.node, t.state, float(t.start_time), float(t.end_time),
                   int(t.exit_code) if t.HasField("exit_code") else None, t.reason)

    def to_pb(self) -> pb.TaskStatus:
        """The wire message."""
        m = pb.TaskStatus(rank=self.rank, node=self.node, state=self.state,
                          start_time=self.start_time, end_time=self.end_time, reason=self.reason)
        if self.exit_code is not None:
            m.exit_code = self.exit_code
        return m


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the scheduler knows it."""

    spec: JobSpec
    status: str
    """One of :data:`JOB_STATES`."""
    tasks: tuple[TaskLaunch, ...]
    """Per-rank launch facts while it runs."""
    start_time: float
    end_time: float
    master_port: int
    starts: int
    requeues: int
    reason: str
    task_status: tuple[TaskStatus, ...] = ()
    """The tasks of attempt ``starts``, as their agents reported them."""
    failures: int = 0

    @property
    def id(self) -> str:
        """The job's id."""
        return self.spec.id

    @classmethod
    def from_pb(cls, j: pb.JobInfo) -> Job:
        """From the wire message."""
        return cls(JobSpec.from_pb(j.spec), j.status, tuple(TaskLaunch.from_pb(t) for t in j.tasks),
                   float(j.start_time), float(j.end_time), int(j.master_port), int(j.starts),
                   int(j.requeues), j.reason, tuple(TaskStatus.from_pb(t) for t in j.task_status),
                   int(j.failures))

    def to_pb(self) -> pb.JobInfo:
        """The wire message (what ``accord jobs show --json`` prints)."""
        return pb.JobInfo(spec=self.spec.to_pb(), status=self.status,
                          tasks=[t.to_pb() for t in self.tasks], start_time=self.start_time,
                          end_time=self.end_time, master_port=self.master_port,
                          starts=self.starts, requeues=self.requeues, reason=self.reason,
                          task_status=[t.to_pb() for t in self.task_status],
                          failures=self.failures)


@dataclass(frozen=True, slots=True)
class PlacementEvent:
    """A placement, requeue, preemption, cancel or finish, at a scheduler log index."""

    index: int
    kind: str
    """One of :data:`EVENT_KINDS`."""
    job_id: str
    reason: str
    tasks: tuple[TaskLaunch, ...]
    """For ``placed``: each rank's launch facts."""
    attempt: int = 0
    """The job's ``starts``: a placement's new attempt, the attempt others ended."""
    spec: JobSpec | None = None
    """For ``placed``: the job (its command, workdir, grace)."""

    @classmethod
    def from_pb(cls, e: pb.PlacementEvent) -> PlacementEvent:
        """From the wire message."""
        return cls(int(e.index), e.kind, e.job_id, e.reason,
                   tuple(TaskLaunch.from_pb(t) for t in e.tasks), int(e.attempt),
                   JobSpec.from_pb(e.spec) if e.HasField("spec") else None)

    def to_pb(self) -> pb.PlacementEvent:
        """The wire message (what ``accord jobs watch --json`` prints)."""
        m = pb.PlacementEvent(index=self.index, kind=self.kind, job_id=self.job_id,
                              reason=self.reason, tasks=[t.to_pb() for t in self.tasks],
                              attempt=self.attempt)
        if self.spec is not None:
            m.spec.CopyFrom(self.spec.to_pb())
        return m


AttributeValue = str | int | float | bool
"""A device attribute's value (the wire's ``text``, ``integer``, ``number`` or ``flag``)."""


def _attribute_value(a: pb.Attribute) -> AttributeValue | None:
    which = a.WhichOneof("value")
    if which is None:
        return None
    v: AttributeValue = getattr(a, which)
    return v


def _attribute_pb(name: str, v: AttributeValue | None) -> pb.Attribute:
    if v is None:
        return pb.Attribute(name=name)
    if isinstance(v, bool):  # before int: a bool is an int
        return pb.Attribute(name=name, flag=v)
    if isinstance(v, int):
        return pb.Attribute(name=name, integer=v)
    if isinstance(v, float):
        return pb.Attribute(name=name, number=v)
    return pb.Attribute(name=name, text=v)


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator of a node."""

    index: int
    vendor: str
    model: str
    memory: int
    """Bytes."""
    arch: str
    capability: float
    island: int
    pcie_switch: int
    numa: int
    attributes: tuple[tuple[str, AttributeValue | None], ...] = ()
    """Further facts selectors can test, as (name, value) in the node's order."""

    @classmethod
    def from_pb(cls, d: pb.Device) -> Device:
        """From the wire message."""
        return cls(int(d.index), d.vendor, d.model, int(d.memory), d.arch, float(d.capability),
                   int(d.island), int(d.pcie_switch), int(d.numa),
                   tuple((a.name, _attribute_value(a)) for a in d.attributes))

    def to_pb(self) -> pb.Device:
        """The wire message."""
        return pb.Device(index=self.index, vendor=self.vendor, model=self.model,
                         memory=self.memory, arch=self.arch, capability=self.capability,
                         island=self.island, pcie_switch=self.pcie_switch, numa=self.numa,
                         attributes=[_attribute_pb(k, v) for k, v in self.attributes])


@dataclass(frozen=True, slots=True)
class Nic:
    """A network interface of a node and its NUMA node."""

    name: str
    numa: int


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node registered with the scheduler."""

    name: str
    address: str
    devices: tuple[Device, ...]
    cpu_milli: int
    memory_mib: int
    leaf: str
    spine: str
    block: str
    alive: bool
    drained: bool
    last_heartbeat: float
    """Unix seconds."""
    unhealthy: tuple[int, ...]
    """Indices of devices reported failed."""
    running_jobs: tuple[str, ...]
    agent_endpoint: str = ""
    """Where the node's agent serves task logs (its scheme says TLS or not); "" if none."""
    numa_cpus: tuple[str, ...] = ()
    """CPU list per NUMA node, e.g. ``"0-55,112-167"``."""
    nics: tuple[Nic, ...] = ()
    orphan_timeout: float | None = None
    """Seconds without a heartbeat the cluster took after which the node's agent stops
    its tasks by itself (what it registered); None: no such promise."""

    @property
    def state(self) -> str:
        """``dead``, ``drained`` or ``ready``."""
        return "dead" if not self.alive else "drained" if self.drained else "ready"

    @classmethod
    def from_pb(cls, n: pb.NodeInfo) -> Node:
        """From the wire message."""
        s = n.spec
        return cls(s.name, s.address, tuple(Device.from_pb(d) for d in s.devices),
                   int(s.cpu_milli), int(s.memory_mib), s.leaf, s.spine, s.block, n.alive,
                   n.drained, float(n.last_heartbeat), tuple(n.unhealthy), tuple(n.running_jobs),
                   n.agent_endpoint, tuple(s.numa_cpus),
                   tuple(Nic(x.name, int(x.numa)) for x in s.nics),
                   float(n.orphan_timeout) if n.HasField("orphan_timeout") else None)

    def to_pb(self) -> pb.NodeInfo:
        """The wire message (what ``accord nodes ls --json`` prints)."""
        spec = pb.NodeSpec(name=self.name, address=self.address, cpu_milli=self.cpu_milli,
                           memory_mib=self.memory_mib, devices=[d.to_pb() for d in self.devices],
                           numa_cpus=list(self.numa_cpus),
                           nics=[pb.Nic(name=x.name, numa=x.numa) for x in self.nics],
                           leaf=self.leaf, spine=self.spine, block=self.block)
        return pb.NodeInfo(spec=spec, alive=self.alive, drained=self.drained,
                           last_heartbeat=self.last_heartbeat, unhealthy=list(self.unhealthy),
                           running_jobs=list(self.running_jobs),
                           agent_endpoint=self.agent_endpoint,
                           orphan_timeout=self.orphan_timeout)


@dataclass(frozen=True, slots=True)
class SchedulerStatus:
    """Who leads the scheduling shard, as one member sees it."""

    member_id: int
    leader_id: int
    term: int
    is_leader: bool
    applied_index: int
    pending_jobs: int
    running_jobs: int


class SchedulerApi:
    """``client.scheduler``: the ``accord.scheduling.v1.Scheduler`` service."""

    def __init__(self, pool: EndpointPool) -> None:
        self._pool = pool
        self._watches: set[PlacementWatch] = set()

    async def _unary(self, method: str, req: Any, timeout: float | None) -> Any:
        async def call(ch: grpc.aio.Channel, t: float) -> Any:
            return await getattr(_rpc.SchedulerStub(ch), method)(req, timeout=t)
        # reads are idempotent; every mutation carries a request id the scheduler dedups
        return await self._pool.call(call, idempotent=True, timeout=timeout)

    # --- jobs ----------------------------------------------------------------------------
    async def submit(self, spec: JobSpec, *, timeout: float | None = None) -> str:
        """Queue a job; its id. Refused (:class:`ClientError`, ``FAILED_PRECONDITION``)
        when no registered node could ever hold it."""
        r = await self._unary("SubmitJob", pb.SubmitJobRequest(
            job=spec.to_pb(), request_id=request_id()), timeout)
        return str(r.job_id)

    async def get(self, job_id: str, *, timeout: float | None = None) -> Job:
        """One job (:class:`~accord.client.errors.NotFound` if unknown)."""
        return Job.from_pb(await self._unary("GetJob", pb.GetJobRequest(job_id=job_id), timeout))

    async def jobs(self, *, status: str = "", tenant: str = "",
                   timeout: float | None = None) -> list[Job]:
        """Jobs, optionally only those in ``status`` and of ``tenant``."""
        if status and status not in JOB_STATES:
            raise ValueError(f"status must be one of {', '.join(JOB_STATES)}, got {status!r}")
        r = await self._unary("ListJobs", pb.ListJobsRequest(status=status, tenant=tenant),
                              timeout)
        return [Job.from_pb(j) for j in r.jobs]

    async def cancel(self, job_id: str, *, timeout: float | None = None) -> None:
        """Cancel a pending or running job."""
        await self._unary("CancelJob", pb.CancelJobRequest(job_id=job_id,
                                                           request_id=request_id()), timeout)

    async def hold(self, job_id: str, *, timeout: float | None = None) -> None:
        """Keep a pending job out of the queue until :meth:`release` (Slurm's ``scontrol
        hold``); a job that is not pending is refused (``FAILED_PRECONDITION``)."""
        await self._unary("HoldJob", pb.HoldJobRequest(job_id=job_id,
                                                       request_id=request_id()), timeout)

    async def release(self, job_id: str, *, timeout: float | None = None) -> None:
        """Put a held job back in the queue, its failures counted from zero (Slurm's
        ``scontrol release``): held by :meth:`hold`, or after failing more often than
        its ``max_restarts``. A job that is not held is refused (``FAILED_PRECONDITION``)."""
        await self._unary("ReleaseJob", pb.ReleaseJobRequest(job_id=job_id,
                                                             request_id=request_id()), timeout)

    async def job_finished(self, job_id: str, *, failed: bool = False,
                           timeout: float | None = None) -> None:
        """Report that a running job ended (``failed``: it did not succeed)."""
        await self._unary("JobFinished", pb.JobFinishedRequest(
            job_id=job_id, failed=failed, request_id=request_id()), timeout)

    async def wait_placed(self, job_id: str, *, timeout: float = 60.0,
                          poll_s: float = 0.2) -> Job:
        """Wait until the job leaves ``pending``; the job then (running, or ended)."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get(job_id)
            if job.status != "pending":
                return job
            if time.monotonic() >= deadline:
                raise Unavailable(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"job {job_id} still pending after {timeout:.0f}s "
                                  f"({job.reason or 'no reason given'})",
                                  hint="no node fits it now: see `accord nodes --gpus`")
            await asyncio.sleep(poll_s)

    def watch_placements(self, job_id: str = "", *, start_index: int = 0) -> PlacementWatch:
        """Placement events (of one job, or of all) as an async iterator that resumes
        across disconnects; ``start_index`` > 0 first replays the member's buffered
        events from that log index."""
        w = PlacementWatch(self._pool, job_id, start_index, self._watches.discard)
        self._watches.add(w)
        return w

    async def log_endpoint(self, job_id: str, rank: int = 0, *,
                           timeout: float | None = None) -> str:
        """Where the agent that ran ``job_id``'s task ``rank`` serves its logs.

        :class:`~accord.client.errors.NotFound` when the job is unknown, the rank was
        never placed, or its node has no agent serving logs."""
        job = await self.get(job_id, timeout=timeout)
        node = next((t.node for t in job.task_status if t.rank == rank), "")
        if not node:
            raise NotFound(grpc.StatusCode.NOT_FOUND,
                           f"job {job_id} has no rank {rank} placed yet ({job.status})",
                           endpoint=self._pool.current,
                           hint="wait for the placement (`accord jobs watch JOB`)")
        agent = next((n.agent_endpoint for n in await self.nodes(timeout=timeout)
                      if n.name == node), "")
        if not agent:
            raise NotFound(grpc.StatusCode.NOT_FOUND,
                           f"node {node} has no agent serving logs",
                           endpoint=self._pool.current,
                           hint="logs are read through the node's `accord nodes agent`")
        return agent

    async def logs(self, job_id: str, *, rank: int = 0, attempt: int = 0,
                   stream: str = "stdout", offset: int = 0, follow: bool = False,
                   timeout: float | None = None) -> AsyncIterator[LogChunk]:
        """A task's ``stdout`` or ``stderr`` as :class:`~accord.client.tasklogs.LogChunk` s,
        read through the agent of the node it ran on (see :mod:`accord.client.tasklogs`):
        ``attempt`` 0 is the newest, ``follow`` waits for more until the task ends."""
        check_request(stream, rank, attempt, offset)
        agent = await self.log_endpoint(job_id, rank)
        async for chunk in read_log(self._pool, agent, job_id, rank=rank, attempt=attempt,
                                    stream=stream, offset=offset, follow=follow,
                                    timeout=timeout):
            yield chunk

    async def status(self, *, timeout: float | None = None) -> SchedulerStatus:
        """Who leads the scheduling shard, as the current endpoint sees it."""
        r = await self._unary("Status", pb.StatusRequest(), timeout)
        return SchedulerStatus(int(r.member_id), int(r.leader_id), int(r.term), r.is_leader,
                               int(r.applied_index), int(r.pending_jobs), int(r.running_jobs))

    # --- nodes ---------------------------------------------------------------------------
    async def nodes(self, *, timeout: float | None = None) -> list[Node]:
        """Every registered node."""
        r = await self._unary("ListNodes", pb.ListNodesRequest(), timeout)
        return [Node.from_pb(n) for n in r.nodes]

    async def drain(self, node: str, *, timeout: float | None = None) -> list[str]:
        """Place nothing new on ``node``; the jobs still running there."""
        r = await self._unary("DrainNode", pb.NodeRequest(node=node, request_id=request_id()),
                              timeout)
        return list(r.running_jobs)

    async def undrain(self, node: str, *, timeout: float | None = None) -> list[str]:
        """Let a drained node take work again; the jobs running there."""
        r = await self._unary("UndrainNode", pb.NodeRequest(node=node, request_id=request_id()),
                              timeout)
        return list(r.running_jobs)

    async def register_node(self, spec: pb.NodeSpec, *, agent_endpoint: str = "",
                            orphan_timeout: float | None = None,
                            timeout: float | None = None) -> str:
        """Add a node (or refresh an idle one's inventory); its name. ``spec`` is the wire
        ``NodeSpec`` (as agents read it from discovery or a JSON file).

        For an agent of one's own: ``agent_endpoint`` is where it serves task logs, and
        ``orphan_timeout`` its promise to stop the node's tasks by itself that many seconds
        after sending the last heartbeat the cluster took; the scheduler then requeues the
        node's jobs elsewhere only after that plus their stop grace (``docs/agent.md``).
        Promise it only if the agent keeps it."""
        r = await self._unary("RegisterNode", pb.RegisterNodeRequest(
            node=spec, request_id=request_id(), agent_endpoint=agent_endpoint,
            orphan_timeout=orphan_timeout), timeout)
        return str(r.node)

    async def heartbeat(self, node: str, *, unhealthy: Sequence[int] = (),
                        timeout: float | None = None) -> list[str]:
        """Prove ``node`` alive (``unhealthy``: its failed devices); jobs requeued.
        :class:`ClientError` ``FAILED_PRECONDITION`` if the node was declared dead."""
        r = await self._unary("Heartbeat", pb.HeartbeatRequest(
            node=node, unhealthy=list(unhealthy), request_id=request_id()), timeout)
        return list(r.requeued)

    async def close(self) -> None:
        """End every placement watch of this client."""
        for w in list(self._watches):
            await w.close()


class PlacementWatch:
    """Placement events as an async iterator; resumes from the last index it saw."""

    def __init__(self, pool: EndpointPool, job_id: str, start_index: int,
                 on_close: Any = None) -> None:
        if start_index < 0:
            raise ValueError(f"start_index must be >= 0, got {start_index}")
        self._pool = pool
        self.job_id = job_id
        self.next_index = start_index
        """The log index the watch resumes from (0 until pinned at the first stream)."""
        self.reconnects = 0
        self._on_close = on_close
        self._gen: AsyncIterator[PlacementEvent] | None = None
        self._closed = False

    def __aiter__(self) -> AsyncIterator[PlacementEvent]:
        if self._gen is None:
            self._gen = self._events()
        return self._gen

    async def __anext__(self) -> PlacementEvent:
        return await self.__aiter__().__anext__()

    async def __aenter__(self) -> PlacementWatch:
        """Pin the start now: every event committed after entering is delivered, even one
        that happens before the first read (a job submitted inside the ``async with``)."""
        if self.next_index == 0:
            with contextlib.suppress(grpc.RpcError):  # else the first read pins it
                await self._pin(self._pool.channel(self._pool.current))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop watching."""
        if self._closed:
            return
        self._closed = True
        if self._gen is not None:
            with contextlib.suppress(Exception):
                await self._gen.aclose()  # type: ignore[attr-defined]
        if self._on_close is not None:
            self._on_close(self)

    async def _pin(self, ch: grpc.aio.Channel) -> None:
        """Start from the member's applied index, so nothing after "now" is missed."""
        st = await _rpc.SchedulerStub(ch).Status(pb.StatusRequest(),
                                                 timeout=self._pool.call_timeout_s)
        self.next_index = int(st.applied_index) + 1

    async def _events(self) -> AsyncIterator[PlacementEvent]:
        failing_since: float | None = None
        attempt = 0
        last = ""
        while not self._closed:
            ep = self._pool.current
            ch = self._pool.channel(ep)
            stream: Any = None
            try:
                if self.next_index == 0:
                    await self._pin(ch)
                stream = _rpc.SchedulerStub(ch).WatchPlacements(pb.WatchPlacementsRequest(
                    job_id=self.job_id, start_index=self.next_index))
                await stream.wait_for_connection()
                failing_since, attempt = None, 0
                async for e in stream:
                    if e.index and e.index < self.next_index:
                        continue  # delivered before the reconnect
                    self.next_index = max(self.next_index, int(e.index) + 1)
                    yield PlacementEvent.from_pb(e)
                last = "stream ended by the server"
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN):
                    raise ClientError(e.code(), e.details() or "", endpoint=ep) from None
                last = f"{e.code().name}: {e.details()}"
            finally:
                if stream is not None:
                    stream.cancel()
            if self._closed:
                return
            self._pool.fail_over(ep)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > self._pool.retry_budget_s:
                raise Unavailable(grpc.StatusCode.UNAVAILABLE,
                                  f"placement watch: no endpoint answered for "
                                  f"{self._pool.retry_budget_s:.0f}s; last error: {last}",
                                  endpoint=ep)
            await asyncio.sleep(self._pool.policy.backoff.delay(attempt))
            attempt += 1
            self.reconnects += 1
