"""SWIM membership from Python — ``client.membership``: members, states and events.

Each node answers with its own SWIM view (views converge within a few probe intervals).
:meth:`MembershipApi.watch` yields the view as it stands, then one event per change;
after a disconnect it reopens the stream on the next endpoint, which starts again with
that node's current view (a :class:`MembershipEvent` of kind ``snapshot``), so the
caller's picture is rebuilt rather than patched across a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from accord.client.errors import ClientError, Unavailable
from accord.client.transport import EndpointPool
from accord.proto import membership_pb2 as pb
from accord.proto import membership_pb2_grpc

_rpc: Any = membership_pb2_grpc

MEMBER_STATES = ("alive", "suspect", "dead", "left")
"""What :attr:`SwimMember.state` can be."""


@dataclass(frozen=True, slots=True)
class SwimMember:
    """One member of the SWIM view: a daemon (role ``accord``) or a GPU agent."""

    name: str
    address: str
    state: str
    """One of :data:`MEMBER_STATES`."""
    incarnation: int
    metadata: dict[str, str]
    state_age: float
    """Seconds since it entered ``state``, as the answering node saw it."""

    @property
    def role(self) -> str:
        """``accord``, ``gpu-agent`` or "" (its metadata's role)."""
        return self.metadata.get("role", "")

    @property
    def live(self) -> bool:
        """Alive or suspect (not yet declared dead, not left)."""
        return self.state in ("alive", "suspect")

    @classmethod
    def from_pb(cls, m: pb.Member) -> SwimMember:
        """From the wire message."""
        return cls(m.name, m.address, m.state, int(m.incarnation), dict(m.metadata),
                   float(m.state_age))


@dataclass(frozen=True, slots=True)
class MembershipView:
    """Every member one node knows, and that node's name."""

    self_name: str
    members: tuple[SwimMember, ...]


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """``snapshot`` (``members`` holds the view) or a change to one ``member``:
    ``joined``, ``updated``, ``suspect``, ``dead``, ``left``, ``alive``."""

    kind: str
    member: SwimMember | None
    members: tuple[SwimMember, ...]
    endpoint: str
    """The node whose view this is."""


class MembershipApi:
    """``client.membership``: the ``accord.membership.v1.Membership`` service."""

    def __init__(self, pool: EndpointPool) -> None:
        self._pool = pool

    async def members(self, *, role: str = "", timeout: float | None = None) -> MembershipView:
        """Every member the current endpoint knows (only ``role`` ones if given)."""
        async def call(ch: grpc.aio.Channel, t: float) -> pb.MembersResponse:
            r: pb.MembersResponse = await _rpc.MembershipStub(ch).Members(
                pb.MembersRequest(role=role), timeout=t)
            return r
        r = await self._pool.call(call, idempotent=True, timeout=timeout)
        return MembershipView(r.self, tuple(SwimMember.from_pb(m) for m in r.members))

    async def watch(self, *, role: str = "") -> AsyncIterator[MembershipEvent]:
        """The view, then its events as they happen; reopens on the next endpoint (with a
        fresh ``snapshot``) when the stream breaks."""
        failing_since: float | None = None
        attempt = 0
        last = ""
        while True:
            ep = self._pool.current
            stream: Any = None
            try:
                stream = _rpc.MembershipStub(self._pool.channel(ep)).Watch(
                    pb.WatchRequest(role=role))
                async for r in stream:
                    failing_since, attempt = None, 0
                    if r.kind == "snapshot":
                        yield MembershipEvent("snapshot", None,
                                              tuple(SwimMember.from_pb(m) for m in r.snapshot), ep)
                    else:
                        yield MembershipEvent(r.kind, SwimMember.from_pb(r.member), (), ep)
                last = "stream ended by the server"
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN,
                                    grpc.StatusCode.ABORTED):
                    raise ClientError(e.code(), e.details() or "", endpoint=ep) from None
                last = f"{e.code().name}: {e.details()}"
            finally:
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.cancel()
            self._pool.fail_over(ep)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > self._pool.retry_budget_s:
                raise Unavailable(grpc.StatusCode.UNAVAILABLE,
                                  f"membership watch: no endpoint answered for "
                                  f"{self._pool.retry_budget_s:.0f}s; last error: {last}",
                                  endpoint=ep)
            await asyncio.sleep(self._pool.policy.backoff.delay(attempt))
            attempt += 1
