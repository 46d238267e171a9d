"""The checkpoint group on a node: its state machine, latest-pointer watchers, lease expiry.

``CheckpointGroup`` wraps the pure :class:`CheckpointStateMachine` for the Multi-Raft
host (``apply(index, payload)``, ``prepare_snapshot``, ``restore``) and owns the
:class:`CheckpointService` the gRPC servicer calls. Commands are msgpack, proposed in
the group's own Raft group (``CHECKPOINT_GROUP``); one that meets a leader change is
retried with the *same* command id, which the state machine answers from its memory of
applied ids, so a retry never applies twice.

Only the group's leader expires leases: every ``expire_interval`` seconds, if a pending
step on its replica is past its deadline, it proposes ``expire`` with its clock; the
decision is in the log, so every replica aborts the same steps.

Each replica tells watchers of a job's latest pointer when an applied commit moves it
(or a snapshot install does), so ``WatchLatest`` works on any member.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from accord.services.checkpoints.batching import Coalescer
from accord.services.checkpoints.service import CheckpointService, Holder
from accord.services.checkpoints.state import CheckpointStateMachine
from accord.services.retrying import ProposeBytes, until_deadline

log = logging.getLogger("accord.checkpoints")

CHECKPOINT_GROUP = 4
"""The Raft group of the checkpoint service (1 meta, 2 and 101.. KV, 3 scheduling)."""


class GroupUnavailable(Exception):
    """The checkpoint group could not commit or read in time (no leader, timeout)."""


@dataclass(slots=True)
class GroupConfig:
    """Timing of the group's requests and leader duties."""

    request_timeout: float = 15.0
    """Total time a command may take, retries included."""
    attempt_timeout: float = 3.0
    """One proposal attempt; a lost forward is retried after this."""
    expire_interval: float = 1.0
    """Seconds between the leader's looks for pending steps past their lease."""


class LatestWatchers:
    """Per-job fan-out of ``(latest, version)`` changes to watchers (newest value wins)."""

    def __init__(self) -> None:
        self._watchers: dict[str, set[asyncio.Queue[tuple[int | None, int] | None]]] = {}

    def publish(self, job: str, latest: int | None, version: int) -> None:
        for q in self._watchers.get(job, ()):
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()  # a slow watcher only needs the newest pointer
            q.put_nowait((latest, version))

    async def watch(self, job: str, current: Callable[[], tuple[int | None, int]]
                    ) -> AsyncIterator[tuple[int | None, int]]:
        """The job's pointer now, then each time it moves (until :meth:`close`)."""
        q: asyncio.Queue[tuple[int | None, int] | None] = asyncio.Queue(maxsize=1)
        self._watchers.setdefault(job, set()).add(q)
        try:
            last = current()
            yield last
            while True:
                item = await q.get()
                if item is None:
                    return
                if item[1] > last[1]:
                    last = item
                    yield item
        finally:
            qs = self._watchers.get(job)
            if qs is not None:
                qs.discard(q)
                if not qs:
                    del self._watchers[job]

    def close(self) -> None:
        for qs in self._watchers.values():
            for q in qs:
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                q.put_nowait(None)
        self._watchers.clear()


