"""The members of a cluster as the meta group replicates them.

Every node knows the initial members (names and peer URLs) from
``--initial-cluster``; what it cannot know is where the *other* members serve
clients. As etcd does, each node publishes its own attributes (client URLs)
through consensus once it runs, so ``MemberList`` on any member lists every
member's client URLs.

The meta group also holds the shard map: for each KV shard, its Raft group and the
nodes holding its replicas. The number of shards is fixed when the cluster is created
(``--shards``); every member holds a replica of every shard, so the replicas change
with the members.

Runtime changes (etcd's MemberAdd/Remove/Update/Promote) are commands of this
machine: the table is the *desired* membership, and each group's leader brings its
group's Raft configuration in line with it (``accord/node/members.py``). ``is_learner``
is what the operator asked for (``member add --learner``); a member added as a voter
first replicates as a Raft learner in every group and is promoted once caught up.
Removed ids are kept (``removed``) as etcd does: a removed member cannot come back
under the same id, and leaders know to take it out of their groups.

The meta group also keeps the cluster's alarms (``alarms.py``), so every member lists
and enforces the same ones, as in etcd.

Versions: each member *advertises* the newest command format it can apply
(``advertise``; a member that never did, an older node, counts as format 1).
:meth:`ClusterStateMachine.min_command_format` is what every member can apply, so a
proposer uses a newer format only once every member supports it (the cluster-version
gate, ``docs/operations.md``). An older node applying ``advertise`` refuses it as an
unknown command, which changes nothing there.

The meta group also holds the auth store (users, roles, auth on/off, simple tokens):
commands named ``auth.*`` go to :class:`~accord.services.auth.statemachine.AuthStateMachine`,
and its image is part of every meta snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from accord.proto import rpc_pb2
from accord.services.auth.statemachine import AuthStateMachine
from accord.services.cluster.alarms import AlarmTable


@dataclass(slots=True)
class MemberRecord:
    """One member as the cluster knows it."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False
    command_format: int = 1
    """The newest command format the member advertised it applies (1: never said)."""


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    """Where one KV shard lives: its Raft group and the nodes with a replica."""

    shard: int
    group: int
    replicas: tuple[int, ...]


