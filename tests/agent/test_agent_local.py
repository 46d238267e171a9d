"""NodeAgent against an in-process Scheduler server (one replica): tasks run, report, stop."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from accord.agent.daemon import AgentConfig, NodeAgent, Report, run_agent
from accord.agent.runner import TaskKey
from accord.client.tls import TLSOptions, aio_channel
from accord.node.certs import CertFiles, make_cluster_pki
from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc
from accord.services.scheduling.model import Node
from accord.services.scheduling.replicated import SchedulerShard, ShardConfig, local_shard
from accord.services.scheduling.servicer import add_scheduler_service
from accord.services.scheduling.topology import make_node

PY = sys.executable


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, SchedulerShard]]:
    ep, shard, srv = await _serve()
    try:
        yield ep, shard
    finally:
        await shard.stop()
        await srv.stop(0)


async def _serve(tls: CertFiles | None = None) -> tuple[str, SchedulerShard, grpc.aio.Server]:
    """A one-replica Scheduler server on 127.0.0.1 (leader loop running); over TLS with
    ``tls``'s certificate, and then its endpoint is ``https://``."""
    shard = local_shard(ShardConfig(cycle_interval=0.05, leader_grace=60.0))
    srv = grpc.aio.server()
    add_scheduler_service(srv, shard)
    if tls is None:
        port = srv.add_insecure_port("127.0.0.1:0")
    else:
        creds = grpc.ssl_server_credentials([(tls.key.read_bytes(), tls.cert.read_bytes())])
        port = srv.add_secure_port("127.0.0.1:0", creds)
    await srv.start()
    shard.start()
    return f"{'https://' if tls else ''}127.0.0.1:{port}", shard, srv


async def until(pred: Any, what: str, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.05)


def cpu_node(name: str) -> Node:
    return Node(name, "127.0.0.1", 4000, 4096)


async def submit(ep: str, spec: pb.JobSpec, tls: TLSOptions | None = None) -> None:
    async with aio_channel(ep, tls) as ch:
        stub: Any = scheduling_pb2_grpc.SchedulerStub(ch)  # type: ignore[no-untyped-call]
        await stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=10)


async def test_tasks_run_report_and_succeed_or_fail(server: tuple[str, SchedulerShard],
                                                    tmp_path: Path) -> None:
    ep, shard = server
    cfg = AgentConfig(heartbeat=0.2, reconcile=0.5, listen="127.0.0.1:0")
    agent = NodeAgent([ep], cpu_node("cpu-1"), tmp_path / "a", cfg)
    await agent.start()
    try:
        await submit(ep, pb.JobSpec(id="ok", tasks=2, devices_per_task=0, cpu_milli=1000,
                                    command=[PY, "-c", "import os; print(os.environ['NODE_RANK'])"]))
        await until(lambda: shard.sm.jobs["ok"].status == "succeeded", "ok to succeed")
        rec = shard.sm.jobs["ok"]
        assert [(t.state, t.exit_code) for t in rec.tasks] == [("exited", 0), ("exited", 0)]
        assert all(t.start_time and t.end_time for t in rec.tasks)
        out = (tmp_path / "a/tasks/ok.r1.a1/stdout.log").read_text()
        assert out == "1\n"
        # One rank fails: the job fails (max_restarts 0), the other rank is stopped.
        await submit(ep, pb.JobSpec(
            id="bad", tasks=2, devices_per_task=0, cpu_milli=1000, max_restarts=0, grace=5,
            command=[PY, "-c", "import os, sys, time; r = int(os.environ['NODE_RANK']); "
                               "time.sleep(0.3) if r else time.sleep(60); sys.exit(1)"]))
        await until(lambda: shard.sm.jobs["bad"].status == "failed", "bad to fail")
        await until(lambda: not agent.tasks, "the other rank to be stopped")
        assert "rank 1 exited with 1" in shard.sm.jobs["bad"].reason
        assert shard.sm.running == {} and "bad" not in shard.sm.pending
        # Retries: a job failing every time is held after max_restarts requeues.
        await submit(ep, pb.JobSpec(id="flaky", tasks=1, devices_per_task=0, cpu_milli=1000,
                                    max_restarts=2, command=[PY, "-c", "raise SystemExit(3)"]))
        await until(lambda: shard.sm.jobs["flaky"].status == "held", "flaky to be held")
        r = shard.sm.jobs["flaky"]
        assert (r.starts, r.failures, r.requeues) == (3, 3, 2)
        # Held, fixed, released (Slurm's scontrol release): a job that needs a file
        # fails until an operator creates it, then runs again and succeeds.
        fix = tmp_path / "dataset.ready"
        await submit(ep, pb.JobSpec(
            id="needs-fix", tasks=1, devices_per_task=0, cpu_milli=1000, max_restarts=1,
            command=[PY, "-c", f"import os, sys; sys.exit(0 if os.path.exists({str(fix)!r}) "
                               "else 4)"]))
        await until(lambda: shard.sm.jobs["needs-fix"].status == "held", "needs-fix to be held")
        fix.touch()
        async with grpc.aio.insecure_channel(ep) as ch:
            stub: Any = scheduling_pb2_grpc.SchedulerStub(ch)  # type: ignore[no-untyped-call]
            await stub.ReleaseJob(pb.ReleaseJobRequest(job_id="needs-fix"), timeout=10)
        await until(lambda: shard.sm.jobs["needs-fix"].status == "succeeded",
                    "needs-fix to succeed once released")
        fixed = shard.sm.jobs["needs-fix"]
        assert (fixed.starts, fixed.failures) == (3, 0)
        assert [(t.state, t.exit_code) for t in fixed.tasks] == [("exited", 0)]
    finally:
        await agent.stop()


