"""Membership drives the scheduler: a GPU agent that SWIM declares dead has its jobs requeued.

The in-process tests run a real scheduling shard (one replica, no Raft), a daemon's
``NodeMembership`` linked to it, and GPU agents as real SWIM members on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from accord import cli
from accord.membership.config import SwimConfig
from accord.membership.node import Membership
from accord.membership.scheduler_link import SchedulerLink
from accord.membership.service import NodeMembership, daemon_meta
from accord.membership.state import Member, MemberState
from accord.services.scheduling.model import Job
from accord.services.scheduling.replicated import SchedulerShard, ShardConfig, local_shard
from accord.services.scheduling.servicer import add_scheduler_service
from accord.services.scheduling.topology import make_node

LOCAL = SwimConfig.local()


async def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


# ----- the rules, on fakes ----------------------------------------------------------------


@dataclass
class FakeStatus:
    alive: bool
    last_heartbeat: float


class FakeScheduler:
    def __init__(self, nodes: dict[str, FakeStatus], leader: bool = True) -> None:
        self.nodes = nodes
        self.leader = leader
        self.dead: list[str] = []
        self.still_running: set[str] = set()
        """Nodes whose cut-off agent may still run tasks (``SchedulerShard.fenced``)."""

    @property
    def sm(self) -> FakeScheduler:
        return self

    @property
    def service(self) -> FakeScheduler:
        return self

    def is_leader(self) -> bool:
        return self.leader

    def fenced(self, node: str) -> bool:
        return node in self.still_running

    async def node_dead(self, node: str, request_id: str | None = None) -> dict[str, Any]:
        self.dead.append(node)
        self.nodes[node].alive = False
        return {"ok": True, "requeued": []}


class FakeView:
    """What the link reads of a ``NodeMembership``: the view and the clock mapping."""

    def __init__(self, members: list[Member]) -> None:
        self._members = members

    def members(self, role: str | None = None) -> list[Member]:
        return [m for m in self._members if role is None or m.meta.get("role") == role]

    def wall_time(self, loop_time: float) -> float:
        return 1000.0 + loop_time


def agent(name: str, state: MemberState, since: float, node: str | None = None,
          role: str = "gpu-agent") -> Member:
    meta = {"role": role, **({"node": node} if node else {})}
    return Member(name, ("127.0.0.1", 1), 1, state, meta, since)


async def test_link_rules() -> None:
    sched = FakeScheduler({
        "gpu-a": FakeStatus(True, 1000.0),   # last heard before its death at 1005: due
        "gpu-b": FakeStatus(True, 1010.0),   # re-registered after its death: not due
        "gpu-c": FakeStatus(True, 1000.0),   # left gracefully: not due
        "gpu-d": FakeStatus(False, 1000.0),  # already dead in the scheduler: not due
        "n1": FakeStatus(True, 1000.0),      # a daemon, not an agent: not due
        "h-e": FakeStatus(True, 1000.0),     # agent member "e" standing for node h-e: due
        "gpu-g": FakeStatus(True, 1000.0),   # dead to SWIM, its tasks maybe running: later
    })
    sched.still_running.add("gpu-g")
    view = FakeView([
        agent("gpu-a", MemberState.DEAD, 5.0), agent("gpu-b", MemberState.DEAD, 5.0),
        agent("gpu-c", MemberState.LEFT, 5.0), agent("gpu-d", MemberState.DEAD, 5.0),
        agent("n1", MemberState.DEAD, 5.0, role="accord"), agent("e", MemberState.DEAD, 5.0, "h-e"),
        agent("gpu-f", MemberState.DEAD, 5.0),  # not registered with the scheduler
        agent("gpu-g", MemberState.DEAD, 5.0),
    ])
    link = SchedulerLink(view, sched)  # type: ignore[arg-type]
    assert sorted(link.due()) == ["gpu-a", "h-e"]
    sched.leader = False
    assert await link.reconcile() == [] and sched.dead == []
    sched.leader = True
    assert sorted(await link.reconcile()) == ["gpu-a", "h-e"]
    assert link.declared == 2 and await link.reconcile() == []  # declared once
    sched.still_running.clear()  # its tasks are surely stopped now
    assert await link.reconcile() == ["gpu-g"]


# ----- a real shard, real SWIM members ----------------------------------------------------------


@pytest.fixture
async def shard_and_daemon() -> AsyncIterator[tuple[SchedulerShard, NodeMembership]]:
    shard = local_shard(ShardConfig(leader_grace=3600.0))  # the heartbeat detector stays out
    nm = NodeMembership(LOCAL, name="n1", bind=("127.0.0.1", 0), scheduler=shard,
                        meta=daemon_meta("n1", 1, ["http://127.0.0.1:2379"]))
    await nm.start()
    try:
        yield shard, nm
    finally:
        await nm.stop()
        await shard.stop()


async def test_dead_gpu_agent_has_its_jobs_requeued(
        shard_and_daemon: tuple[SchedulerShard, NodeMembership]) -> None:
    shard, nm = shard_and_daemon
    await shard.service.register_node(make_node("gpu-a", gpus=8))
    await shard.service.register_node(make_node("gpu-b", gpus=8))
    await shard.service.submit_job(Job(id="j1", tasks=2, devices_per_task=8))
    await shard.lead_once()
    assert shard.sm.jobs["j1"].status == "running"
    agents = [Membership(LOCAL, bind=("127.0.0.1", 0), name=f"agent-{n}", seeds=[nm.address],
                         meta={"role": "gpu-agent", "node": n}) for n in ("gpu-a", "gpu-b")]
    for a in agents:
        await a.start()
    try:
        await wait_for(lambda: len([m for m in nm.members("gpu-agent")
                                    if m.state == MemberState.ALIVE]) == 2)
        await agents[0].stop()  # kill: no leave message
        await wait_for(lambda: shard.sm.jobs["j1"].requeues == 1)
        job = shard.sm.jobs["j1"]
        assert "gpu-a died" in job.reason
        assert not shard.sm.nodes["gpu-a"].alive and shard.sm.nodes["gpu-b"].alive
        assert nm.declared_dead == 1
        assert nm.view["agent-gpu-b"].state == MemberState.ALIVE
    finally:
        for a in agents:
            await a.stop()


async def test_agent_command_joins_membership_and_leaves(
        shard_and_daemon: tuple[SchedulerShard, NodeMembership],
        capsys: pytest.CaptureFixture[str]) -> None:
    shard, nm = shard_and_daemon
    server = grpc.aio.server()
    add_scheduler_service(server, shard)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seed = f"{nm.address[0]}:{nm.address[1]}"
    try:
        run = asyncio.create_task(asyncio.to_thread(
            cli.main, ["nodes", "agent", "--fake", "gpu-x", "--gpus", "4", "--interval", "0.1",
                       "--count", "25", "--endpoints", f"127.0.0.1:{port}",
                       "--gossip-seeds", seed, "--gossip-profile", "local"]))
        await wait_for(lambda: "gpu-x" in nm.view)
        rec = nm.view["gpu-x"]
        assert rec.state == MemberState.ALIVE and rec.meta["role"] == "gpu-agent"
        assert rec.meta["node"] == "gpu-x" and rec.meta["gpus"] == "4"
        assert len(rec.meta["inventory"]) == 16 and rec.meta["models"].startswith("nvidia/")
        assert await run == 0
        await wait_for(lambda: nm.view["gpu-x"].state == MemberState.LEFT)
        out = capsys.readouterr().out
        assert "gpu-x registered" in out and "joined membership as 127.0.0.1:" in out
        assert shard.sm.nodes["gpu-x"].alive  # a graceful leave is not a death
    finally:
        await server.stop(0)


def test_agent_gossip_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["nodes", "agent", "--fake", "g", "--gossip-seeds", "nowhere",
                     "--endpoints", "127.0.0.1:1"])
    assert code == 2 and "is not host:port" in capsys.readouterr().err
    code = cli.main(["nodes", "agent", "--fake", "g", "--gossip-listen", "127.0.0.1:0",
                     "--endpoints", "127.0.0.1:1"])
    assert code == 2 and "needs --gossip-seeds" in capsys.readouterr().err

