"""The GPU scheduler on a real 3-node cluster: placements survive a kill -9 of the
scheduling shard's leader, nothing is placed twice, and a node whose agent stops
heartbeating is declared dead and its jobs requeued."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc
from accord.services.scheduling.servicer import node_to_pb
from accord.services.scheduling.topology import make_node
from tests.integration.cluster import ProcCluster, ProcNode

T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path, 3) as c:
        yield c


def live(c: ProcCluster) -> list[ProcNode]:
    return [n for n in c.nodes if n.proc is not None and n.proc.poll() is None]


def stub(n: ProcNode) -> Any:
    return scheduling_pb2_grpc.SchedulerStub(n.channel())  # type: ignore[no-untyped-call]


def call(c: ProcCluster, fn: Callable[[Any], T], timeout: float = 30.0) -> T:
    """``fn(stub)`` on any live member, retrying while the shard has no leader."""
    deadline = time.monotonic() + timeout
    i = 0
    last: grpc.RpcError | None = None
    while time.monotonic() < deadline:
        nodes = live(c)
        n = nodes[i % len(nodes)]
        i += 1
        try:
            return fn(stub(n))
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            last = e
            time.sleep(0.1)
    raise AssertionError(f"no answer in {timeout}s: {last}")


def shard_leader(c: ProcCluster, timeout: float = 20.0) -> ProcNode:
    """The member every live member agrees leads the scheduling shard."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st: dict[str, Any] = {}
        for n in live(c):
            with contextlib.suppress(grpc.RpcError):
                st[n.name] = stub(n).Status(pb.StatusRequest(), timeout=1.0)
        leaders = {s.leader_id for s in st.values()}
        if len(st) == len(live(c)) and len(leaders) == 1 and 0 not in leaders:
            (lid,) = leaders
            for name, s in st.items():
                if s.member_id == lid and s.is_leader:
                    return next(n for n in c.nodes if n.name == name)
        time.sleep(0.1)
    raise AssertionError("no agreed scheduling leader")


class Agents:
    """Fake GPU agents: heartbeat every ``interval`` seconds for the names in ``beating``."""

    def __init__(self, c: ProcCluster, names: list[str], interval: float = 0.3) -> None:
        self.c = c
        self.beating = set(names)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name in sorted(self.beating):
                with contextlib.suppress(grpc.RpcError, AssertionError):
                    call(self.c, heartbeat(name), timeout=2.0)

    def __enter__(self) -> Agents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def heartbeat(name: str) -> Callable[[Any], Any]:
    return lambda s: s.Heartbeat(pb.HeartbeatRequest(node=name), timeout=2.0)


def register(name: str) -> Callable[[Any], Any]:
    spec = node_to_pb(make_node(name, gpus=8, address=f"{name}.local"))
    return lambda s: s.RegisterNode(pb.RegisterNodeRequest(node=spec), timeout=10.0)


def job(c: ProcCluster, job_id: str) -> Any:
    return call(c, lambda s: s.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5.0))


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def submit(c: ProcCluster, job_id: str) -> None:
    spec = pb.JobSpec(id=job_id, tasks=2, devices_per_task=4, selector="vendor == nvidia")
    req = pb.SubmitJobRequest(job=spec, request_id=f"submit-{job_id}")
    assert call(c, lambda s: s.SubmitJob(req, timeout=10.0)).job_id == job_id


def devices_in_use(c: ProcCluster) -> list[tuple[str, int]]:
    jobs = call(c, lambda s: s.ListJobs(pb.ListJobsRequest(status="running"), timeout=5.0)).jobs
    return [(t.host, d) for j in jobs for t in j.tasks for d in t.devices]


def test_scheduler_survives_leader_kill_and_requeues_a_dead_nodes_jobs(cluster: ProcCluster
                                                                       ) -> None:
    for name in ("gpu-a", "gpu-b"):
        call(cluster, register(name))
    with Agents(cluster, ["gpu-a", "gpu-b"]) as agents:
        submit(cluster, "g1")
        wait_for(lambda: job(cluster, "g1").status == "running", "g1 placed")
        g1 = job(cluster, "g1")
        for t in g1.tasks:
            assert t.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, t.devices))
            assert t.env["WORLD_SIZE"] == "8" and t.env["NODE_RANK"] == str(t.rank)
            assert t.env["MASTER_ADDR"] == f"{g1.tasks[0].host}.local"
            assert t.env["MASTER_PORT"] == str(g1.master_port)

        # kill -9 the scheduling shard's leader; a job submitted afterwards is placed once
        old = shard_leader(cluster)
        cluster.kill(old, keep_channel=True)  # the heartbeat thread may be calling through it
        submit(cluster, "g2")
        wait_for(lambda: job(cluster, "g2").status == "running", "g2 placed after failover")
        new = shard_leader(cluster)
        assert new is not old
        g2 = job(cluster, "g2")
        assert (g2.starts, g2.requeues) == (1, 0)
        assert job(cluster, "g1").starts == 1
        used = devices_in_use(cluster)
        assert len(used) == len(set(used)) == 16  # every device once, nothing doubled

        # gpu-b's agent goes silent: the node is declared dead, its jobs requeued
        had_b = sorted(jid for jid in ("g1", "g2")
                       if any(t.host == "gpu-b" for t in job(cluster, jid).tasks))
        assert had_b
        agents.beating.discard("gpu-b")

        def b_dead() -> bool:
            nodes = call(cluster, lambda s: s.ListNodes(pb.ListNodesRequest(), timeout=5.0))
            return any(n.spec.name == "gpu-b" and not n.alive for n in nodes.nodes)

        wait_for(b_dead, "gpu-b declared dead", timeout=30.0)
        on_b = [jid for jid in ("g1", "g2")
                if any(t.host == "gpu-b" for t in job(cluster, jid).tasks)]
        assert on_b == []
        requeued = sorted(jid for jid in ("g1", "g2") if job(cluster, jid).requeues == 1)
        assert requeued == had_b
        assert all(h == "gpu-a" for h, _ in devices_in_use(cluster))
        # gpu-a still heartbeats and stays alive
        nodes = call(cluster, lambda s: s.ListNodes(pb.ListNodesRequest(), timeout=5.0)).nodes
        assert [n.alive for n in nodes if n.spec.name == "gpu-a"] == [True]

        # the killed member comes back, replays its log and serves the same jobs
        cluster.start(old)
        cluster.wait_serving(old)
        want = {jid: (job(cluster, jid).status, job(cluster, jid).starts) for jid in ("g1", "g2")}

        def caught_up() -> bool:
            try:
                got = {jid: stub(old).GetJob(pb.GetJobRequest(job_id=jid), timeout=5.0)
                       for jid in ("g1", "g2")}
            except grpc.RpcError:
                return False
            return {j: (g.status, g.starts) for j, g in got.items()} == want

        wait_for(caught_up, "the restarted member to serve the same jobs")