async def test_cancel_and_preemption_stop_tasks(server: tuple[str, SchedulerShard],
                                                tmp_path: Path) -> None:
    ep, shard = server
    cfg = AgentConfig(heartbeat=0.2, reconcile=0.5, listen="127.0.0.1:0")
    agent = NodeAgent([ep], make_node("gpu-1", gpus=1, address="127.0.0.1"), tmp_path / "a", cfg)
    await agent.start()
    victim = ("import json, os, signal, sys, time\n"
              "def term(*a):\n"
              "    p = os.environ['ACCORD_PREEMPT_FILE']\n"
              "    print('preempted' if os.path.exists(p) else 'cancelled', flush=True)\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, term)\n"
              "print('ready', flush=True)\n"
              "while True: time.sleep(0.05)\n")
    try:
        await submit(ep, pb.JobSpec(id="low", devices_per_task=1, preemptible=True,
                                    command=[PY, "-c", victim]))
        log1 = tmp_path / "a/tasks/low.r0.a1/stdout.log"
        await until(lambda: log1.exists() and "ready" in log1.read_text(), "low to run")
        await submit(ep, pb.JobSpec(id="high", devices_per_task=1, priority=10,
                                    command=[PY, "-c", "print('high')"]))
        await until(lambda: shard.sm.jobs["high"].status == "succeeded", "high to succeed")
        assert "preempted" in (tmp_path / "a/tasks/low.r0.a1/stdout.log").read_text()
        log2 = tmp_path / "a/tasks/low.r0.a2/stdout.log"
        await until(lambda: log2.exists() and "ready" in log2.read_text(), "low to run again")
        assert shard.sm.jobs["low"].starts == 2
        async with grpc.aio.insecure_channel(ep) as ch:
            stub: Any = scheduling_pb2_grpc.SchedulerStub(ch)  # type: ignore[no-untyped-call]
            await stub.CancelJob(pb.CancelJobRequest(job_id="low"), timeout=10)
        await until(lambda: not agent.tasks, "low to be stopped")
        await until(lambda: "cancelled" in (tmp_path / "a/tasks/low.r0.a2/stdout.log").read_text(),
                    "the cancelled task's handler to run")
        assert shard.sm.jobs["low"].status == "cancelled"
    finally:
        await agent.stop()


