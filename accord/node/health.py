"""A node's health, as etcd reports it: ``/health``, ``/livez``, ``/readyz``, gRPC health.

``/health`` is etcd's: ``{"health":"true","reason":""}`` with 200, or ``"false"`` and
the first reason with 503. The reasons, checked in etcd's order:

1. an alarm is raised (``ALARM NOSPACE``, ``ALARM CORRUPT``; ``?exclude=NOSPACE`` ignores
   one kind);
2. without ``?serializable=true``: a Raft group on this member knows no leader
   (``RAFT NO LEADER``; etcd has one group, accord asks the same of all of its);
3. a read of the key ``health`` fails (``RANGE ERROR:<message>``): linearizable, so it
   needs a quorum, or with ``?serializable=true`` served from this member's replica.

``/livez`` and ``/readyz`` are etcd 3.6's: named checks run in order, ``ok`` with 200 when
all pass, ``[-]<check> failed: <why>`` lines with 503 when one fails (``?verbose`` lists
passing checks as ``[+]<check> ok``; ``?exclude=<check>`` skips one; ``/readyz/<check>``
runs one). ``/livez`` asks whether the process works at all (``serializable_read``);
``/readyz`` whether it should get traffic (``data_corruption``, ``serializable_read``,
``linearizable_read``).

The gRPC health service (``grpc.health.v1.Health``) says the same as ``/readyz``:
:class:`HealthMonitor` runs the ``/readyz`` checks every ``SYNC_INTERVAL`` seconds and
sets every service SERVING or NOT_SERVING from the result, so a gRPC probe and an HTTP
probe never disagree for longer than that; on shutdown both say no at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from grpc_health.v1 import health_pb2

from accord.node.grpc_server import AccordGrpcServer
from accord.proto import rpc_pb2
from accord.raft.core.types import NO_NODE
from accord.raft.host.multiraft import MultiRaftHost
from accord.services.kv.backend import StateMachineBackend
from accord.services.kv.errors import EtcdError

log = logging.getLogger("accord.node.health")

READ_TIMEOUT = 5.0
"""Seconds a health read may take before it counts as failed (etcd: its request timeout)."""
SYNC_INTERVAL = 2.0
"""Seconds between two updates of the gRPC health service from the ``/readyz`` checks."""
HEALTH_KEY = b"health"
"""The key the read checks range over (``etcdctl endpoint health`` reads the same)."""
LIVEZ_CHECKS = ("serializable_read",)
READYZ_CHECKS = ("data_corruption", "serializable_read", "linearizable_read")


def raised_alarms(backend: StateMachineBackend) -> list[str]:
    """The types of the alarms raised in the cluster (``NOSPACE``, ``CORRUPT``), in order."""
    return [rpc_pb2.AlarmType.Name(kind) for _, kind in backend.alarms.raised]


class HealthNode(Protocol):
    """What the checks read of a node."""

    @property
    def host(self) -> MultiRaftHost: ...

    @property
    def backend(self) -> StateMachineBackend: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of a ``/livez`` or ``/readyz`` request."""

    ok: bool
    lines: tuple[str, ...]
    """``[+]name ok`` / ``[-]name failed: why`` for each check run, in order."""

    def body(self, verbose: bool) -> str:
        """The response text, etcd's way."""
        if not self.ok:
            return "".join(f"{line}\n" for line in self.lines)
        listed = "".join(f"{line}\n" for line in self.lines) if verbose else ""
        return listed + "ok\n"


