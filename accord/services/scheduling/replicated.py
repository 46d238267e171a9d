"""The scheduling shard on a node: group 3's state machine, its events, and the leader loop.

``SchedulerShard`` wraps the pure ``SchedulerStateMachine`` for the Multi-Raft host
(``apply(index, payload)``, ``prepare_snapshot``, ``restore``) and owns the
``SchedulingService`` the gRPC servicer calls. Every command is msgpack, proposed
through ``propose_bytes`` (``host.propose(3, ...)`` on a node); a proposal that
meets a leader change is retried with the *same* command id, which the state
machine answers from its memory of applied ids, so a retry never applies twice.

Only the shard leader schedules: every ``cycle_interval`` seconds (and right after
a submit, a release or a node change) it computes decisions with the pure cycle
code on its replica and commits them as a ``place_jobs`` command. At the start of
each reign it first waits for a ReadIndex barrier, so it decides on everything
earlier leaders committed. Apply re-validates each placement, so a decision made
on a slightly stale replica, or a deposed leader's late one, cannot place a job
twice.

Agent liveness: every replica feeds the heartbeat times carried *inside* the
committed commands (so a replayed log gives the same picture) into a Phi accrual
``HeartbeatMonitor``; the leader, once it has led for ``leader_grace`` seconds,
proposes ``node_dead`` for every alive node it suspects, and apply requeues that
node's jobs. A node whose agent registered an orphan timeout (it stops its tasks by
itself after that long without a heartbeat the cluster took) is declared dead only once
its tasks are surely stopped (``tasks_stopped_by`` plus ``fence_margin``): a job is never
requeued while its tasks may still run on a node cut off from the cluster.

Each replica publishes placement events as it applies commands (``EventHub``), so
``WatchPlacements`` works on any member.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accord.membership.phi import HeartbeatMonitor
from accord.services.retrying import ProposeBytes, until_deadline
from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.model import Job, Node, Placement
from accord.services.scheduling.placement import Policy, place
from accord.services.scheduling.service import SchedulingService
from accord.services.scheduling.state import SchedulerStateMachine

log = logging.getLogger("accord.scheduling")

SCHEDULING_GROUP = 3

class ShardUnavailable(Exception):
    """The shard could not commit or read in time (no leader, leader changed, timeout)."""


@dataclass(slots=True)
class ShardConfig:
    """Timing of the shard's leader duties."""

    cycle_interval: float = 0.2
    """Seconds between two scheduling cycles on the leader."""
    request_timeout: float = 15.0
    """Total time a command may take, retries included."""
    attempt_timeout: float = 2.0
    """One proposal attempt; a lost forward is retried after this."""
    phi_threshold: float = 8.0
    acceptable_pause: float = 2.0
    """Added to the mean heartbeat interval before a silence counts as suspicious."""
    min_std_deviation: float = 0.2
    first_heartbeat_estimate: float = 1.0
    leader_grace: float = 3.0
    """A new leader declares no node dead before it has led this long."""
    fence_margin: float = 2.0
    """Seconds added to the time a suspected node's agent has surely stopped its tasks
    (``SchedulerStateMachine.tasks_stopped_by``) before the node is declared dead and
    its jobs requeued: the members' clocks against each other and the agent's."""
    event_buffer: int = 1024
    """Recent events kept for ``WatchPlacements(start_index)`` replays."""


@dataclass(slots=True)
class Event:
    """One placement-related change, as applied at log ``index``."""

    index: int
    kind: str
    job_id: str
    reason: str = ""
    job: Job | None = None
    placement: Placement | None = None
    master_port: int | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    """The nodes of the placement, captured at apply time (for launch facts)."""
    attempt: int = 0
    """The job's placement this is about (its ``starts``): the new one for ``placed``, the
    one that ended for the others."""
    task_nodes: tuple[str, ...] = ()
    """The nodes of the attempt's tasks (what a node's agent filters on)."""


