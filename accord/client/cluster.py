"""Cluster and maintenance calls: members, each member's status, leader, alarms,
defragment, snapshot to a file, move leader — ``client.cluster``.

Calls about the cluster as a whole (member list, alarms) go to any endpoint with
failover. Calls about one member (its status, defragmenting it, taking a snapshot from
it) go to that member's own client URL, as ``etcdctl endpoint status`` does: the answer
is that member's. :meth:`ClusterApi.move_leader` finds the leader and asks it, as etcd
requires.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from accord.client.errors import ClientError
from accord.client.transport import EndpointPool, normalize
from accord.proto import rpc_pb2, rpc_pb2_grpc

LEADER_AGREEMENT_S = 3.0
"""How long :meth:`ClusterApi.leader` asks again while the members that answer name
different leaders, or none (a leadership move or an election under way)."""
LEADER_RETRY_S = 0.1
"""The pause between two rounds of :meth:`ClusterApi.leader`."""

_rpc: Any = rpc_pb2_grpc


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the cluster (etcd's ``Member``)."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool

    @property
    def endpoint(self) -> str | None:
        """``host:port`` of its first client URL (None until it has published one)."""
        return normalize(self.client_urls[0]) if self.client_urls else None

    @property
    def url(self) -> str | None:
        """Its first client URL as published (the scheme says whether it serves TLS)."""
        return self.client_urls[0] if self.client_urls else None

    @classmethod
    def from_pb(cls, m: rpc_pb2.Member) -> Member:
        """From the wire message."""
        return cls(int(m.ID), m.name, tuple(m.peerURLs), tuple(m.clientURLs), bool(m.isLearner))


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member's own view: version, sizes, the leader it knows, its Raft indexes."""

    endpoint: str
    member_id: int
    version: str
    db_size: int
    db_size_in_use: int
    leader: int
    raft_term: int
    raft_index: int
    raft_applied_index: int
    errors: tuple[str, ...]
    is_learner: bool

    @property
    def is_leader(self) -> bool:
        """Whether this member leads (as it sees it)."""
        return self.leader != 0 and self.leader == self.member_id

    @classmethod
    def from_pb(cls, endpoint: str, s: rpc_pb2.StatusResponse) -> MemberStatus:
        """From the wire message."""
        return cls(endpoint, int(s.header.member_id), s.version, int(s.dbSize),
                   int(s.dbSizeInUse), int(s.leader), int(s.raftTerm), int(s.raftIndex),
                   int(s.raftAppliedIndex), tuple(s.errors), bool(s.isLearner))


@dataclass(frozen=True, slots=True)
class StatusReport:
    """A member and its status, or why its status could not be read."""

    member: Member
    status: MemberStatus | None
    error: ClientError | None


class AlarmType(enum.Enum):
    """etcd's alarms."""

    NONE = rpc_pb2.NONE
    NOSPACE = rpc_pb2.NOSPACE
    CORRUPT = rpc_pb2.CORRUPT


