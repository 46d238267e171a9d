"""The etcd API's backend on a node: the KV shards' Raft groups behind the servicers.

Each KV shard is one Raft group of the node's :class:`~accord.raft.host.multiraft.MultiRaftHost`.
Writes are proposed to their shard's group and answered with the result of their apply;
linearizable reads pass a ReadIndex barrier on the groups they read. Identity, Raft facts
for headers and ``Status`` come from shard 0's group (the home of leases); the member
list from the meta group, and member changes go through it (``members.py``). What to do with several shards lives in
:class:`~accord.services.kv.backend.StateMachineBackend`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import crc32c
import grpc
import msgpack

from accord.node.config import url_scheme
from accord.node.members import CATCH_UP_SLACK, META_GROUP, NotEnoughStartedMembers
from accord.proto import rpc_pb2
from accord.raft.core.types import Role
from accord.raft.host.multiraft import GroupUnavailable
from accord.services.auth.statemachine import AUTH_FORMAT
from accord.services.cluster import snapfile
from accord.services.cluster.members import ClusterStateMachine, MemberChangeError, MemberRecord
from accord.services.cluster.servicer import MSG_BAD_URLS
from accord.services.kv import errors, xcommands
from accord.services.kv.backend import (
    ETCD_COMPAT_VERSION,
    HeaderInfo,
    MemberInfo,
    StateMachineBackend,
    StatusInfo,
    now_ms,
)
from accord.services.kv.codec import spreads_to_every_shard
from accord.services.kv.errors import EtcdError
from accord.services.kv.revorder import ORDER_GATE, READ_FENCE_GATE
from accord.services.kv.statemachine import COMPACT_FORMAT, KVStateMachine
from accord.services.kv.xcommands import XDECIDE_GATE, XLEASE_GATE, XTXN_GATE

if TYPE_CHECKING:
    from accord.node.parts import NodeParts

KV_GROUP = 2
"""Shard 0 of the key space."""
KV_SHARD_GROUP_BASE = 100
"""Shard ``i >= 1`` is group ``KV_SHARD_GROUP_BASE + i`` (groups 3..99 are services')."""

COMMAND_FORMAT = max(COMPACT_FORMAT, AUTH_FORMAT, XTXN_GATE, ORDER_GATE, XLEASE_GATE,
                     XDECIDE_GATE, READ_FENCE_GATE)
"""The newest command format this version applies, which each member advertises through
the meta group (``Node._advertise``): every gate is open once every member advertised it."""
FORMATS_WAIT_ELECTIONS = 2
"""Election timeouts a starting member's first KV calls wait for every member's
advertisement (``ReplicatedBackend.settle_formats``)."""
FORMATS_POLL_S = 0.01
"""How often that wait looks at the member table."""
FORMATS_CATCH_UP_S = 7.0
"""Seconds after start a restarted member's first KV calls may spend reading the meta
group before they believe a table that misses an advertisement (the request timeout)."""
FORMATS_RETRY_S = 0.1
"""Pause between two reads of the meta group that failed (no leader yet, no link yet)."""

_UNAVAILABLE = {
    "no leader": errors.NO_LEADER,
    "leader changed": errors.LEADER_CHANGED,
    "request timed out": errors.TIMEOUT,
}

MSG_ID_REMOVED = "etcdserver: ID removed"
MSG_NOT_ENOUGH_STARTED = "etcdserver: re-configuration failed due to not enough started members"
MSG_NOT_LEARNER = "etcdserver: can only promote a learner member"
MSG_LEARNER_NOT_READY = "etcdserver: can only promote a learner member which is in sync with leader"

_MEMBER_ERRORS = {
    "exists": errors.MEMBER_EXIST,
    "url_exists": errors.PEER_URL_EXIST,
    "not_found": errors.MEMBER_NOT_FOUND,
    "removed": EtcdError(grpc.StatusCode.FAILED_PRECONDITION, MSG_ID_REMOVED),
    "not_learner": EtcdError(grpc.StatusCode.FAILED_PRECONDITION, MSG_NOT_LEARNER),
}


def kv_group(shard: int) -> int:
    """The Raft group id of KV shard ``shard``."""
    return KV_GROUP if shard == 0 else KV_SHARD_GROUP_BASE + shard


def _info(m: MemberRecord) -> MemberInfo:
    return MemberInfo(m.id, m.name, m.peer_urls, m.client_urls, m.is_learner)


async def _member_call(call: Any) -> Any:
    """Await a member operation, mapping its failures to etcd's errors."""
    try:
        return await call
    except GroupUnavailable as e:
        raise unavailable(e) from None
    except MemberChangeError as e:
        raise EtcdError(_MEMBER_ERRORS[e.kind].code, _MEMBER_ERRORS[e.kind].message,
                        str(e)) from None
    except NotEnoughStartedMembers as e:
        raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, MSG_NOT_ENOUGH_STARTED,
                        str(e)) from None


