"""Membership drives the scheduler: a GPU agent that SWIM declares dead loses its jobs.

The scheduler already watches agents' gRPC heartbeats with a Phi accrual detector,
but heartbeats flow to whichever daemon the agent reaches, and the detector needs a
few seconds of silence against its own history. SWIM sees an agent die from several
vantage points at once (indirect probes, Lifeguard confirmations) and needs no
Raft round per heartbeat. ``SchedulerLink`` connects the two: on the member that
*leads the scheduling group*, each SWIM member with ``role=gpu-agent`` that is
``dead`` turns into one ``node_dead(node)`` command, which requeues the node's jobs.

Rules, each with its reason:

* Only the scheduling leader acts: one proposer, no storm of duplicate commands.
  It re-checks the whole view every ``interval`` seconds as well as on each event,
  so a leader elected after a death still acts on it.
* The scheduler node is ``meta["node"]`` (the agent's registered name), else the
  member name.
* Only nodes the replica holds as *alive* are declared dead (the command is
  idempotent anyway), and only if their last heartbeat or registration is *older*
  than SWIM's death: an agent that restarted and re-registered after the death is
  not killed again by the stale record, so a false SWIM death costs at most one
  requeue of that node's jobs.
* A node whose agent may still run tasks (cut off, not dead: it stops them by itself
  within the orphan timeout it registered, plus its jobs' grace) waits until they are
  surely stopped (``SchedulerShard.fenced``), as for the heartbeat detector.
* ``left`` (a graceful leave) is not acted on: an agent restarting for an upgrade
  leaves, and its jobs may still run; if it does not come back, the heartbeat
  detector declares it dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from .node import Subscription
from .state import Member, MemberState

__all__ = ["SchedulerLike", "SchedulerLink"]

log = logging.getLogger("accord.membership")

ROLE_GPU_AGENT = "gpu-agent"
"""``role`` metadata of a GPU agent (``accord nodes agent --gossip-seeds ...``)."""


class _NodeStatus(Protocol):
    @property
    def alive(self) -> bool: ...
    @property
    def last_heartbeat(self) -> float: ...


class _Replica(Protocol):
    @property
    def nodes(self) -> Mapping[str, _NodeStatus]: ...


class _Service(Protocol):
    def node_dead(self, node: str, request_id: str | None = None) -> Awaitable[dict[str, Any]]: ...


class MembershipView(Protocol):
    """What the link needs of the node's membership (``NodeMembership`` fits)."""

    def subscribe(self, maxsize: int = ...) -> Subscription: ...
    def members(self, role: str | None = None) -> list[Member]: ...
    def wall_time(self, loop_time: float) -> float: ...


class SchedulerLike(Protocol):
    """What the link needs of the scheduling shard (``SchedulerShard`` fits)."""

    @property
    def sm(self) -> _Replica: ...
    @property
    def service(self) -> _Service: ...
    def is_leader(self) -> bool: ...
    def fenced(self, node: str) -> bool: ...


def scheduler_node(member: Member) -> str:
    """The scheduler node name a GPU agent member stands for."""
    return member.meta.get("node") or member.name


class SchedulerLink:
    """Turns SWIM deaths of GPU agents into ``node_dead`` commands (see the module docstring)."""

    def __init__(self, membership: MembershipView, scheduler: SchedulerLike, *,
                 interval: float = 1.0) -> None:
        self.membership = membership
        self.scheduler = scheduler
        self.interval = interval
        self.declared = 0
        """``node_dead`` commands committed by this link."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        """Start following membership; returns the task (its owner cancels it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="membership-scheduler")
        return self._task

    async def _run(self) -> None:
        sub = self.membership.subscribe()
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        event = await sub.get()
                        if event is None:
                            return
                try:
                    await self.reconcile()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # keep following: the next round retries
                    log.warning("membership: telling the scheduler about dead agents failed: %s", e)
        finally:
            sub.close()

    def due(self) -> list[str]:
        """Scheduler nodes whose agent SWIM holds dead and the replica still holds alive."""
        out = []
        nodes = self.scheduler.sm.nodes
        for m in self.membership.members(role=ROLE_GPU_AGENT):
            if m.state != MemberState.DEAD:
                continue
            name = scheduler_node(m)
            st = nodes.get(name)
            if st is None or not st.alive:
                continue
            if st.last_heartbeat >= self.membership.wall_time(m.state_since):
                continue  # heard from (re-registered) after SWIM's verdict
            if self.scheduler.fenced(name):
                continue  # dead to SWIM, but maybe only cut off: its tasks may still run
            out.append(name)
        return out

    async def reconcile(self) -> list[str]:
        """Leader only: declare every due node dead; returns the nodes declared."""
        if not self.scheduler.is_leader():
            return []
        done = []
        for name in self.due():
            log.warning("membership: GPU agent %s is dead; requeueing its jobs", name)
            out = await self.scheduler.service.node_dead(name)
            self.declared += 1
            done.append(name)
            if out.get("requeued"):
                log.info("membership: requeued %s from %s", ", ".join(out["requeued"]), name)
        return done
