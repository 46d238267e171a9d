"""The node agent: registers the machine, runs the tasks placed on it, reports them.

``NodeAgent`` owns three loops, the report deliveries and the tasks' processes:

- heartbeat: every ``heartbeat`` seconds, with the devices discovery holds unhealthy
  (re-checked every ``health_interval``); a node the scheduler declared dead registers
  again. It also watches the agent's contact with the cluster: ``orphan_timeout``
  seconds after sending the last heartbeat the cluster took, it stops every task (it no
  longer knows whether they are still wanted), but not before, so a short blip restarts
  nothing. Only heartbeats count (not reads or reports), and from their sending, so the
  agent's deadline is never later than the one the scheduler computes from the
  heartbeat's commit: the agent registers ``orphan_timeout``, and the scheduler declares
  the node dead (and requeues its jobs elsewhere) only after it plus the jobs' stop
  grace, so a job never runs twice across a partition.
- watch: the ``WatchPlacements`` stream, for low latency: a ``placed`` event naming this
  node starts its tasks at once; any other event of a job (requeued, preempted,
  cancelled, finished) stops its tasks of that attempt or older, a preemption telling
  the task first (``ACCORD_PREEMPT_FILE``, see ``runner``).
- reconcile: every ``reconcile`` seconds, the linearizable list of running jobs with a
  task here (``ListJobs(node=...)``): tasks missing here start, tasks here the list no
  longer holds stop. This covers events a broken stream missed. A task started after
  the list was requested is left alone (the list may predate its placement).
- reports: task state changes (``running``, ``exited`` with the exit code, ``lost``) go
  to the scheduler in order per task (tasks report in parallel), each with a fixed
  request id and retried until the scheduler answers; a refusal (the job moved on)
  drops the report.

Each task runs under a keeper (``keeper.py``) that stops it when the agent dies, or
when the deadline the agent renews after each heartbeat the cluster took passes (the
orphan deadline plus ``KEEPER_SLACK``): a killed or paused agent leaves no task running
past the scheduler's fence. On start, tasks an earlier life of the agent left running
anyway (``runner.leftovers``: their keeper was killed too) are killed: the agent cannot
supervise processes that are not its children, so a task the scheduler still assigns
here is also reported ``lost`` (the job is requeued without counting as a failure). On
stop (SIGTERM), the agent stops its tasks and reports them lost, so their jobs are
requeued at once rather than after the failure detector.

TLS: given ``TLSOptions`` (``--cacert/--cert/--key``), the agent dials the cluster as the
client library does, and with a certificate and key it also serves its log service over
TLS with them (so the certificate must allow both uses, as the members' certificates of
``accord.node.certs`` do); the endpoint it registers carries its scheme (``https://`` or
``http://``), so ``accord jobs logs`` dials it the right way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from accord.agent.discovery.inventory import Discoverer
from accord.agent.link import SchedulerLink
from accord.agent.logs import AgentServicer, add_agent_service
from accord.agent.runner import TaskKey, TaskProcess, kill_leftover, leftovers
from accord.client.tls import TLSOptions
from accord.proto import scheduling_pb2 as pb
from accord.services.scheduling.launch import VISIBILITY_ENV
from accord.services.scheduling.model import Node
from accord.services.scheduling.servicer import node_to_pb

log = logging.getLogger("accord.agent")

CALL_TIMEOUT = 10.0
KEEPER_SLACK = 0.75
"""Seconds the keepers wait past the agent's orphan deadline before they stop a task
themselves: the agent's own timer (at most 0.5 s a step) normally goes first, and the
keeper acts only when the agent is dead or paused. It must stay below the scheduler's
``fence_margin`` (2 s), which the fence adds for exactly such differences."""
STALE = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.INVALID_ARGUMENT)
"""Answers that mean a report is about a job that has moved on: drop it."""


@dataclass(slots=True)
class AgentConfig:
    """The agent's timings and where it serves."""

    heartbeat: float = 0.5
    reconcile: float = 2.0
    orphan_timeout: float = 10.0
    """Seconds without a heartbeat the cluster took (counted from the sending of the last
    one it took) before the agent stops its tasks. Registered with the node, so the
    scheduler requeues the node's jobs only after that, plus their stop grace."""
    health_interval: float = 10.0
    max_beats: int = 0
    """Stop after this many heartbeats (0: run until stopped)."""
    listen: str = "0.0.0.0:0"
    """Where the agent serves task logs."""
    advertise: str = ""
    """Host the scheduler tells clients for the agent (default: the node's address)."""
    leftover_grace: float = 5.0

    def __post_init__(self) -> None:
        if self.heartbeat <= 0 or self.orphan_timeout <= 2 * self.heartbeat:
            raise ValueError(
                f"orphan timeout {self.orphan_timeout:g}s must be more than two heartbeat "
                f"intervals ({self.heartbeat:g}s each): one lost heartbeat must not stop "
                "the tasks")