class MemberChangeError(ValueError):
    """A member command the table refuses; ``kind`` names the etcd error it maps to.

    Kinds: ``exists`` (id taken), ``url_exists`` (peer URL taken), ``not_found``,
    ``removed`` (the id belonged to a removed member), ``not_learner``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ClusterStateMachine:
    """Replicated member table and shard map (the meta group's state machine)."""

    def __init__(
        self, initial: dict[int, MemberRecord], shard_map: list[ShardPlacement] | None = None,
        auth: AuthStateMachine | None = None,
    ) -> None:
        self.auth = auth or AuthStateMachine()
        """Users, roles and tokens (``auth.*`` commands)."""
        self.members: dict[int, MemberRecord] = dict(initial)
        self.shard_map: list[ShardPlacement] = list(shard_map or [])
        self.removed: dict[int, int] = {}
        """Removed member id -> the meta log index of its removal."""
        self.alarms = AlarmTable()
        """The cluster's alarms (``alarms.py``), replicated with the table."""
        self.listeners: list[Callable[[], None]] = []
        """Called after every change of the member table (on every replica)."""

    # --- commands ------------------------------------------------------------------------
    @staticmethod
    def encode_publish(member_id: int, name: str, client_urls: list[str]) -> bytes:
        """Command: ``member_id`` serves clients at ``client_urls``."""
        return bytes(msgpack.packb(["publish", member_id, name, list(client_urls)]))

    @staticmethod
    def encode_advertise(member_id: int, command_format: int) -> bytes:
        """Command: ``member_id`` applies commands of formats up to ``command_format``."""
        return bytes(msgpack.packb(["advertise", member_id, command_format]))

    def min_command_format(self) -> int:
        """The newest command format every member applies (1 with no member)."""
        return min((m.command_format for m in self.members.values()), default=1)

    @staticmethod
    def encode_alarm(req: rpc_pb2.AlarmRequest) -> bytes:
        """Command: raise or clear an alarm (``AlarmRequest`` ACTIVATE/DEACTIVATE)."""
        return bytes(msgpack.packb(["alarm", int(req.action), req.memberID, int(req.alarm)]))

    @staticmethod
    def encode_add(member_id: int, peer_urls: list[str], is_learner: bool) -> bytes:
        """Command: add a member (no name until it publishes, as in etcd)."""
        return bytes(msgpack.packb(["add", member_id, list(peer_urls), is_learner]))

    @staticmethod
    def encode_remove(member_id: int) -> bytes:
        """Command: remove a member for good."""
        return bytes(msgpack.packb(["remove", member_id]))

    @staticmethod
    def encode_update(member_id: int, peer_urls: list[str]) -> bytes:
        """Command: change a member's peer URLs."""
        return bytes(msgpack.packb(["update", member_id, list(peer_urls)]))

    @staticmethod
    def encode_promote(member_id: int) -> bytes:
        """Command: a learner member is to become a voter."""
        return bytes(msgpack.packb(["promote", member_id]))

    def apply(self, index: int, payload: bytes) -> object:
        """Apply one command; returns the member it changed (the list, for a removal)."""
        op, *args = msgpack.unpackb(payload)
        if AuthStateMachine.handles(op):
            return self.auth.apply(index, op, args)
        handler = self._handlers.get(op)
        if handler is None:
            raise ValueError(f"unknown cluster command {op!r}")
        result = handler(self, index, *args)
        if op != "publish" or result is not None:
            self._changed()
        return result

    def _publish(self, index: int, member_id: int, name: str,
                 client_urls: list[str]) -> MemberRecord:
        rec = self.members.get(member_id)
        if rec is None:
            raise ValueError(f"member {member_id:x} ({name}) is not part of this cluster")
        rec.client_urls = tuple(client_urls)
        if not rec.name:
            rec.name = name
        return rec

    def _advertise(self, index: int, member_id: int, command_format: int) -> MemberRecord:
        rec = self.members.get(member_id)
        if rec is None:
            raise ValueError(f"member {member_id:x} is not part of this cluster")
        if not isinstance(command_format, int) or command_format < 1:
            raise ValueError(f"command format {command_format!r} must be an integer >= 1")
        rec.command_format = command_format
        return rec

    def _alarm(self, index: int, action: int, member_id: int, alarm: int) -> list[tuple[int, int]]:
        if action not in (rpc_pb2.AlarmRequest.ACTIVATE, rpc_pb2.AlarmRequest.DEACTIVATE):
            raise ValueError(f"alarm command with action {action!r}")
        req = rpc_pb2.AlarmRequest(action=action, memberID=member_id, alarm=alarm)  # type: ignore[arg-type]
        return self.alarms.apply(req)

    def _add(self, index: int, member_id: int, peer_urls: list[str],
             is_learner: bool) -> MemberRecord:
        taken = {u for m in self.members.values() for u in m.peer_urls}
        if taken.intersection(peer_urls):
            raise MemberChangeError("url_exists", f"peer URLs {sorted(taken & set(peer_urls))} "
                                    "are already used by a member")
        if member_id in self.removed:
            raise MemberChangeError("removed", f"member {member_id:x} was removed; its id "
                                    "cannot be reused (add the node with other peer URLs)")
        if member_id in self.members:
            raise MemberChangeError("exists", f"member {member_id:x} already exists")
        rec = MemberRecord(member_id, "", tuple(peer_urls), (), bool(is_learner))
        self.members[member_id] = rec
        self.shard_map = [ShardPlacement(p.shard, p.group, tuple(sorted({*p.replicas, member_id})))
                          for p in self.shard_map]
        return rec

    def _remove(self, index: int, member_id: int) -> list[MemberRecord]:
        if self.members.pop(member_id, None) is None:
            raise MemberChangeError("not_found", f"member {member_id:x} not found")
        self.removed[member_id] = index
        self.shard_map = [ShardPlacement(p.shard, p.group,
                                         tuple(r for r in p.replicas if r != member_id))
                          for p in self.shard_map]
        return list(self.members.values())

    def _update(self, index: int, member_id: int, peer_urls: list[str]) -> MemberRecord:
        rec = self.members.get(member_id)
        if rec is None:
            raise MemberChangeError("not_found", f"member {member_id:x} not found")
        taken = {u for m in self.members.values() if m.id != member_id for u in m.peer_urls}
        if taken.intersection(peer_urls):
            raise MemberChangeError("url_exists", f"peer URLs {sorted(taken & set(peer_urls))} "
                                    "are already used by another member")
        rec.peer_urls = tuple(peer_urls)
        return rec

    def _promote(self, index: int, member_id: int) -> MemberRecord:
        rec = self.members.get(member_id)
        if rec is None:
            raise MemberChangeError("not_found", f"member {member_id:x} not found")
        if not rec.is_learner:
            raise MemberChangeError("not_learner", f"member {member_id:x} is not a learner")
        rec.is_learner = False
        return rec

    _handlers: dict[str, Callable[..., object]] = {
        "publish": _publish, "advertise": _advertise, "alarm": _alarm, "add": _add, "remove": _remove,
        "update": _update,
        "promote": _promote,
    }

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    # --- snapshots -----------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """Every member, msgpack-encoded."""
        return self.prepare_snapshot()()

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """Capture the table now; the function returned encodes it (anywhere)."""
        rows = [[m.id, m.name, list(m.peer_urls), list(m.client_urls), m.is_learner,
                 m.command_format]
                for m in sorted(self.members.values(), key=lambda m: m.id)]
        shards = [[p.shard, p.group, list(p.replicas)] for p in self.shard_map]
        removed = sorted([i, at] for i, at in self.removed.items())
        alarms = self.alarms.dump()
        auth = self.auth.image()
        return lambda: bytes(msgpack.packb({"members": rows, "shards": shards,
                                            "removed": removed, "alarms": alarms,
                                            "auth": auth}))

    def restore(self, data: bytes) -> None:
        """Replace the table and the shard map by a snapshot's."""
        image = msgpack.unpackb(data)
        if not isinstance(image, dict):
            raise ValueError("malformed meta snapshot: expected a map of members and shards")
        self.members = {
            r[0]: MemberRecord(r[0], r[1], tuple(r[2]), tuple(r[3]), bool(r[4]),
                               int(r[5]) if len(r) > 5 else 1)
            for r in image["members"]
        }
        self.shard_map = [ShardPlacement(s, g, tuple(r)) for s, g, r in image["shards"]]
        self.removed = {int(i): int(at) for i, at in image.get("removed", ())}
        self.alarms.load(image.get("alarms", []))
        self.auth.restore(image.get("auth"))
        self._changed()
