"""The Scheduler gRPC service over an in-process, single-replica shard (no Raft).

A real ``grpc.aio`` server on 127.0.0.1 with ``SchedulerServicer`` over
``local_shard``; the leader duties are driven by hand (``lead_once``) with a fake
clock, so liveness and placement are deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc
from accord.services.scheduling.replicated import SchedulerShard, ShardConfig, local_shard
from accord.services.scheduling.servicer import add_scheduler_service, node_to_pb
from accord.services.scheduling.state import SchedulerStateMachine
from accord.services.scheduling.topology import make_node


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Env:
    shard: SchedulerShard
    stub: scheduling_pb2_grpc.SchedulerStub
    clock: Clock
    channel: grpc.aio.Channel


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    clock = Clock()
    shard = local_shard(ShardConfig(leader_grace=0.0), clock=clock)
    server = grpc.aio.server()
    add_scheduler_service(server, shard)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = scheduling_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
    try:
        yield Env(shard, stub, clock, channel)
    finally:
        await shard.stop()
        await channel.close()
        await server.stop(0)


def gpu_node(name: str, vendor: str = "nvidia", gpus: int = 8) -> pb.NodeSpec:
    return node_to_pb(make_node(name, gpus=gpus, vendor=vendor, address=f"{name}.example"))


async def register(e: Env, *names: str, vendor: str = "nvidia") -> None:
    for n in names:
        await e.stub.RegisterNode(pb.RegisterNodeRequest(node=gpu_node(n, vendor)))


async def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code()


async def test_gang_job_is_placed_with_launcher_env(env: Env) -> None:
    await register(env, "gpu-a", "gpu-b")
    await register(env, "amd-a", vendor="amd")
    watch = env.stub.WatchPlacements(pb.WatchPlacementsRequest())
    r = await env.stub.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        id="train", tasks=2, devices_per_task=8, selector="vendor == nvidia")))
    assert r.job_id == "train"
    assert (await env.stub.GetJob(pb.GetJobRequest(job_id="train"))).status == "pending"
    out = await env.shard.lead_once()
    assert out is not None and out["accepted"] == ["train"]
    info = await env.stub.GetJob(pb.GetJobRequest(job_id="train"))
    assert info.status == "running"
    assert sorted(t.host for t in info.tasks) == ["gpu-a", "gpu-b"]
    master = info.tasks[0]
    for t in info.tasks:
        assert sorted(t.devices) == list(range(8))
        assert t.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, t.devices))
        assert t.env["WORLD_SIZE"] == "16" and t.env["NODE_RANK"] == str(t.rank)
        assert t.env["MASTER_ADDR"] == f"{master.host}.example"
        assert t.env["MASTER_PORT"] == str(info.master_port)
        assert t.cpus and t.numa_nodes
    ev = await watch.read()
    assert (ev.kind, ev.job_id) == ("placed", "train")
    assert [t.env["NODE_RANK"] for t in ev.tasks] == ["0", "1"]
    watch.cancel()
    # an AMD job gets ROCR_VISIBLE_DEVICES
    await env.stub.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        id="rocm", devices_per_task=2, selector="vendor == amd")))
    await env.shard.lead_once()
    amd = await env.stub.GetJob(pb.GetJobRequest(job_id="rocm"))
    assert amd.status == "running" and "ROCR_VISIBLE_DEVICES" in amd.tasks[0].env
    listed = await env.stub.ListJobs(pb.ListJobsRequest(status="running"))
    assert sorted(j.spec.id for j in listed.jobs) == ["rocm", "train"]


async def test_bad_requests_get_clear_codes_and_change_nothing(env: Env) -> None:
    await register(env, "gpu-a")
    s = env.stub
    def state() -> tuple[object, ...]:
        sm = env.shard.sm
        return ([n.to_wire() for n in sm.nodes.values()], [j.to_wire() for j in sm.jobs.values()])

    before = state()
    assert await code_of(s.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        selector="vendor === nvidia")))) == grpc.StatusCode.INVALID_ARGUMENT
    assert await code_of(s.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        devices_per_task=16)))) == grpc.StatusCode.FAILED_PRECONDITION
    assert await code_of(s.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        selector="vendor == intel")))) == grpc.StatusCode.FAILED_PRECONDITION
    assert await code_of(s.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        id="bad id with spaces")))) == grpc.StatusCode.INVALID_ARGUMENT
    assert await code_of(s.GetJob(pb.GetJobRequest(job_id="nope"))) == grpc.StatusCode.NOT_FOUND
    assert await code_of(s.CancelJob(pb.CancelJobRequest(job_id="nope"))) == \
        grpc.StatusCode.NOT_FOUND
    assert await code_of(s.DrainNode(pb.NodeRequest(node="ghost"))) == grpc.StatusCode.NOT_FOUND
    assert await code_of(s.Heartbeat(pb.HeartbeatRequest(node="ghost"))) == \
        grpc.StatusCode.NOT_FOUND
    bad_node = gpu_node("gpu-z")
    bad_node.devices[0].vendor = "acme"
    assert await code_of(s.RegisterNode(pb.RegisterNodeRequest(node=bad_node))) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert state() == before
    await s.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(id="j1")))
    assert await code_of(s.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(id="j1")))) == \
        grpc.StatusCode.ALREADY_EXISTS
    assert await code_of(s.ReleaseJob(pb.ReleaseJobRequest(job_id="j1"))) == \
        grpc.StatusCode.FAILED_PRECONDITION  # pending, not held
    await s.HoldJob(pb.HoldJobRequest(job_id="j1"))
    assert (await s.GetJob(pb.GetJobRequest(job_id="j1"))).status == "held"
    held = await s.ListJobs(pb.ListJobsRequest(status="held"))
    assert [j.spec.id for j in held.jobs] == ["j1"]
    assert await code_of(s.HoldJob(pb.HoldJobRequest(job_id="j1"))) == \
        grpc.StatusCode.FAILED_PRECONDITION
    assert await code_of(s.HoldJob(pb.HoldJobRequest(job_id="nope"))) == \
        grpc.StatusCode.NOT_FOUND
    assert await code_of(s.ListJobs(pb.ListJobsRequest(status="hold"))) == \
        grpc.StatusCode.INVALID_ARGUMENT
    await s.ReleaseJob(pb.ReleaseJobRequest(job_id="j1"))
    await s.CancelJob(pb.CancelJobRequest(job_id="j1"))
    assert await code_of(s.CancelJob(pb.CancelJobRequest(job_id="j1"))) == \
        grpc.StatusCode.FAILED_PRECONDITION


async def test_retried_request_id_applies_once(env: Env) -> None:
    await register(env, "gpu-a")
    req = pb.SubmitJobRequest(job=pb.JobSpec(id="once"), request_id="req-1")
    assert (await env.stub.SubmitJob(req)).job_id == "once"
    assert (await env.stub.SubmitJob(req)).job_id == "once"
    assert list(env.shard.sm.jobs) == ["once"]


async def test_drained_node_takes_no_new_work(env: Env) -> None:
    await register(env, "gpu-a", "gpu-b")
    await env.stub.DrainNode(pb.NodeRequest(node="gpu-a"))
    for i in range(2):
        await env.stub.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(id=f"j{i}", devices_per_task=8)))
    await env.shard.lead_once()
    jobs = {j.spec.id: j for j in (await env.stub.ListJobs(pb.ListJobsRequest())).jobs}
    running = [j for j in jobs.values() if j.status == "running"]
    assert len(running) == 1 and running[0].tasks[0].host == "gpu-b"
    nodes = {n.spec.name: n for n in (await env.stub.ListNodes(pb.ListNodesRequest())).nodes}
    assert nodes["gpu-a"].drained and nodes["gpu-b"].running_jobs == [running[0].spec.id]
    await env.stub.UndrainNode(pb.NodeRequest(node="gpu-a"))
    await env.shard.lead_once()
    jobs2 = (await env.stub.ListJobs(pb.ListJobsRequest(status="running"))).jobs
    assert sorted(j.tasks[0].host for j in jobs2) == ["gpu-a", "gpu-b"]


async def test_silent_node_is_declared_dead_and_its_jobs_requeued(env: Env) -> None:
    await register(env, "gpu-a", "gpu-b")
    await env.stub.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(id="j", devices_per_task=8)))
    await env.shard.lead_once()
    first = (await env.stub.GetJob(pb.GetJobRequest(job_id="j"))).tasks[0].host
    other = "gpu-b" if first == "gpu-a" else "gpu-a"
    watch = env.stub.WatchPlacements(pb.WatchPlacementsRequest(job_id="j"))
    for _ in range(10):  # both nodes heartbeat every 0.5 s
        env.clock.t += 0.5
        for n in ("gpu-a", "gpu-b"):
            await env.stub.Heartbeat(pb.HeartbeatRequest(node=n))
        assert await env.shard.lead_once() is None
    for _ in range(20):  # now only the other one does
        env.clock.t += 0.5
        await env.stub.Heartbeat(pb.HeartbeatRequest(node=other))
        await env.shard.lead_once()
        if not env.shard.sm.nodes[first].alive:
            break
    assert not env.shard.sm.nodes[first].alive
    ev = await watch.read()
    assert ev.kind == "requeued" and first in ev.reason
    ev = await watch.read()
    assert ev.kind == "placed" and ev.tasks[0].host == other
    watch.cancel()
    info = await env.stub.GetJob(pb.GetJobRequest(job_id="j"))
    assert info.status == "running" and info.requeues == 1 and info.starts == 2
    # the dead node must register again before it heartbeats
    assert await code_of(env.stub.Heartbeat(pb.HeartbeatRequest(node=first))) == \
        grpc.StatusCode.FAILED_PRECONDITION
    await register(env, first)
    await env.stub.Heartbeat(pb.HeartbeatRequest(node=first))


@pytest.mark.parametrize("broken", [False, True])
async def test_a_node_whose_agent_stops_its_tasks_is_declared_dead_only_after_they_stopped(
        env: Env, broken: bool) -> None:
    """An agent registered with an orphan timeout stops its tasks that long after the last
    heartbeat the cluster took (``AgentConfig.orphan_timeout``), with the job's grace from
    SIGTERM to SIGKILL: suspected long before, the node is declared dead (and its job
    requeued elsewhere) only after both and ``fence_margin``. The broken variant declares
    it dead as soon as suspected: the job then runs elsewhere while its tasks may still
    run on the node cut off."""
    for name in ("gpu-a", "gpu-b"):
        await env.stub.RegisterNode(pb.RegisterNodeRequest(
            node=gpu_node(name), orphan_timeout=None if broken else 10.0))
    await env.stub.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
        id="j", devices_per_task=8, grace=5, command=["python", "train.py"])))
    await env.shard.lead_once()
    first = (await env.stub.GetJob(pb.GetJobRequest(job_id="j"))).tasks[0].host
    other = "gpu-b" if first == "gpu-a" else "gpu-a"
    for _ in range(10):
        env.clock.t += 0.5
        for n in ("gpu-a", "gpu-b"):
            await env.stub.Heartbeat(pb.HeartbeatRequest(node=n))
        await env.shard.lead_once()
    last = env.shard.sm.nodes[first].last_heartbeat
    stopped = last + 10.0 + 5.0  # the agent's orphan timeout and the job's grace
    declared_at = suspected_at = None
    for _ in range(60):  # 30 s of the first node's silence
        env.clock.t += 0.5
        await env.stub.Heartbeat(pb.HeartbeatRequest(node=other))
        if suspected_at is None and first in env.shard.monitor.suspects(env.clock.t):
            suspected_at = env.clock.t
        await env.shard.lead_once()
        if not env.shard.sm.nodes[first].alive:
            declared_at = env.clock.t
            break
    assert declared_at is not None and suspected_at is not None and suspected_at < stopped
    if broken:
        assert declared_at < stopped  # requeued while its tasks may still run there
        return
    assert declared_at >= stopped + env.shard.config.fence_margin
    info = await env.stub.GetJob(pb.GetJobRequest(job_id="j"))
    assert info.requeues == 1 and info.tasks[0].host == other
    copy = SchedulerStateMachine()  # a snapshot keeps what the agent registered
    copy.restore(env.shard.sm.snapshot())
    assert copy.nodes[other].orphan_timeout == 10.0
    bad = await code_of(env.stub.RegisterNode(pb.RegisterNodeRequest(
        node=gpu_node("gpu-c"), orphan_timeout=-1)))
    assert bad == grpc.StatusCode.INVALID_ARGUMENT


async def test_replaying_the_log_yields_the_same_placements(env: Env) -> None:
    log: list[bytes] = []
    inner = env.shard._propose_bytes

    async def recording(payload: bytes, timeout: float) -> object:
        log.append(payload)
        return await inner(payload, timeout)

    env.shard._propose_bytes = recording
    await register(env, "gpu-a", "gpu-b", "gpu-c")
    for i, (tasks, gpus) in enumerate([(2, 4), (1, 8), (3, 2), (1, 1), (2, 8)]):
        await env.stub.SubmitJob(pb.SubmitJobRequest(job=pb.JobSpec(
            id=f"j{i}", tasks=tasks, devices_per_task=gpus)))
        env.clock.t += 0.5
        for n in ("gpu-a", "gpu-b", "gpu-c"):
            await env.stub.Heartbeat(pb.HeartbeatRequest(node=n))
        await env.shard.lead_once()
    assert all(st.alive for st in env.shard.sm.nodes.values())
    await env.stub.CancelJob(pb.CancelJobRequest(job_id="j1"))
    await env.shard.lead_once()
    replica = local_shard()
    for i, payload in enumerate(log, 1):
        replica.apply(i, payload)
    assert replica.sm.snapshot() == env.shard.sm.snapshot()
    placed = {j: r.placement for j, r in env.shard.sm.jobs.items()}
    assert placed == {j: r.placement for j, r in replica.sm.jobs.items()}
    assert sum(p is not None for p in placed.values()) >= 3
    # a snapshot restores the same state too
    third = local_shard()
    third.restore(env.shard.prepare_snapshot()())
    assert third.sm.snapshot() == env.shard.sm.snapshot()
