"""The alarms a cluster has raised (etcd's ``Maintenance.Alarm``), as etcd keeps them.

An alarm is a ``(member id, AlarmType)`` pair. etcd keeps alarms in its replicated state
(every member lists the same ones) and under the member id they were raised for, 0
("all members") included. On a node the table lives in the meta group's state machine
(``ClusterStateMachine.alarms``), so raising or clearing one is a Raft command and every
member sees it; a single-store backend keeps its own. While NOSPACE is raised, writes
that add data are refused (``StateMachineBackend``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accord.proto import rpc_pb2


@dataclass(slots=True)
class AlarmTable:
    """Raised alarms, as ``(member_id, AlarmType)`` pairs, in raise order."""

    raised: list[tuple[int, int]] = field(default_factory=list)

    def apply(self, req: rpc_pb2.AlarmRequest) -> list[tuple[int, int]]:
        """Apply an ``AlarmRequest``; returns the alarms the response lists (etcd's rules).

        An alarm is kept under the ``memberID`` it is raised for, 0 ("all members")
        included, as etcd keeps it: the same alarm raised for member 0 and for a named
        member are two entries, and deactivating one leaves the other."""
        target = req.memberID
        if req.action == rpc_pb2.AlarmRequest.GET:
            return [a for a in self.raised if req.alarm in (rpc_pb2.NONE, a[1])]
        if req.action == rpc_pb2.AlarmRequest.ACTIVATE:
            if req.alarm == rpc_pb2.NONE:
                return []
            entry = (target, int(req.alarm))
            if entry not in self.raised:
                self.raised.append(entry)
            return [entry]
        # DEACTIVATE
        entry = (target, int(req.alarm))
        if entry in self.raised:
            self.raised.remove(entry)
            return [entry]
        return []

    def has(self, alarm: int) -> bool:
        """Whether any member raised ``alarm``."""
        return any(a[1] == alarm for a in self.raised)

    def names(self) -> tuple[str, ...]:
        """Alarm strings for ``StatusResponse.errors``: etcd's text form of the alarm,
        "memberID:… alarm:… ", which leaves out a zero member id ("alarm:NOSPACE ")."""
        return tuple(
            (f"memberID:{mid} " if mid else "") + f"alarm:{rpc_pb2.AlarmType.Name(a)} "
            for mid, a in self.raised
        )

    def dump(self) -> list[list[int]]:
        """A msgpack-able image."""
        return [[m, a] for m, a in self.raised]

    def load(self, image: list[list[int]]) -> None:
        """Replace the alarms by an image's (in place: holders of the table see it)."""
        self.raised[:] = [(int(m), int(a)) for m, a in image]