class HealthChecks:
    """The checks behind every health endpoint of one node."""

    def __init__(self, node: HealthNode, *, read_timeout: float = READ_TIMEOUT,
                 read: Callable[[rpc_pb2.RangeRequest], Awaitable[object]] | None = None) -> None:
        self._node = node
        self._timeout = read_timeout
        self._range = read or node.backend.range
        """How the health key is read: the backend's range, or, in a worker of a node of
        several, the router's (the key's shard may be another worker's)."""
        self.stopping = False
        """Set when the node shuts down: every check fails from then on."""
        self._checks: dict[str, Callable[[], Awaitable[None]]] = {
            "data_corruption": self._no_corruption,
            "serializable_read": lambda: self._read(serializable=True),
            "linearizable_read": lambda: self._read(serializable=False),
        }

    def leaderless_groups(self) -> int:
        """Groups on this member that know no leader now."""
        return sum(1 for g in self._node.host.groups.values() if g.core.leader_id == NO_NODE)

    async def health(self, *, serializable: bool, exclude: Sequence[str] = ()) -> tuple[bool, str]:
        """``/health``: (healthy, reason) with etcd's reasons (see the module docstring)."""
        if self.stopping:
            return False, "SHUTTING DOWN"
        for name in raised_alarms(self._node.backend):
            if name not in exclude:
                return False, f"ALARM {name if name in ('NOSPACE', 'CORRUPT') else 'UNKNOWN'}"
        if not serializable and self.leaderless_groups():
            return False, "RAFT NO LEADER"
        try:
            await self._read(serializable=serializable)
        except CheckFailed as e:
            return False, f"RANGE ERROR:{e}"
        return True, ""

    def names(self, kind: str) -> tuple[str, ...]:
        """The checks of ``livez`` or ``readyz``."""
        return LIVEZ_CHECKS if kind == "livez" else READYZ_CHECKS

    async def run(self, names: Sequence[str]) -> Verdict:
        """Run ``names`` in order; every one runs, as etcd does, so the answer lists all."""
        ok = True
        lines = []
        for name in names:
            try:
                if self.stopping:
                    raise CheckFailed("the member is shutting down")
                await self._checks[name]()
            except CheckFailed as e:
                ok = False
                lines.append(f"[-]{name} failed: {e}")
            else:
                lines.append(f"[+]{name} ok")
        return Verdict(ok, tuple(lines))

    async def _no_corruption(self) -> None:
        if "CORRUPT" in raised_alarms(self._node.backend):
            raise CheckFailed("alarm activated: CORRUPT")

    async def _read(self, *, serializable: bool) -> None:
        """Range over the health key; ``CheckFailed`` naming why it could not."""
        req = rpc_pb2.RangeRequest(key=HEALTH_KEY, keys_only=True, limit=1,
                                   serializable=serializable)
        try:
            async with asyncio.timeout(self._timeout):
                await self._range(req)
        except TimeoutError:
            raise CheckFailed("context deadline exceeded") from None
        except EtcdError as e:
            raise CheckFailed(e.message) from None


class CheckFailed(Exception):
    """A health check failed; the message says why (it goes into the answer)."""


class HealthMonitor:
    """Keeps the gRPC health service in step with ``/readyz`` (see the module docstring)."""

    def __init__(self, checks: HealthChecks, grpc: AccordGrpcServer,
                 services: Sequence[str], *, interval: float = SYNC_INTERVAL) -> None:
        self._checks = checks
        self._grpc = grpc
        self._services = tuple(services)
        self._interval = interval
        self.serving: bool | None = None
        """What the gRPC health service says now (None before ``start``)."""
        self._ever_ready = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Say NOT_SERVING until the first ``/readyz`` verdict, then follow it (the task
        is owned here; ``stop`` cancels and awaits it)."""
        await self._publish(False)
        self._task = asyncio.create_task(self._loop(), name="health-monitor")

    async def _publish(self, ok: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if ok
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in self._services:
            await self._grpc.health.set(name, status)
        self.serving = ok

    async def sync(self) -> bool:
        """Run the ``/readyz`` checks once and publish the answer; returns it."""
        verdict = await self._checks.run(READYZ_CHECKS)
        if verdict.ok != self.serving:
            first = self.serving is None or (verdict.ok and not self._ever_ready)
            await self._publish(verdict.ok)
            if verdict.ok:
                log.info("%s: %s", "ready" if first else "ready again", "; ".join(verdict.lines))
            else:
                log.warning("not ready: %s", "; ".join(verdict.lines))
        self._ever_ready |= verdict.ok
        return verdict.ok

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:  # a check that broke must not end the monitor
                log.exception("health check failed to run")
            await asyncio.sleep(self._interval)

    async def stop(self) -> None:
        """Stop following; the caller marks the services NOT_SERVING for shutdown."""
        self._checks.stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