def unavailable(e: GroupUnavailable) -> EtcdError:
    """The etcd error a client sees when a group cannot serve."""
    return _UNAVAILABLE.get(e.reason, errors.TIMEOUT)


class ReplicatedBackend(StateMachineBackend):
    """The etcd API's backend on the node's Raft-replicated KV shards."""

    def __init__(self, node: NodeParts, machines: Sequence[KVStateMachine],
                 local: Sequence[int] | None = None, worker: int = 0) -> None:
        super().__init__(machines)
        self.node = node
        self.groups = [kv_group(i) for i in range(len(machines))]
        self.alarms = node.cluster.alarms  # replicated through the meta group
        self.local: frozenset[int] | None = None if local is None else frozenset(local)
        """The shards this process hosts, in a worker of a node of several
        (``docs/workers.md``); None: every shard. The machines of the others stay empty:
        the worker router (``node/workers.py``) sends their calls to their owner, and
        :meth:`commit` and :meth:`read_barrier` refuse them (never an empty answer)."""
        self.worker = worker
        self.remote: Callable[[bytes, int], Awaitable[Any]] | None = None
        """In a worker: how a multi-shard Txn's command (format 3), or a lease's grant or
        revoke, for another worker's shard is committed there
        (``WorkerRouter.remote_commit``); None: refused."""
        self.remote_keepalive: Callable[[int], Awaitable[int]] | None = None
        """In a worker without shard 0 (the leases' home): how a keepalive is committed
        by the worker that has it (``WorkerRouter.keepalive_on_home``)."""
        self.remote_lease_keys: Callable[[Sequence[int], int], Awaitable[list[bytes]]] | None = None
        """In a worker: how another worker's shards list a lease's keys
        (``WorkerRouter.lease_keys_across``)."""
        self.remote_snapshot: Callable[[], Awaitable[tuple[int, bytes]]] | None = None
        """In a worker: how the node's backup is gathered from every worker
        (``WorkerBackups.snapshot``); None: refused."""
        self._home = KV_GROUP if self.local is None else kv_group(min(self.local))
        """The group whose Raft facts fill headers and Status: shard 0's, or a worker's
        first shard's where shard 0 is another worker's."""
        self.formats_settled = False
        self._made = time.monotonic()
        self._catching_up: asyncio.Future[None] | None = None

    @property
    def _group(self) -> Any:
        return self.node.host.group(self._home)

    def _check_local(self, shard: int) -> None:
        if self.local is not None and shard not in self.local:
            raise EtcdError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"etcdserver: shard {shard} is not hosted by worker {self.worker} of this node "
                f"(--workers): this call should have been sent to its owner")

    async def settle_formats(self) -> None:
        """Wait until every member advertised :data:`COMMAND_FORMAT`, for at most
        :data:`FORMATS_WAIT_ELECTIONS` election timeouts after this backend was made
        (a new cluster's members advertise within a meta-group round of its first
        election); then, or once the time is up (a member down, or of an older version:
        the gates stay closed as ``docs/operations.md`` says), never again.

        A restarted member's table may only lag: it holds the advertisements it
        replicated before, but applies them only once the leader tells it their commit
        index (the advertisements are often the meta group's last entries, so nothing
        tells it soon). So a restarted member that misses an advertisement first reads
        the meta group (:meth:`_catch_up_meta`); without it, it refused multi-shard Txns
        as if a member were older and gave shard-local revisions until its replica
        caught up. A new member (or one whose data directory is empty) has nothing to
        catch up and keeps the short bound: one cut off from the others serves after it."""
        if self.node.cluster.min_command_format() < COMMAND_FORMAT:
            if self.node.restarted:
                if self._catching_up is None:
                    self._catching_up = asyncio.ensure_future(self._catch_up_meta())
                await asyncio.shield(self._catching_up)
            wait = FORMATS_WAIT_ELECTIONS * self.node.config.election_timeout / 1000
            while (self.node.cluster.min_command_format() < COMMAND_FORMAT
                   and time.monotonic() < self._made + wait):
                await asyncio.sleep(FORMATS_POLL_S)
        self.formats_settled = True

    async def _catch_up_meta(self) -> None:
        """Read the meta group until a read succeeds (this process's meta state is then
        the group's as of the read) or :data:`FORMATS_CATCH_UP_S` after start have passed
        (no quorum answered: the table is believed as it stands)."""
        deadline = self._made + FORMATS_CATCH_UP_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                await self.node.read_meta(left)
                return
            except (GroupUnavailable, EtcdError, TimeoutError):
                await asyncio.sleep(min(FORMATS_RETRY_S, max(0.0, deadline - time.monotonic())))

    @property
    def compact_commands(self) -> bool:
        """Format-2 commands only once every member advertised it applies them (an older
        member would refuse them and stop applying its log): the cluster-version gate."""
        return self.node.cluster.min_command_format() >= COMPACT_FORMAT

    @property
    def ordered_commands(self) -> bool:
        """Whether every member applies ordered stamps (the gate of ``revorder.py``)."""
        return self.node.cluster.min_command_format() >= ORDER_GATE

    @property
    def fenced_reads(self) -> bool:
        """Whether every member's shard leaders fence reads (the gate of ``revorder.py``;
        every member leads some shard, and the one a read asks may be any of them)."""
        return (self.order is not None
                and self.node.cluster.min_command_format() >= READ_FENCE_GATE)

    @property
    def multi_shard_txns(self) -> bool:
        """Whether every member applies the multi-shard Txn's commands (the gate)."""
        return self.node.cluster.min_command_format() >= XTXN_GATE

    @property
    def multi_shard_leases(self) -> bool:
        """Whether every member applies the lease revoke across shards (the gate)."""
        return self.node.cluster.min_command_format() >= XLEASE_GATE

    @property
    def decided_commits(self) -> bool:
        """Whether every member applies ``PREPARE_DECIDE`` and ``DECIDE``: the record
        shard's prepare and decision in one entry (the gate)."""
        return self.node.cluster.min_command_format() >= XDECIDE_GATE

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        """Replicate ``command`` on ``shard``; the answer is what its apply returned (a
        multi-shard Txn's command for another worker's shard: committed by that worker,
        through :attr:`remote`)."""
        if self.local is not None and shard not in self.local:
            if self.remote is not None and (xcommands.is_cross_shard(command)
                                            or spreads_to_every_shard(command)):
                return await self.remote(command, shard)
            self._check_local(shard)
        try:
            return await self.node.host.propose(self.groups[shard], command)
        except GroupUnavailable as e:
            raise unavailable(e) from None

    async def read_barrier(self, shard: int = 0) -> None:
        """ReadIndex: wait until this member applied all ``shard`` committed before now."""
        if self.local is not None:
            self._check_local(shard)
        try:
            await self.node.host.read_barrier(self.groups[shard])
        except GroupUnavailable as e:
            raise unavailable(e) from None

    async def lease_keepalive(self, lease_id: int) -> int:
        """A renewal, committed on shard 0 (by its worker, in a worker without it)."""
        if self.local is not None and 0 not in self.local and self.remote_keepalive is not None:
            return await self.remote_keepalive(lease_id)
        return await super().lease_keepalive(lease_id)

    async def lease_keys_on(self, shards: Sequence[int], lease_id: int) -> list[bytes]:
        """The keys of ``lease_id`` on ``shards``: this worker's read here, the others'
        asked of their workers."""
        if self.local is None or self.remote_lease_keys is None:
            return await super().lease_keys_on(shards, lease_id)
        mine = [s for s in shards if s in self.local]
        theirs = [s for s in shards if s not in self.local]
        keys = await super().lease_keys_on(mine, lease_id) if mine else []
        if theirs:
            keys.extend(await self.remote_lease_keys(theirs, lease_id))
        return keys

    def leads(self, shard: int) -> bool:
        """Whether this member leads ``shard``'s Raft group now (never one of another
        worker's shards)."""
        if self.local is not None and shard not in self.local:
            return False
        return bool(self.node.host.group(self.groups[shard]).core.role == Role.LEADER)

    def lease_clock(self) -> tuple[int, int]:
        """Wall-clock ms and this member's term in shard 0 (see STORE_API.md)."""
        return now_ms(), int(self._group.core.term)

    def header_info(self) -> HeaderInfo:
        core = self._group.core
        return HeaderInfo(
            cluster_id=self.node.config.cluster_id,
            member_id=self.node.member_id,
            raft_term=core.term,
            leader=core.leader_id,
        )

    # --- cluster -------------------------------------------------------------------------
    async def members(self, linearizable: bool = False) -> list[MemberInfo]:
        if linearizable:
            try:
                await self.node.host.read_barrier(META_GROUP)
            except GroupUnavailable as e:
                raise unavailable(e) from None
        return [_info(m) for m in sorted(self.node.cluster.members.values(),
                                         key=lambda m: (m.name, m.id))]

    async def member_add(
        self, peer_urls: Sequence[str], is_learner: bool
    ) -> tuple[MemberInfo, list[MemberInfo]]:
        """Add a member (see ``members.py``); it starts with ``existing``."""
        self._check_peer_scheme(peer_urls)
        rec = await _member_call(self.node.members.add(peer_urls, is_learner))
        return _info(rec), await self.members()

    def _check_peer_scheme(self, peer_urls: Sequence[str]) -> None:
        """Every member's peer URLs use the scheme of this cluster's (``https://`` when
        the peers talk TLS, ``--listen-peer-urls``), as the flags of a starting member
        must: a member added or moved to another scheme could not reach the others."""
        want = "https" if self.node.config.peer_tls else "http"
        for url in peer_urls:
            got = url_scheme(url)
            if got in ("http", "https") and got != want:
                raise EtcdError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{MSG_BAD_URLS}: {url} is {got}:// but this cluster's peers use "
                    f"{want}:// ({'TLS' if want == 'https' else 'no TLS'}); give the member "
                    f"{want}:// peer URLs")

    async def member_remove(self, member_id: int) -> list[MemberInfo]:
        """Remove a member from the table and from every group."""
        if member_id not in self.node.cluster.members:
            raise errors.MEMBER_NOT_FOUND
        await _member_call(self.node.members.remove(member_id))
        return await self.members()

    async def member_update(self, member_id: int, peer_urls: Sequence[str]) -> list[MemberInfo]:
        """Change a member's peer URLs."""
        if member_id not in self.node.cluster.members:
            raise errors.MEMBER_NOT_FOUND
        self._check_peer_scheme(peer_urls)
        await _member_call(self.node.members.update(member_id, peer_urls))
        return await self.members()

    async def member_promote(self, member_id: int) -> list[MemberInfo]:
        """Make a learner member a voter (etcd: only once it is in sync with the leader)."""
        rec = self.node.cluster.members.get(member_id)
        if rec is None:
            raise errors.MEMBER_NOT_FOUND
        if not rec.is_learner:
            raise _MEMBER_ERRORS["not_learner"]
        if not self._learner_ready(member_id):
            raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, MSG_LEARNER_NOT_READY)
        await _member_call(self.node.members.promote(member_id))
        return await self.members()

    def _learner_ready(self, member_id: int) -> bool:
        """etcd's in-sync check, where this node can see it: in every group this node
        leads, the learner's match index is within ``CATCH_UP_SLACK`` of the log. A node
        leading no group cannot tell and accepts (the group leaders promote a learner
        only once it caught up anyway)."""
        for g in self.node.host.groups.values():
            if g.core.role != Role.LEADER:
                continue
            pr = g.core.progress.get(member_id)
            if pr is None or pr.match == 0 or pr.match + CATCH_UP_SLACK < g.core.last_index:
                return False
        return True

    # --- maintenance ---------------------------------------------------------------------
    async def status(self) -> StatusInfo:
        g = self._group
        size = await self.db_size()
        return StatusInfo(
            version=ETCD_COMPAT_VERSION,
            db_size=size,
            db_size_in_use=size,
            leader=g.core.leader_id,
            raft_index=g.core.commit_index,
            raft_term=g.core.term,
            raft_applied_index=g.applied,
            errors=self.alarms.names(),
            is_learner=self.node.member_id in g.core.conf_state.learners,
        )

    async def db_size(self) -> int:
        """Bytes this member keeps on disk (log segments and snapshots), like etcd's dbSize.

        A stat of the data directory's files, off the loop: clients such as Kubernetes
        poll Status, so it must not serialize the store.
        """
        root = Path(self.node.config.data_dir)  # a node of several workers: all of theirs

        def walk() -> int:
            total = 0
            for p in root.rglob("*"):
                with contextlib.suppress(FileNotFoundError):  # a segment deleted meanwhile
                    if p.is_file():
                        total += p.stat().st_size
            return total

        return await asyncio.to_thread(walk)

    async def _image(self) -> bytes:
        """The store's image for etcd's Hash (``KVStateMachine.prepare_hash``: without
        the lease clock that checkpoints move and, over several shards, the revision
        counter that a floor moves): the one shard's, or every shard's in one msgpack
        list."""
        if self.shards == 1:
            return await asyncio.to_thread(self.sm.prepare_hash())
        captures = [m.prepare_hash() for m in self.machines]

        def serialize() -> bytes:
            packed: bytes = msgpack.packb(
                ["accord-shards", [c() for c in captures]], use_bin_type=True)
            return packed

        return await asyncio.to_thread(serialize)

    async def snapshot(self) -> tuple[int, bytes]:
        """A backup file (``snapfile.py``) of every group this member hosts: the member
        table, the KV shards, the scheduler and any other service's group, each as its
        state machine's snapshot, captured in one go on the loop (no await between two
        groups) and serialized off it.

        One shard: this member's applied state, as etcd's snapshot (it works without a
        quorum). Several shards: their revisions only form one order through floors, so
        the save passes a ReadIndex barrier on each shard, takes R = the highest
        revision, floors every shard at R (no shard writes at or below R afterwards),
        waits out the multi-shard Txns open at or below R (``cut_revision``), captures,
        and cuts what the shards applied after R from their images: the backup holds
        exactly the keys at R, every Txn all or nothing (this needs each shard's quorum)."""
        if self.local is not None:  # a worker: the other workers hold groups too
            if self.remote_snapshot is None:
                raise EtcdError(grpc.StatusCode.UNIMPLEMENTED,
                                "a backup of a node of several workers needs its router")
            return await self.remote_snapshot()
        kv_groups = list(self.groups)
        if self.shards > 1:
            rev = await self.cut_revision()
        else:
            rev = self.revision
        captures = {gid: g.sm.prepare_snapshot() for gid, g in self.node.host.groups.items()}

        def build() -> bytes:
            images = {gid: c() for gid, c in captures.items()}
            for gid in kv_groups:
                images[gid] = KVStateMachine.image_at(images[gid], rev)
            return snapfile.encode(rev, images, kv_groups)

        return rev, await asyncio.to_thread(build)

    async def alarm(self, req: rpc_pb2.AlarmRequest) -> list[tuple[int, int]]:
        """The cluster's alarms, as etcd: GET reads them after a ReadIndex barrier on the
        meta group (every member lists the same); ACTIVATE and DEACTIVATE are meta-group
        commands, answered with what their apply did."""
        try:
            if req.action == rpc_pb2.AlarmRequest.GET:
                await self.node.host.read_barrier(META_GROUP)
                return self.alarms.apply(req)
            if req.action == rpc_pb2.AlarmRequest.ACTIVATE and req.alarm == rpc_pb2.NONE:
                return []
            result = await self.node.host.propose(META_GROUP, ClusterStateMachine.encode_alarm(req))
            return cast("list[tuple[int, int]]", result)
        except GroupUnavailable as e:
            raise unavailable(e) from None

    async def defragment(self) -> None:
        """Nothing to reclaim: compacted history leaves memory when compaction applies."""

    async def hash(self) -> int:
        return int(crc32c.crc32c(await self._image()))

    async def image_crc(self, shards: Sequence[int], crc: int) -> int:
        """The CRC-32C ``crc`` continued over ``shards``' images, each framed as
        :meth:`_image` frames it (a node of several workers chains :meth:`hash` through
        them, shard by shard)."""
        for s in shards:
            self._check_local(s)
            blob = await asyncio.to_thread(self.machines[s].prepare_hash())
            crc = int(crc32c.crc32c(msgpack.packb(blob, use_bin_type=True), crc))
        return crc

    def check_move_leader(self, target_id: int) -> None:
        """etcd's refusals of a MoveLeader: this member does not lead (its home group),
        or the target is itself or no voter."""
        if self._group.core.role != Role.LEADER:
            raise errors.NOT_LEADER
        if target_id not in self._group.core.conf_state.voters or target_id == self.node.member_id:
            raise errors.BAD_LEADER_TRANSFEREE

    def transfer_leaders(self, target_id: int) -> None:
        """Hand every group this process leads, and ``target_id`` votes in, to it."""
        host = self.node.host
        for gid, g in host.groups.items():
            if g.core.role == Role.LEADER and target_id in g.core.conf_state.voters:
                host.transfer_leader(gid, target_id)

    async def move_leader(self, target_id: int) -> None:
        self.check_move_leader(target_id)
        self.transfer_leaders(target_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while loop.time() < deadline:
            if self._group.core.leader_id == target_id:
                return
            await asyncio.sleep(0.02)
        raise errors.TIMEOUT