class EventHub:
    """Fan-out of applied events to watchers, with a short replay buffer."""

    def __init__(self, keep: int) -> None:
        self.recent: deque[Event] = deque(maxlen=max(1, keep))
        self._queues: set[asyncio.Queue[Event | None]] = set()

    def publish(self, ev: Event) -> None:
        """Record ``ev`` and hand it to every watcher (a slow watcher's queue is bounded)."""
        self.recent.append(ev)
        for q in list(self._queues):
            if q.full():
                # Too slow: end its stream rather than grow without bound.
                self._queues.discard(q)
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                q.put_nowait(None)
            else:
                q.put_nowait(ev)

    async def subscribe(self, start_index: int = 0) -> AsyncIterator[Event]:
        """Events from now on (after buffered ones with ``index >= start_index`` if > 0)."""
        q: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=4096)
        replay = [e for e in self.recent if start_index and e.index >= start_index]
        self._queues.add(q)
        try:
            last = 0
            for e in replay:
                last = e.index
                yield e
            while True:
                ev = await q.get()
                if ev is None:
                    return
                if ev.index > last or ev.index == 0:
                    yield ev
        finally:
            self._queues.discard(q)

    def close(self) -> None:
        """End every watcher's stream."""
        for q in list(self._queues):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)
        self._queues.clear()