async def test_unhealthy_device_is_reported_and_avoided(server: tuple[str, SchedulerShard],
                                                        tmp_path: Path) -> None:
    from accord.agent.discovery.inventory import Discoverer
    from tests.agent import fakes, sysfs

    ep, shard = server
    sysfs.two_socket_host(tmp_path / "root")
    nvml = fakes.hgx_h100()
    disc = Discoverer("hgx", "127.0.0.1", nvml=nvml, root=tmp_path / "root")
    inv = disc.inventory()
    cfg = AgentConfig(heartbeat=0.1, reconcile=0.5, health_interval=0.2, listen="127.0.0.1:0")
    agent = NodeAgent([ep], inv.node, tmp_path / "a", cfg, discoverer=disc)
    await agent.start()
    try:
        await until(lambda: "hgx" in shard.sm.nodes, "registration")
        nvml.xid(3, 79)  # GPU 3 falls off the bus
        await until(lambda: shard.sm.nodes["hgx"].unhealthy == [3], "the heartbeat to report it")
        await submit(ep, pb.JobSpec(id="seven", devices_per_task=7, command=["true"]))
        await until(lambda: shard.sm.jobs["seven"].status == "succeeded", "seven to run")
        p = shard.sm.jobs["seven"].tasks
        assert p and p[0].node == "hgx"
        # Placement never used the failed device; eight no longer fit.
        await submit(ep, pb.JobSpec(id="eight-a", devices_per_task=7, command=["sleep", "30"]))
        await until(lambda: shard.sm.jobs["eight-a"].status == "running", "eight-a to run")
        assert 3 not in shard.sm.jobs["eight-a"].placement.tasks[0].devices  # type: ignore[union-attr]
    finally:
        await agent.stop()
        disc.close()


async def test_run_agent_announces_itself_only_once_registered(
        server: tuple[str, SchedulerShard], tmp_path: Path) -> None:
    # The CLI joins SWIM in on_started: a node seen alive there must already be one the
    # scheduler can place work on (a job submitted on SWIM's word was refused before).
    ep, shard = server
    cfg = AgentConfig(heartbeat=0.2, reconcile=0.5, listen="127.0.0.1:0")
    agent = NodeAgent([ep], cpu_node("cpu-s"), tmp_path / "a", cfg)
    seen: list[bool] = []
    stop = asyncio.Event()

    async def started() -> None:
        seen.append("cpu-s" in shard.sm.nodes)
        stop.set()

    await asyncio.wait_for(run_agent(agent, stop, started), 30)
    assert seen == [True]


async def test_orphaned_tasks_run_until_the_timeout_then_stop(tmp_path: Path) -> None:
    ep, shard, srv = await _serve()
    cfg = AgentConfig(heartbeat=0.1, reconcile=0.3, orphan_timeout=2.0, listen="127.0.0.1:0")
    agent = NodeAgent([ep], cpu_node("cpu-o"), tmp_path / "a", cfg)
    await agent.start()
    try:
        await submit(ep, pb.JobSpec(id="o", devices_per_task=0, cpu_milli=1000,
                                    command=[PY, "-c", "import time; time.sleep(120)"]))
        await until(lambda: agent.tasks and all(t.proc.pid for t in agent.tasks.values()),
                    "the task to start")
        await srv.stop(0)  # the cluster goes away
        await shard.stop()
        await asyncio.sleep(1.0)
        assert agent.tasks, "a blip must not stop tasks"
        await until(lambda: not agent.tasks, "the orphan timeout to stop the task", 30)
        stopped_at = time.monotonic()
        # Counted from the sending of the last heartbeat the cluster took (never later
        # than the scheduler counts from its commit), and done before the scheduler's
        # fence (that plus the job's grace plus ShardConfig.fence_margin) lets the job
        # be requeued elsewhere.
        assert stopped_at - agent.last_beat >= 2.0
        assert stopped_at - agent.last_beat < 2.0 + ShardConfig().fence_margin
        out = (tmp_path / "a/tasks/o.r0.a1")
        assert out.is_dir()
    finally:
        await agent.stop(report=False)


