"""SWIM membership inside real `accord serve` daemons (3 subprocesses, ``local`` profile).

Every daemon's ``Membership.Members`` must show a daemon killed with SIGKILL as dead
within a bound derived from the profile; a daemon paused (SIGSTOP) past the suspicion
timeout must be suspected by every other daemon and, once resumed (SIGCONT), refute
and be alive everywhere again. A GPU agent joining gossip (``accord nodes agent
--gossip-seeds``) that is killed has its job requeued by the scheduling leader on
SWIM's word. Three daemons, not five: each hosts several Raft groups, and five
would double the suite's cost on a two-core machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from accord.membership.config import SwimConfig
from accord.proto import membership_pb2 as pb
from accord.proto import membership_pb2_grpc, scheduling_pb2_grpc
from accord.proto import scheduling_pb2 as spb
from tests.integration.cluster import HOST, ProcCluster, ProcNode

_grpc: Any = membership_pb2_grpc  # the generated stubs carry no annotations
_sched_grpc: Any = scheduling_pb2_grpc

N = 3
PROFILE = SwimConfig.local()
# A crash is noticed within a few probe rounds, suspected for at most the longest
# (unconfirmed) Lifeguard suspicion timeout, then gossiped; plus slack for a loaded box.
DETECTION_BOUND = (10 * PROFILE.probe_interval
                   + PROFILE.suspicion_timeout(N) * PROFILE.suspicion_max_timeout_mult + 5.0)
PAUSE = PROFILE.suspicion_timeout(N) * PROFILE.suspicion_max_timeout_mult + 1.0
"""Longer than any suspicion timeout of the profile: the paused daemon is declared dead."""


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``cond`` until true; returns the seconds it took (AssertionError after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:.1f}s")


def members(node: ProcNode) -> dict[str, pb.Member]:
    stub = _grpc.MembershipStub(node.channel())
    return {m.name: m for m in stub.Members(pb.MembersRequest(), timeout=2.0).members}


def state(observer: ProcNode, name: str) -> str:
    with contextlib.suppress(grpc.RpcError):
        m = members(observer).get(name)
        return m.state if m is not None else "unknown"
    return "unreachable"


class Watcher:
    """Follows one daemon's ``Watch`` stream in a thread; records (kind, member) pairs."""

    def __init__(self, node: ProcNode) -> None:
        self.channel = grpc.insecure_channel(node.endpoint)
        self.events: list[tuple[str, str, int]] = []
        self.stream = _grpc.MembershipStub(self.channel).Watch(pb.WatchRequest())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for resp in self.stream:
                if resp.kind != "snapshot":
                    self.events.append((resp.kind, resp.member.name, resp.member.incarnation))

    def saw(self, kind: str, name: str) -> bool:
        return any(k == kind and n == name for k, n, _ in list(self.events))

    def close(self) -> None:
        self.stream.cancel()
        self.thread.join(5.0)
        self.channel.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("swim"), N, extra=("--gossip-profile", "local")) as c:
        names = [n.name for n in c.nodes]
        wait_for(lambda: all(state(o, x) == "alive" for o in c.nodes for x in names), 30.0,
                 "every daemon sees every daemon alive")
        yield c


def test_every_daemon_is_a_member_with_its_metadata(cluster: ProcCluster) -> None:
    view = members(cluster.nodes[0])
    assert sorted(view) == ["n1", "n2", "n3"]
    for n in cluster.nodes:
        m = view[n.name]
        assert m.metadata["role"] == "accord" and m.metadata["name"] == n.name
        assert m.metadata["client"] == f"http://{n.endpoint}"
        assert m.address == f"{HOST}:{n.gossip_port}"
    out = subprocess.run([sys.executable, "-m", "accord", "nodes", "--endpoints",
                          cluster.nodes[1].endpoint], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:4]]
    assert [(r[0], r[1], r[2]) for r in rows] == [(f"n{i}", "accord", "alive") for i in (1, 2, 3)]
    assert "as seen by n2" in out.stdout