class SchedulerShard:
    """Group 3 on one member: replica, service, events and leader duties."""

    def __init__(self, propose_bytes: ProposeBytes, barrier: Callable[[float], Awaitable[None]],
                 *, is_leader: Callable[[], bool] = lambda: True,
                 leader_info: Callable[[], tuple[int, int, int, int]] = lambda: (0, 0, 0, 0),
                 config: ShardConfig | None = None, clock: Callable[[], float] = time.time,
                 origin: str | None = None) -> None:
        self.config = config or ShardConfig()
        self.sm = SchedulerStateMachine()
        self.clock = clock
        self._propose_bytes = propose_bytes
        self._barrier = barrier
        self.is_leader = is_leader
        self.leader_info = leader_info
        """``() -> (member id, leader id, term, applied index)``."""
        self.service = SchedulingService(self.sm, self._propose, clock=clock,
                                         origin=origin or uuid.uuid4().hex[:12])
        self.events = EventHub(self.config.event_buffer)
        self.monitor = self._new_monitor()
        self._last_heard: dict[str, float] = {}
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._led_since: float | None = None
        self._led_term = -1
        self._empty: tuple[tuple[Node, ...], CapacityIndex] | None = None
        """The registered nodes, idle: what ``fits_somewhere`` searches (rebuilt on change)."""
        self.cycles = 0
        """Scheduling cycles that committed something (for tests and metrics)."""
        self.on_placed: Callable[[float], None] | None = None
        """Leader only: called with each job's seconds from submission to its first
        placement, once the placement committed (the node's latency histogram)."""
        self.on_preempted: Callable[[int], None] | None = None
        """Leader only: called with how many running jobs a committed cycle preempted."""

    @classmethod
    def on_host(cls, host: Any, member_id: int, config: ShardConfig | None = None,
                group_id: int = SCHEDULING_GROUP) -> SchedulerShard:
        """A shard whose commands go through ``host`` (a ``MultiRaftHost``) in ``group_id``."""
        from accord.raft.core.types import Role

        async def propose(payload: bytes, timeout: float) -> object:
            return await host.propose(group_id, payload, timeout=timeout)

        async def barrier(timeout: float) -> None:
            await host.read_barrier(group_id, timeout=timeout)

        def is_leader() -> bool:
            return bool(host.group(group_id).core.role == Role.LEADER)

        def info() -> tuple[int, int, int, int]:
            g = host.group(group_id)
            return member_id, int(g.core.leader_id), int(g.core.term), int(g.applied)

        return cls(propose, barrier, is_leader=is_leader, leader_info=info, config=config,
                   origin=f"{member_id:x}-{time.time_ns() & 0xFFFFFFFF:x}")

    def _new_monitor(self) -> HeartbeatMonitor:
        c = self.config
        return HeartbeatMonitor(threshold=c.phi_threshold, min_std_deviation=c.min_std_deviation,
                                acceptable_pause=c.acceptable_pause,
                                first_heartbeat_estimate=c.first_heartbeat_estimate)

    # ----- the host's StateMachine protocol --------------------------------------------

    def apply(self, index: int, payload: bytes) -> object:
        """Apply one committed command; publish what it changed; feed liveness."""
        try:
            cmd = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:
            return self.sm.apply(payload)  # the state machine words the error
        if not isinstance(cmd, dict):
            return self.sm.apply(cmd)
        before = self._placed_ids(cmd)
        result = self.sm.apply(cmd)
        if result.get("ok") and not result.get("duplicate"):
            self._after(index, cmd, result, before)
        return result

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """Serialize now (the state is mutable); the thread only hands the bytes over."""
        data = self.sm.snapshot()
        return lambda: data

    def restore(self, data: bytes) -> None:
        """Replace the replica by a snapshot's; liveness restarts from its heartbeat times."""
        self.sm.restore(data)
        self.monitor = self._new_monitor()
        self._last_heard = {}
        for name, st in self.sm.nodes.items():
            if st.alive and st.last_heartbeat:
                self._heard(name, st.last_heartbeat)

    # ----- apply side effects --------------------------------------------------------------

    def _placed_ids(self, cmd: dict[str, Any]) -> list[str]:
        if cmd.get("op") in ("cancel_job", "job_finished"):
            return [str(cmd.get("job_id"))]
        return []

    def _heard(self, node: str, when: float) -> None:
        # Times come from the proposing members' clocks: never let one go backwards.
        when = max(when, self._last_heard.get(node, when))
        self._last_heard[node] = when
        self.monitor.heartbeat(node, when)

    def _publish(self, ev: Event) -> None:
        r = self.sm.jobs.get(ev.job_id)
        if r is not None:
            ev.task_nodes = tuple(dict.fromkeys(t.node for t in r.tasks))
        self.events.publish(ev)

    def _after(self, index: int, cmd: dict[str, Any], result: dict[str, Any], before: list[str]
               ) -> None:
        op = cmd.get("op")
        now = float(cmd.get("now", 0.0))
        if op in ("register_node", "heartbeat"):
            node = str(cmd["node"]["name"] if op == "register_node" else cmd["node"])
            if op == "register_node":
                self.monitor.remove(node)
                self._last_heard.pop(node, None)
            self._heard(node, now)
            self._kick.set()
        if op == "node_dead":
            self.monitor.remove(str(cmd.get("node")))
            self._last_heard.pop(str(cmd.get("node")), None)
        if op in ("drain", "undrain", "submit_job", "release_job"):
            self._kick.set()
        for jid in result.get("requeued", []):
            r = self.sm.jobs[jid]
            self._publish(Event(index, "requeued", jid, r.reason, attempt=r.starts))
            self._kick.set()
        for jid in result.get("preempted", []):
            self._publish(Event(index, "preempted", jid, "preempted",
                                      attempt=self.sm.jobs[jid].starts))
        for jid in result.get("accepted", []):
            r = self.sm.jobs[jid]
            assert r.placement is not None
            nodes = {t.node: self.sm.nodes[t.node].node for t in r.placement.tasks}
            self._publish(Event(index, "placed", jid, "", r.job, r.placement, r.master_port,
                                      nodes, r.starts))
        for jid in result.get("ended", []):
            r = self.sm.jobs[jid]
            self._publish(Event(index, "finished", jid, r.status if not r.reason
                                      else f"{r.status}: {r.reason}", attempt=r.starts))
            self._kick.set()
        if op in ("cancel_job", "job_finished"):
            for jid in before:
                r = self.sm.jobs[jid]
                kind = "cancelled" if op == "cancel_job" else "finished"
                self._publish(Event(index, kind, jid, r.status, attempt=r.starts))
            self._kick.set()

    # ----- commands and reads ----------------------------------------------------------------

    async def _propose(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Commit ``cmd``, retrying (same id, so at most once) across leader changes."""
        payload = bytes(msgpack.packb(cmd, use_bin_type=True))
        result = await until_deadline(
            lambda t: self._propose_bytes(payload, t), request_timeout=self.config.request_timeout,
            attempt_timeout=self.config.attempt_timeout, first_delay=0.05,
            unavailable=lambda last: ShardUnavailable(f"scheduling shard unavailable: {last}"))
        if not isinstance(result, dict):
            raise ShardUnavailable(f"unexpected answer from the scheduling shard: {result!r}")
        return result

    async def barrier(self) -> None:
        """Linearizable read point: wait until this replica applied all committed commands."""
        await until_deadline(
            self._barrier, request_timeout=self.config.request_timeout,
            attempt_timeout=self.config.attempt_timeout, first_delay=0.05, growth=1.0,
            unavailable=lambda last: ShardUnavailable(f"scheduling shard unavailable: {last}"))

    def fits_somewhere(self, job: Job) -> bool:
        """Could ``job`` run on the registered nodes if they were all idle and in service?"""
        inventory = tuple(st.node for st in self.sm.nodes.values())
        if self._empty is None or self._empty[0] != inventory:
            index = CapacityIndex()
            for node in inventory:
                index.add_node(node)
            self._empty = (inventory, index)
        # ``place`` without ``keep`` leaves the index as it found it, so it is reused.
        return place(self._empty[1], job, Policy("best-fit")) is not None

    def fenced(self, node: str, now: float | None = None) -> bool:
        """Whether ``node``'s agent, if cut off from the cluster, may still run tasks
        (``SchedulerStateMachine.tasks_stopped_by`` plus ``fence_margin`` not reached):
        such a node is not declared dead yet, by the heartbeat detector or by SWIM
        (``membership.scheduler_link``), so its jobs never run twice."""
        stopped = self.sm.tasks_stopped_by(node)
        if stopped is None:
            return False
        return (self.clock() if now is None else now) < stopped + self.config.fence_margin

    def kick(self) -> None:
        """Ask the leader loop for a cycle now."""
        self._kick.set()

    # ----- leader duties ------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start the leader loop (it idles while this member does not lead); returns its task."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="scheduling-leader")
        return self._task

    async def stop(self) -> None:
        """Stop the leader loop and end every watch stream."""
        self.events.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.cycle_interval):
                    await self._kick.wait()
            self._kick.clear()
            try:
                await self.lead_once()
            except (TimeoutError, ShardUnavailable) as e:
                log.info("scheduling cycle deferred: %s", e)
            except Exception:  # keep leading: one bad cycle must not stop scheduling
                log.exception("scheduling cycle failed")
                await asyncio.sleep(self.config.cycle_interval)

    async def lead_once(self) -> dict[str, Any] | None:
        """One round of leader duties (no-op on a follower): liveness, then a cycle."""
        if not self.is_leader():
            self._led_since = None
            return None
        now = self.clock()
        term = self.leader_info()[2]
        if self._led_since is None or term != self._led_term:
            # A new reign: first apply everything earlier leaders committed. Later on, a
            # slightly stale replica is harmless (apply re-validates every decision).
            await self.barrier()
            self._led_since, self._led_term = now, term
        if now - self._led_since >= self.config.leader_grace:
            for peer in self.monitor.suspects(now):
                st = self.sm.nodes.get(str(peer))
                if st is None or not st.alive:
                    continue
                if self.fenced(str(peer), now):
                    continue
                log.warning("scheduling: node %s stopped heartbeating; declaring it dead", peer)
                await self.service.node_dead(str(peer))
        if not self.sm.pending:
            return None
        out = await self.service.run_cycle()
        if out["accepted"] or out["preempted"]:
            self.cycles += 1
        self._report(out)
        if out["rejected"]:
            log.info("scheduling: stale decisions rejected: %s", out["rejected"])
        return out


    def _report(self, out: dict[str, Any]) -> None:
        """Tell the metrics hooks what a committed cycle did."""
        placed, preempted = self.on_placed, self.on_preempted
        if placed is not None and out["accepted"]:
            now = self.clock()
            for jid in out["accepted"]:
                r = self.sm.jobs.get(jid)
                if r is not None and r.starts == 1 and r.job.submit_time > 0:
                    placed(now - r.job.submit_time)
        if preempted is not None and out["preempted"]:
            preempted(len(out["preempted"]))


def local_shard(config: ShardConfig | None = None, clock: Callable[[], float] = time.time
                ) -> SchedulerShard:
    """A single-replica shard that applies commands directly (tests, demos, no Raft)."""
    holder: list[SchedulerShard] = []
    counter = [0]

    async def propose(payload: bytes, timeout: float) -> object:
        counter[0] += 1
        return holder[0].apply(counter[0], payload)

    async def barrier(timeout: float) -> None:
        return None

    shard = SchedulerShard(propose, barrier, config=config, clock=clock,
                           leader_info=lambda: (1, 1, 1, counter[0]))
    holder.append(shard)
    return shard