async def test_stop_ends_report_deliveries_queued_behind_one_another(tmp_path: Path) -> None:
    """A task's reports go out in order, each waiting for the one before; with the
    cluster gone, both retry. ``stop`` cancels them, and the one waiting for its
    predecessor must end too (it once took the cancel for its predecessor's and retried
    forever, and ``stop`` with it)."""
    import socket

    with socket.socket() as s:  # a port nobody listens on: every report is retried
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = AgentConfig(heartbeat=0.2, reconcile=0.5, listen="127.0.0.1:0")
    agent = NodeAgent([f"127.0.0.1:{port}"], cpu_node("cpu-r"), tmp_path / "a", cfg)
    key = TaskKey("r", 0, 1)
    agent._report(Report(key, "running"))
    agent._report(Report(key, "exited", 0))
    await asyncio.sleep(0.3)  # both are retrying, the second behind the first
    assert len(agent._delivering) == 2
    stopping = asyncio.create_task(agent.stop(report=False))
    try:
        done, _ = await asyncio.wait({stopping}, timeout=5)  # waits; cancels nothing
        assert done, "stop() is waiting for a report delivery that never ends"
        assert not agent._delivering
    finally:
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "mtls"])
async def test_logs_through_the_agent_follow_until_the_task_ends(
        tmp_path: Path, secure: bool) -> None:
    """The agent registers, runs a task and serves its log; with ``--cacert/--cert/--key``
    it dials the scheduler over TLS and serves the log over TLS with its certificate."""
    from accord.proto import agent_pb2, agent_pb2_grpc

    tls = files = None
    if secure:
        # The agent's certificate serves its log service and dials the cluster: a
        # member certificate (server and client use), as an operator would issue it.
        _ca, pki = make_cluster_pki(tmp_path / "pki", ["server", "agent"], client_name="user")
        files = pki["server"]
        tls = TLSOptions(cacert=str(pki["agent"].ca), cert=str(pki["agent"].cert),
                         key=str(pki["agent"].key))
    ep, shard, srv = await _serve(files)
    cfg = AgentConfig(heartbeat=0.2, reconcile=0.5, listen="127.0.0.1:0")
    agent = NodeAgent([ep], cpu_node("cpu-l"), tmp_path / "a", cfg, tls=tls)
    await agent.start()
    try:
        assert agent.endpoint.startswith("https://" if secure else "http://")
        prog = "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.3)\n"
        await submit(ep, pb.JobSpec(id="talk", devices_per_task=0, cpu_milli=1000,
                                    command=[PY, "-c", prog]), tls)
        await until(lambda: bool(agent.tasks), "the task to start")
        if secure:  # a client that trusts no CA cannot read the log
            async with aio_channel(agent.endpoint, TLSOptions()) as bad:
                with pytest.raises(grpc.RpcError):
                    async for _ in agent_pb2_grpc.AgentStub(bad).ReadLog(  # type: ignore[no-untyped-call]
                            agent_pb2.ReadLogRequest(job_id="talk"), timeout=5):
                        pass
        async with aio_channel(agent.endpoint, tls) as ch:
            stub: Any = agent_pb2_grpc.AgentStub(ch)  # type: ignore[no-untyped-call]
            got = b""
            async for chunk in stub.ReadLog(agent_pb2.ReadLogRequest(job_id="talk", follow=True),
                                            timeout=30):
                got += chunk.data
                assert chunk.attempt == 1
            assert got == b"0\n1\n2\n3\n4\n"
            # From an offset, without follow; an unknown task is NOT_FOUND.
            rest = [c.data async for c in stub.ReadLog(
                agent_pb2.ReadLogRequest(job_id="talk", offset=4), timeout=10)]
            assert b"".join(rest) == b"2\n3\n4\n"
            with pytest.raises(grpc.RpcError) as e:
                async for _ in stub.ReadLog(agent_pb2.ReadLogRequest(job_id="nope"), timeout=10):
                    pass
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert shard.sm.nodes["cpu-l"].agent == agent.endpoint
    finally:
        await agent.stop()
        await shard.stop()
        await srv.stop(0)