def test_paused_daemon_is_suspected_then_alive_again(cluster: ProcCluster) -> None:
    paused, others = cluster.nodes[2], cluster.nodes[:2]
    before = members(others[0])[paused.name].incarnation
    watchers = [Watcher(o) for o in others]
    try:
        cluster.signal(paused, signal.SIGSTOP)
        try:
            wait_for(lambda: all(w.saw("suspect", paused.name) for w in watchers), DETECTION_BOUND,
                     "every other daemon suspects the paused one")
            time.sleep(PAUSE)
        finally:
            cluster.signal(paused, signal.SIGCONT)
        # It refutes (a higher incarnation) and every daemon, itself included, agrees again.
        wait_for(lambda: all(state(o, x.name) == "alive" for o in cluster.nodes for x in cluster.nodes),
                 DETECTION_BOUND, "every daemon sees every daemon alive after SIGCONT")
        assert members(others[0])[paused.name].incarnation > before
        assert all(w.saw("alive", paused.name) for w in watchers)
        # No permanent false death: a few seconds later everyone is still alive everywhere.
        time.sleep(2.0)
        for o in cluster.nodes:
            view = members(o)
            assert {x: view[x].state for x in view} == {x.name: "alive" for x in cluster.nodes}
    finally:
        for w in watchers:
            w.close()


def test_gpu_agent_killed_has_its_job_requeued_by_membership(cluster: ProcCluster,
                                                            tmp_path: Path) -> None:
    eps = cluster.endpoints
    seeds = ",".join(f"{HOST}:{n.gossip_port}" for n in cluster.nodes)
    log = open(tmp_path / "agent.log", "wb")
    # A long heartbeat interval keeps the scheduler's own heartbeat detector quiet for the
    # length of the test: the death must come from SWIM (the job runs no command, so no
    # task of it waits for the agent's orphan timeout).
    agent = subprocess.Popen(
        [sys.executable, "-m", "accord", "nodes", "agent", "--fake", "gpu-z", "--gpus", "4",
         "--interval", "600", "--orphan-timeout", "1800", "--endpoints", eps,
         "--gossip-seeds", seeds,
         "--gossip-profile", "local"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    try:
        wait_for(lambda: all(state(o, "gpu-z") == "alive" for o in cluster.nodes), 30.0,
                 "every daemon sees the GPU agent")
        sched = _sched_grpc.SchedulerStub(cluster.nodes[0].channel())
        sched.SubmitJob(spb.SubmitJobRequest(job=spb.JobSpec(id="swim-j", devices_per_task=4),
                                             request_id="swim-j"), timeout=20.0)
        wait_for(lambda: sched.GetJob(spb.GetJobRequest(job_id="swim-j"), timeout=5.0).status
                 == "running", 30.0, "the job runs on gpu-z")
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        took = wait_for(lambda: sched.GetJob(spb.GetJobRequest(job_id="swim-j"),
                                             timeout=5.0).requeues == 1,
                        DETECTION_BOUND, "the dead agent's job is requeued")
        info = sched.GetJob(spb.GetJobRequest(job_id="swim-j"), timeout=5.0)
        assert info.status == "pending" and "gpu-z died" in info.reason
        assert any("GPU agent gpu-z is dead" in cluster.log(n) for n in cluster.nodes), \
            "the scheduling leader did not act on SWIM's verdict"
        assert took < DETECTION_BOUND
    finally:
        if agent.poll() is None:
            os.kill(agent.pid, signal.SIGKILL)
            agent.wait(10)


def test_killed_daemon_is_dead_everywhere_within_the_bound(cluster: ProcCluster) -> None:
    victim, others = cluster.nodes[1], [cluster.nodes[0], cluster.nodes[2]]
    cluster.kill(victim)
    took = wait_for(lambda: all(state(o, victim.name) == "dead" for o in others), DETECTION_BOUND,
                    f"every other daemon sees {victim.name} dead")
    assert took < DETECTION_BOUND
    for o in others:
        view = members(o)
        assert {x: view[x].state for x in ("n1", "n3")} == {"n1": "alive", "n3": "alive"}