@dataclass(frozen=True, slots=True)
class Alarm:
    """An alarm raised on a member."""

    member_id: int
    alarm: AlarmType


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot written to a file."""

    path: Path
    size: int
    revision: int
    endpoint: str


DEBUG_GROUPS_METHOD = "/accord.Debug/Groups"
"""An accord node's raw-bytes method answering every Raft group's membership as JSON
(``accord.node.members.groups_report``); etcd has no such method."""


@dataclass(frozen=True, slots=True)
class RaftGroup:
    """One Raft group (meta, a KV shard, the scheduler) as one member sees it."""

    id: int
    leader: int
    """Member id of its leader (0: none known)."""
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    applied: int

    @property
    def name(self) -> str:
        """What the group holds (accord's group numbering: 1 meta, 2 and 101.. KV
        shards, 3 the scheduler)."""
        if self.id == 1:
            return "meta"
        if self.id == 2:
            return "kv shard 0"
        if self.id == 3:
            return "scheduler"
        if self.id > 100:
            return f"kv shard {self.id - 100}"
        return f"group {self.id}"


@dataclass(frozen=True, slots=True)
class GroupsReport:
    """Every Raft group of a node, and which member answered."""

    member_id: int
    groups: tuple[RaftGroup, ...]


class ClusterApi:
    """``client.cluster``: the Cluster and Maintenance services."""

    def __init__(self, pool: EndpointPool) -> None:
        self._pool = pool

    async def members(self, *, timeout: float | None = None) -> list[Member]:
        """Every member of the cluster."""
        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.MemberListResponse:
            r: rpc_pb2.MemberListResponse = await _rpc.ClusterStub(ch).MemberList(
                rpc_pb2.MemberListRequest(linearizable=True), timeout=t)
            return r
        resp = await self._pool.call(call, idempotent=True, timeout=timeout)
        return [Member.from_pb(m) for m in resp.members]

    async def status(self, endpoint: str | None = None, *,
                     timeout: float | None = None) -> MemberStatus:
        """The status of the member at ``endpoint`` (``host:port`` or a client URL;
        default: the current endpoint)."""
        ep = endpoint or self._pool.current

        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.StatusResponse:
            r: rpc_pb2.StatusResponse = await _rpc.MaintenanceStub(ch).Status(
                rpc_pb2.StatusRequest(), timeout=t)
            return r
        resp = await self._pool.call_at(ep, call, timeout=timeout)
        return MemberStatus.from_pb(normalize(ep, self._pool.tls), resp)

    async def statuses(self, *, timeout: float | None = None) -> list[StatusReport]:
        """Every member with its own status (or the error reading it)."""
        out: list[StatusReport] = []
        for m in await self.members(timeout=timeout):
            if m.url is None:
                out.append(StatusReport(m, None, ClientError(
                    grpc.StatusCode.UNAVAILABLE, f"member {m.name or hex(m.id)} has not "
                    "published a client URL yet", hint="it may still be starting")))
                continue
            try:
                out.append(StatusReport(m, await self.status(m.url, timeout=timeout), None))
            except ClientError as e:
                out.append(StatusReport(m, None, e))
        return out

    async def leader(self, *, timeout: float | None = None) -> Member:
        """The member that leads, as the members that answer agree. Their statuses are
        read one after the other, so a leadership move (the leader balancer makes them
        routinely) can fall between two reads: while the members that answer disagree,
        or know no leader, they are asked again for up to :data:`LEADER_AGREEMENT_S`.
        Raises UNAVAILABLE when they still disagree then, or when none answers."""
        deadline = time.monotonic() + LEADER_AGREEMENT_S
        while True:
            reports = await self.statuses(timeout=timeout)
            leaders = {r.status.leader for r in reports
                       if r.status is not None and r.status.leader}
            for r in reports:
                if r.member.id in leaders and len(leaders) == 1:
                    return r.member
            if (time.monotonic() >= deadline
                    or all(r.status is None for r in reports)):
                break
            await asyncio.sleep(LEADER_RETRY_S)
        raise ClientError(
            grpc.StatusCode.UNAVAILABLE,
            "no leader agreed by the members that answered "
            f"({sorted(hex(x) for x in leaders) or 'none known'})",
            hint="an election may be under way: try again in an election timeout")

    async def alarms(self, *, timeout: float | None = None) -> list[Alarm]:
        """The alarms raised in the cluster."""
        return await self._alarm(rpc_pb2.AlarmRequest.GET, 0, AlarmType.NONE, timeout)

    async def disarm(self, alarm: Alarm, *, timeout: float | None = None) -> list[Alarm]:
        """Clear ``alarm``; the alarms it cleared."""
        return await self._alarm(rpc_pb2.AlarmRequest.DEACTIVATE, alarm.member_id, alarm.alarm,
                                 timeout)

    async def _alarm(self, action: int, member: int,
                     alarm: AlarmType, timeout: float | None) -> list[Alarm]:
        req = rpc_pb2.AlarmRequest(action=action, memberID=member,  # type: ignore[arg-type]
                                   alarm=alarm.value)

        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.AlarmResponse:
            r: rpc_pb2.AlarmResponse = await _rpc.MaintenanceStub(ch).Alarm(req, timeout=t)
            return r
        # GET and DEACTIVATE leave the same state when repeated
        resp = await self._pool.call(call, idempotent=True, timeout=timeout)
        return [Alarm(int(a.memberID), AlarmType(a.alarm)) for a in resp.alarms]

    async def defragment(self, endpoint: str | None = None, *,
                         timeout: float | None = None) -> None:
        """Reclaim space on the member at ``endpoint`` (default: the current one)."""
        ep = endpoint or self._pool.current

        async def call(ch: grpc.aio.Channel, t: float) -> None:
            await _rpc.MaintenanceStub(ch).Defragment(rpc_pb2.DefragmentRequest(), timeout=t)
        await self._pool.call_at(ep, call, timeout=timeout)

    async def snapshot(self, path: str | os.PathLike[str], *, endpoint: str | None = None,
                       progress: Callable[[int, int], None] | None = None,
                       check: Callable[[Path], object] | None = None,
                       timeout: float | None = 300.0) -> SnapshotInfo:
        """Stream a snapshot of the member at ``endpoint`` into ``path``.

        Without ``endpoint`` the snapshot comes from the current endpoint, or the next
        that answers (a snapshot is a read: taking it again elsewhere is safe).
        ``progress(received, total)`` is called after every chunk. The file is written
        next to ``path`` (``path + ".part"``), fsynced, given to ``check(part)`` if one
        is passed (in a worker thread: say, decoding it to prove it whole), and only
        then renamed into place, so ``path`` never holds a partial or unchecked
        snapshot; whatever ``check`` raises is raised here, with the part removed."""
        dest = Path(path)
        part = dest.with_name(dest.name + ".part")
        source = ""

        async def call(ch: grpc.aio.Channel, t: float) -> tuple[int, int]:
            nonlocal source
            source = self._pool.current if endpoint is None else normalize(endpoint,
                                                                           self._pool.tls)
            received, revision = 0, 0
            stream = _rpc.MaintenanceStub(ch).Snapshot(rpc_pb2.SnapshotRequest(), timeout=t)
            with part.open("wb") as f:
                async for resp in stream:
                    f.write(resp.blob)
                    received += len(resp.blob)
                    revision = max(revision, int(resp.header.revision))
                    if progress is not None:
                        progress(received, received + int(resp.remaining_bytes))
                f.flush()
                os.fsync(f.fileno())
            return received, revision

        try:
            if endpoint is None:
                size, revision = await self._pool.call(call, idempotent=True, timeout=timeout)
            else:
                size, revision = await self._pool.call_at(endpoint, call, timeout=timeout)
            if check is not None:
                await asyncio.to_thread(check, part)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        part.replace(dest)
        return SnapshotInfo(dest, size, revision, source)

    async def move_leader(self, target_id: int, *, timeout: float | None = None) -> None:
        """Hand leadership to the member ``target_id`` (asked of the current leader)."""
        leader = await self.leader(timeout=timeout)
        assert leader.url is not None

        async def call(ch: grpc.aio.Channel, t: float) -> None:
            await _rpc.MaintenanceStub(ch).MoveLeader(
                rpc_pb2.MoveLeaderRequest(targetID=target_id), timeout=t)
        await self._pool.call_at(leader.url, call, timeout=timeout)

    async def groups(self, *, timeout: float | None = None) -> GroupsReport:
        """Every Raft group as the answering member sees it (accord only)."""
        async def call(ch: grpc.aio.Channel, t: float) -> bytes:
            raw: bytes = await ch.unary_unary(DEBUG_GROUPS_METHOD)(b"", timeout=t)
            return raw
        report = json.loads(await self._pool.call(call, idempotent=True, timeout=timeout))
        groups = tuple(
            RaftGroup(int(gid), int(g["leader"]), tuple(g["voters"]), tuple(g["learners"]),
                      int(g["applied"]))
            for gid, g in sorted(report["groups"].items(), key=lambda kv: int(kv[0])))
        return GroupsReport(int(report["member_id"]), groups)

    async def discover(self, *, timeout: float | None = None) -> list[str]:
        """Add every member's client endpoint to the client; the endpoints that were new."""
        urls = [m.url for m in await self.members(timeout=timeout) if m.url]
        return self._pool.add_endpoints(urls)