@dataclass(slots=True)
class LocalTask:
    """A task this agent started."""

    proc: TaskProcess
    devices: tuple[int, ...]
    grace: float
    launched: float
    """Monotonic time of the launch (reconcile leaves younger tasks alone)."""
    waiter: asyncio.Task[None] | None = None
    stopper: asyncio.Task[int] | None = None


@dataclass(slots=True)
class Report:
    key: TaskKey
    state: str
    exit_code: int = 0
    reason: str = ""
    request_id: str = field(default_factory=lambda: f"agent-{uuid.uuid4().hex[:16]}")


class NodeAgent:
    """One node's agent (see the module docstring)."""

    def __init__(self, endpoints: list[str], node: Node, state_dir: Path,
                 config: AgentConfig | None = None, *, discoverer: Discoverer | None = None,
                 mig: Mapping[int, tuple[str, ...]] | None = None,
                 base_env: Mapping[str, str] | None = None,
                 on_event: Callable[[str], None] | None = None,
                 tls: TLSOptions | None = None) -> None:
        self.link = SchedulerLink(endpoints, tls)
        self.tls = tls
        self.node = node
        self.name = node.name
        self.config = config or AgentConfig()
        self.discoverer = discoverer
        self.mig = dict(mig or {})
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.task_root = state_dir / "tasks"
        self.tasks: dict[TaskKey, LocalTask] = {}
        self.done: dict[TaskKey, None] = {}
        """Tasks that ended here (never started again for the same attempt)."""
        self.unhealthy: dict[int, str] = {}
        self.beats = 0
        self.endpoint = ""
        self.last_beat = time.monotonic()
        """When the last heartbeat (or registration) the cluster took was sent."""
        self.on_event = on_event or (lambda line: None)
        self._last_report: dict[TaskKey, asyncio.Task[None]] = {}
        self._delivering: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._finished = asyncio.Event()
        self._stopping = False

    # ----- life ------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve logs, register, clear leftovers, start the loops."""
        self.task_root.mkdir(parents=True, exist_ok=True)
        self._server = grpc.aio.server()
        add_agent_service(self._server, AgentServicer(self.task_root, self._is_running))
        tls = self.tls
        if tls is not None and tls.cert and tls.key:
            key, cert = await asyncio.to_thread(
                lambda: (Path(tls.key or "").read_bytes(), Path(tls.cert or "").read_bytes()))
            creds = grpc.ssl_server_credentials([(key, cert)])
            port, scheme = self._server.add_secure_port(self.config.listen, creds), "https"
        else:
            port, scheme = self._server.add_insecure_port(self.config.listen), "http"
        if port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        await self._server.start()
        host = self.config.advertise or self.node.address
        self.endpoint = f"{scheme}://{host}:{port}"
        if self.discoverer is not None:
            self.unhealthy = await asyncio.to_thread(self.discoverer.health)
        await self._register()
        await self._clear_leftovers()
        self._loops = [asyncio.create_task(c, name=f"agent-{n}") for n, c in (
            ("heartbeat", self._heartbeat_loop()), ("watch", self._watch_loop()),
            ("reconcile", self._reconcile_loop()), ("orphan", self._orphan_loop()))]

    async def wait(self) -> None:
        """Until ``max_beats`` heartbeats were sent (forever when 0)."""
        await self._finished.wait()

    async def stop(self, *, report: bool = True) -> None:
        """Stop the tasks (reported lost, best effort), the loops and the log service."""
        self._stopping = True
        stops = [self._stop_task(k, reason="agent stopped") for k in list(self.tasks)]
        if stops:
            await asyncio.gather(*stops, return_exceptions=True)
        for k in [k for k in self.tasks]:
            t = self.tasks[k]
            if t.waiter is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(t.waiter), 5.0)
        if report:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._drain_reports()
        pending = [*self._loops, *self._delivering]
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loops = []
        if self._server is not None:
            await self._server.stop(0.5)
        await self.link.close()

    def _is_running(self, key: TaskKey) -> bool:
        t = self.tasks.get(key)
        return t is not None and t.proc.exit_code is None

    # ----- registration and heartbeats ------------------------------------------------------

    async def _register(self) -> None:
        req = pb.RegisterNodeRequest(node=node_to_pb(self.node), agent_endpoint=self.endpoint,
                                     request_id=f"agent-reg-{uuid.uuid4().hex[:16]}",
                                     orphan_timeout=self.config.orphan_timeout)
        deadline = time.monotonic() + 60.0
        while True:
            sent = time.monotonic()
            try:
                await self.link.unary("RegisterNode", req, CALL_TIMEOUT)
                break
            except grpc.RpcError as e:
                if e.code() in STALE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self._taken(sent)
        self.on_event(f"{self.name} registered ({len(self.node.devices)} devices) "
                      f"agent {self.endpoint}")

    async def _heartbeat_loop(self) -> None:
        last_health = time.monotonic()
        while True:
            await asyncio.sleep(self.config.heartbeat)
            now = time.monotonic()
            if self.discoverer is not None and now - last_health >= self.config.health_interval:
                last_health = now
                bad = await asyncio.to_thread(self.discoverer.health)
                for i in bad.keys() - self.unhealthy.keys():
                    log.warning("device %s of %s is unhealthy: %s", i, self.name, bad[i])
                self.unhealthy = bad
            req = pb.HeartbeatRequest(node=self.name, unhealthy=sorted(self.unhealthy),
                                      request_id=f"agent-hb-{uuid.uuid4().hex[:16]}")
            sent = time.monotonic()
            try:
                await self.link.unary("Heartbeat", req, CALL_TIMEOUT)
                self._taken(sent)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("%s was declared dead; registering again", self.name)
                    with contextlib.suppress(grpc.RpcError):
                        await self._register()
                else:
                    log.info("heartbeat failed: %s", e.code().name)
            self.beats += 1
            if self.config.max_beats and self.beats >= self.config.max_beats:
                self._finished.set()

    async def _orphan_loop(self) -> None:
        """Stop the tasks on time however long a heartbeat call hangs (a partition that
        drops packets holds one for its whole timeout): checked on a timer of its own,
        a tenth of the orphan timeout apart (at most 0.5 s)."""
        step = min(0.5, max(0.01, self.config.orphan_timeout / 10))
        while True:
            await asyncio.sleep(step)
            self._check_orphaned()

    def _taken(self, sent: float) -> None:
        """A heartbeat (or registration) sent at ``sent`` reached the cluster: the orphan
        deadline moves on, here and in every task's keeper."""
        self.last_beat = sent
        deadline = self._keeper_deadline()
        for t in self.tasks.values():
            t.proc.renew(deadline)

    def _keeper_deadline(self) -> float:
        """When a task's keeper stops it unless renewed (``keeper.py``)."""
        return self.last_beat + self.config.orphan_timeout + KEEPER_SLACK

    def _check_orphaned(self) -> None:
        silent = time.monotonic() - self.last_beat
        if silent <= self.config.orphan_timeout:
            return
        for key, t in list(self.tasks.items()):
            if t.stopper is None and t.proc.exit_code is None:
                log.warning("no contact with the cluster for %.0fs: stopping %s", silent,
                            key.dirname)
                self._begin_stop(key, reason="lost contact with the cluster")

    # ----- desired state ------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        delay = 0.1
        while True:
            stub = self.link.stub(self.link.current())
            stream = stub.WatchPlacements(pb.WatchPlacementsRequest(node=self.name))
            try:
                async for ev in stream:
                    delay = 0.1
                    self._on_event(ev)
            except grpc.RpcError as e:
                log.info("placement stream ended: %s", e.code().name)
            finally:
                stream.cancel()
            self.link.rotate()
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    def _on_event(self, ev: pb.PlacementEvent) -> None:
        if ev.kind == "placed":
            for t in ev.tasks:
                if t.host == self.name:
                    self._launch(TaskKey(ev.job_id, t.rank, ev.attempt), ev.spec, t)
            return
        for key in [k for k in self.tasks if k.job_id == ev.job_id and k.attempt <= ev.attempt]:
            self._begin_stop(key, preempt=ev.kind == "preempted", reason=ev.reason or ev.kind)

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except grpc.RpcError as e:
                log.info("reconcile failed: %s", e.code().name)
            await asyncio.sleep(self.config.reconcile)

    async def _held(self) -> dict[TaskKey, tuple[pb.JobSpec, pb.TaskLaunch, str]]:
        req = pb.ListJobsRequest(node=self.name)
        resp = await self.link.unary("ListJobs", req, CALL_TIMEOUT)
        want = {}
        for j in resp.jobs:
            states = {ts.rank: ts.state for ts in j.task_status}
            for t in j.tasks:
                if t.host == self.name:
                    want[TaskKey(j.spec.id, t.rank, j.starts)] = (j.spec, t,
                                                                   states.get(t.rank, "placed"))
        return want

    async def reconcile(self) -> None:
        """Start what the scheduler holds here and this agent lacks; stop the converse."""
        asked = time.monotonic()
        want = await self._held()
        for key, (spec, launch, state) in want.items():
            if key not in self.tasks and key not in self.done and state in ("placed", "running"):
                self._launch(key, spec, launch)
        for key, t in list(self.tasks.items()):
            if key not in want and t.launched < asked and t.stopper is None:
                preempt = False
                with contextlib.suppress(grpc.RpcError):
                    info = await self.link.unary("GetJob", pb.GetJobRequest(job_id=key.job_id),
                                                 CALL_TIMEOUT)
                    preempt = info.reason == "preempted"
                self._begin_stop(key, preempt=preempt, reason="no longer placed here")
        for key in [k for k in self.done if k not in want]:
            del self.done[key]

    async def _clear_leftovers(self) -> None:
        found = await asyncio.to_thread(leftovers, self.task_root)
        if not found:
            return
        try:
            want = await self._held()
        except grpc.RpcError:
            want = {}
        for left in found:
            log.warning("killing task %s (pid %d) left by an earlier agent", left.key.dirname,
                        left.pid)
            await kill_leftover(left, self.config.leftover_grace)
            self.on_event(f"killed leftover {left.key.dirname} pid {left.pid}")
            if left.key in want:
                self.done[left.key] = None
                self._report(Report(left.key, "lost", reason="agent restarted"))

    # ----- tasks -----------------------------------------------------------------------------

    def _env(self, key: TaskKey, launch: pb.TaskLaunch) -> dict[str, str]:
        env = dict(self.base_env)
        env.update(launch.env)
        env.update(ACCORD_JOB_ID=key.job_id, ACCORD_RANK=str(key.rank),
                   ACCORD_ATTEMPT=str(key.attempt), ACCORD_NODE=self.name)
        if launch.vendor == "nvidia" and any(d in self.mig for d in launch.devices):
            # MIG mode: CUDA names the instances by UUID, not the parent's index.
            names: list[str] = []
            for d in launch.devices:
                names.extend(self.mig.get(d, (str(d),)))
            env[VISIBILITY_ENV["nvidia"]] = ",".join(names)
        return env

    def _launch(self, key: TaskKey, spec: pb.JobSpec, launch: pb.TaskLaunch) -> None:
        if not spec.command or key in self.tasks or key in self.done or self._stopping:
            return
        grace = spec.grace if spec.HasField("grace") else 10.0
        proc = TaskProcess(key, list(spec.command), self._env(key, launch), self.task_root,
                           cwd=spec.workdir, cpus=launch.cpus, grace=grace)
        t = LocalTask(proc, tuple(launch.devices), grace, time.monotonic())
        self.tasks[key] = t
        t.waiter = asyncio.create_task(self._supervise(key, t), name=f"task-{key.dirname}")

    async def _supervise(self, key: TaskKey, t: LocalTask) -> None:
        # A task sharing devices with one still stopping waits for it (a preempted
        # victim's memory is only free once its process is gone).
        for other in list(self.tasks.values()):
            if (other is not t and other.stopper is not None and set(other.devices) & set(t.devices)):
                with contextlib.suppress(Exception):
                    await asyncio.shield(other.stopper)
        if t.stopper is not None:  # stopped before it started
            self._finish(key)
            return
        try:
            pid = await t.proc.start(self._keeper_deadline())
        except OSError as e:
            self.on_event(f"task {key.dirname} could not start: {e}")
            self._report(Report(key, "exited", 127, f"cannot start: {e}"[:500]))
            self._finish(key)
            return
        self.on_event(f"started {key.dirname} pid {pid}")
        self._report(Report(key, "running"))
        code = await t.proc.wait()
        self.on_event(f"exited {key.dirname} code {code}")
        if self._stopping:
            self._report(Report(key, "lost", reason="agent stopped"))
        else:
            self._report(Report(key, "exited", code,
                                            "stopped by the agent" if t.proc.stopping else ""))
        self._finish(key)

    def _finish(self, key: TaskKey) -> None:
        self.tasks.pop(key, None)
        self.done[key] = None

    def _begin_stop(self, key: TaskKey, *, preempt: bool = False, reason: str = "") -> None:
        t = self.tasks.get(key)
        if t is None or t.stopper is not None:
            return
        t.stopper = asyncio.create_task(self._stop_process(t, preempt, reason),
                                        name=f"stop-{key.dirname}")

    async def _stop_process(self, t: LocalTask, preempt: bool, reason: str) -> int:
        if not t.proc.launched:
            return 0  # never started: _supervise sees the stopper and gives up
        if t.proc.exit_code is not None:
            return t.proc.exit_code
        self.on_event(f"stopping {t.proc.key.dirname}" + (" (preempted)" if preempt else "")
                      + (f": {reason}" if reason else ""))
        return await t.proc.stop(t.grace, preempt=preempt, reason=reason)

    async def _stop_task(self, key: TaskKey, *, reason: str) -> None:
        self._begin_stop(key, reason=reason)
        t = self.tasks.get(key)
        if t is not None and t.stopper is not None:
            await t.stopper

    # ----- reports -------------------------------------------------------------------------

    async def _send(self, r: Report) -> bool:
        """True when the scheduler answered (applied or refused); False to retry."""
        req = pb.ReportTaskRequest(job_id=r.key.job_id, rank=r.key.rank, attempt=r.key.attempt,
                                   node=self.name, state=r.state, exit_code=r.exit_code,
                                   reason=r.reason, request_id=r.request_id)
        try:
            await self.link.unary("ReportTask", req, CALL_TIMEOUT)
        except grpc.RpcError as e:
            if e.code() in STALE:
                log.info("report %s %s dropped: %s", r.key.dirname, r.state, e.details())
                return True
            return False
        return True

    def _report(self, r: Report) -> None:
        """Send ``r`` after the earlier reports of the same task (tasks report in parallel)."""
        prev = self._last_report.get(r.key)
        t = asyncio.create_task(self._deliver(r, prev), name=f"report-{r.key.dirname}")
        self._last_report[r.key] = t
        self._delivering.add(t)
        t.add_done_callback(self._delivered)

    def _delivered(self, t: asyncio.Task[None]) -> None:
        self._delivering.discard(t)
        for key, last in list(self._last_report.items()):
            if last is t:
                del self._last_report[key]

    async def _deliver(self, r: Report, prev: asyncio.Task[None] | None) -> None:
        if prev is not None:
            # Wait for the task's earlier report however it ends (done, failed, cancelled)
            # without taking its end for ours: a cancel of *this* delivery (``stop``) still
            # ends it. (Suppressing CancelledError around the wait swallowed our own cancel
            # too, and the delivery then retried a gone cluster forever.)
            await asyncio.wait({prev})
        delay = 0.1
        while not await self._send(r):
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def _drain_reports(self) -> None:
        while self._delivering:
            await asyncio.gather(*list(self._delivering), return_exceptions=True)

async def run_agent(agent: NodeAgent, stop: asyncio.Event,
                    on_started: Callable[[], Awaitable[None]] | None = None) -> None:
    """Start ``agent``, run until ``stop`` is set or its heartbeats are done, then stop it.

    ``on_started`` runs once the agent is registered with the scheduler (the CLI joins
    SWIM there, so a node the cluster sees alive in membership is already one the
    scheduler can place work on)."""
    await agent.start()
    try:
        if on_started is not None:
            await on_started()
        waiter = asyncio.create_task(agent.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for t in (waiter, stopper):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    finally:
        await agent.stop()


def describe(inv_sources: tuple[str, ...], node: Node) -> str:
    """One line about what discovery found."""
    models = sorted({f"{d.vendor}/{d.model}" for d in node.devices})
    return (f"{node.name}: {len(node.devices)} device(s) {', '.join(models) or ''} "
            f"from {', '.join(inv_sources) or 'no accelerator library'}; "
            f"{node.cpu_milli // 1000} CPU(s), {node.memory_mib} MiB").replace("  ", " ")


