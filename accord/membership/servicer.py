"""The ``accord.membership.v1.Membership`` gRPC service over a ``NodeMembership``.

``Members`` answers with this node's view (every member, whatever its state: dead and
left ones stay listed for an hour); ``Watch`` streams a snapshot of the view, then one
message per membership event. A node that runs no membership (``--gossip-listen
off``) answers ``FAILED_PRECONDITION`` saying so; an unknown role filter is simply
an empty answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from accord.proto import membership_pb2 as pb
from accord.proto import membership_pb2_grpc

from .service import MembershipDisabled, NodeMembership
from .state import Member

__all__ = ["MembershipServicer", "add_membership_service", "member_to_pb"]

_grpc_mod: Any = membership_pb2_grpc  # the generated module carries no annotations


def member_to_pb(member: Member, age: float) -> pb.Member:
    """A member record as its message; ``age`` is seconds in its current state."""
    return pb.Member(name=member.name, address=f"{member.addr[0]}:{member.addr[1]}",
                     state=member.state.name.lower(), incarnation=member.incarnation,
                     metadata=dict(member.meta), state_age=round(age, 3))


class MembershipServicer(membership_pb2_grpc.MembershipServicer):
    """``accord.membership.v1.Membership`` on one node."""

    def __init__(self, membership: NodeMembership) -> None:
        self.membership = membership

    def _pb(self, member: Member) -> pb.Member:
        return member_to_pb(member, self.membership.state_age(member))

    async def Members(self, request: pb.MembersRequest,
                      context: grpc.aio.ServicerContext) -> pb.MembersResponse:
        """Every member of this node's view, sorted by name."""
        try:
            members = self.membership.members(request.role or None)
        except MembershipDisabled as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            raise  # pragma: no cover - abort raises
        return pb.MembersResponse(self=self.membership.name,
                                  members=[self._pb(m) for m in members])

    async def Watch(self, request: pb.WatchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchResponse]:
        """The view now, then every event (the stream ends when the node stops)."""
        role = request.role or None
        try:
            # Subscribe before reading the view, with no await in between: nothing is missed.
            sub = self.membership.subscribe(maxsize=4096)
            members = self.membership.members(role)
        except MembershipDisabled as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            raise  # pragma: no cover - abort raises
        try:
            yield pb.WatchResponse(kind="snapshot", snapshot=[self._pb(m) for m in members])
            async for event in sub:
                if sub.dropped:
                    await context.abort(grpc.StatusCode.ABORTED,
                                        "membership watch fell behind and missed events; "
                                        "watch again for a fresh snapshot")
                if role is not None and event.member.meta.get("role") != role:
                    continue
                yield pb.WatchResponse(kind=event.kind.value, member=self._pb(event.member))
        finally:
            sub.close()


def add_membership_service(server: grpc.aio.Server, membership: NodeMembership) -> MembershipServicer:
    """Register the membership service on ``server``; returns the servicer."""
    servicer = MembershipServicer(membership)
    _grpc_mod.add_MembershipServicer_to_server(servicer, server)
    return servicer