class CheckpointGroup:
    """The checkpoint group on one member: replica, service, watchers, leader duties."""

    def __init__(self, propose_bytes: ProposeBytes, barrier: Callable[[float], Awaitable[None]],
                 *, is_leader: Callable[[], bool] = lambda: True, holder: Holder | None = None,
                 config: GroupConfig | None = None, clock: Callable[[], float] = time.time,
                 origin: str | None = None) -> None:
        self.config = config or GroupConfig()
        self.sm = CheckpointStateMachine()
        self.clock = clock
        self._propose_bytes = propose_bytes
        self._barrier = barrier
        self.is_leader = is_leader
        self.service = CheckpointService(self.sm, self._propose, holder=holder, clock=clock,
                                         origin=origin)
        self.watchers = LatestWatchers()
        self.coalescer = Coalescer(self._send)
        """Concurrent registrations go to the log together, as batch entries."""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def on_host(cls, host: Any, member_id: int, *, holder: Holder | None = None,
                config: GroupConfig | None = None, group_id: int = CHECKPOINT_GROUP
                ) -> CheckpointGroup:
        """A group whose commands go through ``host`` (a ``MultiRaftHost``) in ``group_id``."""
        from accord.raft.core.types import Role

        async def propose(payload: bytes, timeout: float) -> object:
            return await host.propose(group_id, payload, timeout=timeout)

        async def barrier(timeout: float) -> None:
            await host.read_barrier(group_id, timeout=timeout)

        def is_leader() -> bool:
            return bool(host.group(group_id).core.role == Role.LEADER)

        return cls(propose, barrier, is_leader=is_leader, holder=holder, config=config,
                   origin=f"{member_id:x}-{time.time_ns() & 0xFFFFFFFF:x}")

    # ----- the host's StateMachine protocol ----------------------------------------------

    def apply(self, index: int, payload: bytes) -> object:
        """Apply one committed command (or batch); tell watchers when a latest pointer
        moved."""
        try:
            cmd = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:
            return self.sm.apply(payload)  # it answers what is wrong with the bytes
        result = self.sm.apply(cmd)
        if isinstance(cmd, dict) and cmd.get("op") == "batch":
            for sub, res in zip(cmd["cmds"], result.get("results", ()), strict=False):
                self._moved(sub, res)
        else:
            self._moved(cmd, result)
        return result

    def _moved(self, cmd: Any, result: dict[str, Any]) -> None:
        if result.get("latest_changed") and not result.get("duplicate"):
            job = str(cmd["job"])
            j = self.sm.jobs[job]
            self.watchers.publish(job, j.latest, j.latest_version)

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """Serialize now (the state is mutable); the thread only hands the bytes over."""
        data = self.sm.snapshot()
        return lambda: data

    def restore(self, data: bytes) -> None:
        """Replace the replica by a snapshot's; watchers hear of every moved pointer."""
        before = {name: j.latest_version for name, j in self.sm.jobs.items()}
        self.sm.restore(data)
        for name, j in self.sm.jobs.items():
            if j.latest_version != before.get(name, 0):
                self.watchers.publish(name, j.latest, j.latest_version)

    # ----- commands and reads -------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[float], Awaitable[object]]) -> object:
        return await until_deadline(
            attempt, request_timeout=self.config.request_timeout,
            attempt_timeout=self.config.attempt_timeout, first_delay=0.02,
            unavailable=lambda last: GroupUnavailable(f"checkpoint group unavailable: {last}"))

    async def _send(self, payload: bytes) -> object:
        return await self._retrying(lambda t: self._propose_bytes(payload, t))

    async def _propose(self, cmd: dict[str, Any]) -> dict[str, Any]:
        payload = bytes(msgpack.packb(cmd, use_bin_type=True))
        # Registrations arrive by the hundred at once (one per host of a job): they share
        # entries. Other commands are one at a time per job and go alone.
        result = await (self.coalescer.submit(payload) if cmd.get("op") == "register"
                        else self._send(payload))
        if not isinstance(result, dict):
            raise GroupUnavailable(f"unexpected answer from the checkpoint group: {result!r}")
        return result

    async def barrier(self) -> None:
        """Linearizable read point: this replica has applied everything committed before."""
        await self._retrying(self._barrier)

    def latest(self, job: str) -> tuple[int | None, int]:
        """A job's latest committed step and its pointer version (``(None, 0)`` if none)."""
        j = self.sm.jobs.get(job)
        return (None, 0) if j is None else (j.latest, j.latest_version)

    # ----- leader duties ------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start the lease-expiry loop (idle while this member does not lead)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="checkpoints-expiry")
        return self._task

    async def stop(self) -> None:
        """Stop the loop, the batches in flight and every watch."""
        self.watchers.close()
        await self.coalescer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.expire_interval)
            try:
                await self.expire_once()
            except GroupUnavailable as e:
                log.info("checkpoint lease expiry deferred: %s", e)
            except Exception:  # keep expiring: one failed round must not stop the duty
                log.exception("checkpoint lease expiry failed")

    async def expire_once(self) -> list[list[Any]]:
        """Leader only: abort pending steps whose lease ran out; returns them."""
        if not self.is_leader() or not self.sm.expired_pending(self.clock()):
            return []
        expired = await self.service.expire()
        if expired:
            log.info("checkpoints: leases expired, steps aborted: %s", expired)
        return expired


def local_group(*, holder: Holder | None = None, config: GroupConfig | None = None,
                clock: Callable[[], float] = time.time) -> CheckpointGroup:
    """A single-replica group that applies commands directly (tests, no Raft)."""
    holder_box: list[CheckpointGroup] = []
    counter = [0]

    async def propose(payload: bytes, timeout: float) -> object:
        counter[0] += 1
        return holder_box[0].apply(counter[0], payload)

    async def barrier(timeout: float) -> None:
        return None

    group = CheckpointGroup(propose, barrier, holder=holder, config=config, clock=clock)
    holder_box.append(group)
    return group
