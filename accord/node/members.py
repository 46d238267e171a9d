"""Members added and removed at runtime: etcd's member API on a node, and its driver.

The meta group's member table (``services/cluster/members.py``) is the *desired*
membership; Raft configurations follow it. What happens, in order:

* **MemberAdd** (any member) commits the new member to the table. Its id comes from
  the cluster token and its peer URLs (``config.joined_member_id``), so the node,
  started with ``--initial-cluster-state existing``, computes the same id. Every
  group's leader then adds it to its group as a Raft *learner* (compacting a log
  that still starts at index 1 first, so the newcomer starts from a snapshot and
  learns the group's membership from it), and promotes it to voter once its match
  index is within ``CATCH_UP_SLACK`` entries of the leader's last index, unless the
  operator asked for a learner (``--learner``; MemberPromote then flips the table).
* **MemberRemove** refuses when a group would be left without a quorum of reachable
  voters, then commits the removal (the id is kept as removed); each group's leader
  takes the node out of its group, a leader that is itself removed first hands its
  leadership to a caught-up voter. The meta group keeps replicating to the removed
  node until it holds its own removal (bounded wait), so it learns of it. The call returns once this node applied the
  removal in every group (or after ``REMOVE_WAIT`` seconds; the leaders finish).
  The removed node sees its removal, logs it, and stops once it leads no group.
* **MemberUpdate** changes peer URLs in the table; every node re-points its link.
* **Replica repair** (``--member-dead-after N``): the meta group's leader removes a
  voting member its link has been down to for N seconds while SWIM (when it runs)
  does not hold it alive or suspect, through the same path, as
  long as at least ``REPAIR_MIN_VOTERS`` voters remain and a quorum of them is
  reachable. Adding a replacement is the operator's MemberAdd.

Replicas: every member holds a replica of every group, so with four members each
group has four replicas (three voters during a node's catch-up) and after removing
one of four, three.

A leader acts only on facts its replica of the table holds (a member present, an
id removed), never on an id it does not know, so a table replica that lags only
delays a change. Each pass changes at most one node per group (Raft allows one
pending change), and the changes are one voter at a time (no joint consensus).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from accord.node.config import joined_member_id, parse_url
from accord.raft.core.confchange import (
    ConfChange,
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeType,
)
from accord.raft.core.types import Role
from accord.raft.host.multiraft import Group, GroupUnavailable
from accord.services.cluster.members import ClusterStateMachine, MemberRecord

if TYPE_CHECKING:
    from accord.node.parts import NodeParts

log = logging.getLogger("accord.members")

META_GROUP = 1
"""The meta group: the member table and the shard map."""
RECONCILE_INTERVAL = 0.3
"""Seconds between two passes of the driver over the groups this node leads."""
CATCH_UP_SLACK = 64
"""A learner whose match index is this close to the leader's last index is promoted."""
REMOVE_WAIT = 20.0
"""Seconds MemberRemove waits for every group to drop the node before answering."""
REMOVED_GRACE = 15.0
"""Seconds a removed node keeps running at most to hand over its leaderships."""
TELL_REMOVED_WAIT = 10.0
"""Seconds the meta leader waits at most for a removed member to hold its removal."""
REPAIR_MIN_VOTERS = 3
"""Replica repair never shrinks the meta group below this many voters."""
DEBUG_GROUPS_METHOD = "/accord.Debug/Groups"
"""Unary gRPC method (raw bytes): JSON of every group's membership on the answering node."""


class NotEnoughStartedMembers(Exception):
    """Removing the member would leave a group without a quorum of reachable voters."""


def _single(kind: ConfChangeType, node: int) -> ConfChange:
    return ConfChange((ConfChangeSingle(kind, node),))


class MemberChanges:
    """The node's member operations and the driver that applies them to the groups."""

    def __init__(self, node: NodeParts) -> None:
        self.node = node
        self._peers: dict[int, tuple[str, int]] = {}
        """Peers this node's transport knows (set by ``Node.start`` and the sync)."""
        self._removed_since: float | None = None
        self.stopped_reason = ""
        self.dead_after = float(node.config.member_dead_after)
        self._down_since: dict[int, float] = {}
        self._telling: dict[int, float] = {}
        self._telling_held: dict[int, float] = {}
        self.others_gone: Callable[[int], Awaitable[None]] | None = None
        """On worker 0 of a node of several: wait until the other workers' groups no
        longer list a removed member (``WorkerRouter.members_gone``)."""

    @property
    def cluster(self) -> ClusterStateMachine:
        """The meta group's member table on this node."""
        return self.node.cluster

    # --- the etcd API --------------------------------------------------------------------
    async def add(self, peer_urls: Sequence[str], is_learner: bool) -> MemberRecord:
        """MemberAdd: commit the member; the group leaders add it (see module docstring)."""
        member_id = joined_member_id(peer_urls, self.node.config.cluster_token)
        rec = await self.node.host.propose(
            META_GROUP, ClusterStateMachine.encode_add(member_id, list(peer_urls), is_learner))
        assert isinstance(rec, MemberRecord)
        log.info("member %x added (peer URLs %s, learner=%s)", member_id, ",".join(peer_urls),
                 is_learner)
        return rec

    async def remove(self, member_id: int) -> None:
        """MemberRemove: check quorum safety, commit the removal, wait for the groups."""
        self.check_remove_is_safe(member_id)
        await self.node.host.propose(META_GROUP, ClusterStateMachine.encode_remove(member_id))
        log.info("member %x removed from the member table; groups follow", member_id)
        if member_id == self.node.member_id:
            return  # this node stops once its leaderships moved; nothing to wait for here
        waits: list[Awaitable[object]] = [self.wait_gone(member_id)]
        if self.others_gone is not None:  # a node of several workers: theirs too
            waits.append(self.others_gone(member_id))
        await asyncio.gather(*waits)

    async def wait_gone(self, member_id: int) -> bool:
        """Wait (at most ``REMOVE_WAIT`` seconds) until no group of this process lists
        ``member_id``; whether none does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REMOVE_WAIT
        while loop.time() < deadline:
            if not any(member_id in _replicas(g) for g in self.node.host.groups.values()):
                return True
            await asyncio.sleep(0.05)
        log.warning("member %x: some groups still list it after %.0fs; their leaders keep "
                    "removing it", member_id, REMOVE_WAIT)
        return False

    def check_remove_is_safe(self, member_id: int) -> None:
        """Raise ``NotEnoughStartedMembers`` if a group would lose its quorum."""
        me = self.node.member_id
        for gid, g in self.node.host.groups.items():
            cs = g.core.conf_state
            if member_id not in cs.voters:
                continue
            rest = [v for v in cs.voters if v != member_id]
            up = sum(1 for v in rest if v == me or self.node.transport.connected(v))
            if not rest or up < len(rest) // 2 + 1:
                raise NotEnoughStartedMembers(
                    f"group {gid}: removing {member_id:x} leaves {len(rest)} voters of which "
                    f"{up} are reachable, fewer than a quorum")

    async def update(self, member_id: int, peer_urls: Sequence[str]) -> MemberRecord:
        """MemberUpdate: new peer URLs in the table (every node re-points its link)."""
        rec = await self.node.host.propose(
            META_GROUP, ClusterStateMachine.encode_update(member_id, list(peer_urls)))
        assert isinstance(rec, MemberRecord)
        return rec

    async def promote(self, member_id: int) -> MemberRecord:
        """MemberPromote: a learner member becomes a voter once it has caught up."""
        rec = await self.node.host.propose(META_GROUP, ClusterStateMachine.encode_promote(member_id))
        assert isinstance(rec, MemberRecord)
        return rec

    # --- the driver ----------------------------------------------------------------------
    def note_peer(self, node_id: int, addr: tuple[str, int]) -> None:
        """Point the transport at ``node_id`` (idempotent)."""
        if node_id == self.node.member_id:
            return
        self._peers[node_id] = addr
        self.node.transport.set_peer(node_id, *addr)

    async def run(self, *, repair: bool = True) -> None:
        """Reconcile the groups this node leads with the table, forever (``repair``:
        also the replica repair, which only the process with the meta group decides)."""
        while True:
            await asyncio.sleep(RECONCILE_INTERVAL)
            try:
                self.sync_peers()
                if self._check_self():
                    return
                leading = [g for g in self.node.host.groups.values()
                           if g.core.role == Role.LEADER]
                if leading and self.cluster.members:
                    await asyncio.gather(*(self._reconcile(g) for g in leading))
                if repair and self.dead_after > 0:
                    await self.repair()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: keep the node serving, try again next pass
                log.exception("member changes: reconcile pass failed")

    def dead_members(self, now: float) -> list[int]:
        """Voters of the meta group this node (its leader) has not reached for
        ``dead_after`` seconds, oldest failure first; [] on a follower."""
        g = self.node.host.group(META_GROUP)
        if g.core.role != Role.LEADER:
            self._down_since.clear()
            return []
        voters = g.core.conf_state.voters
        for v in list(self._down_since):
            if v not in voters:
                del self._down_since[v]
        for v in voters:
            if (v == self.node.member_id or self.node.transport.connected(v)
                    or self._swim_sees_alive(v)):
                self._down_since.pop(v, None)
            else:
                self._down_since.setdefault(v, now)
        return sorted((v for v, t in self._down_since.items()
                       if now - t >= self.dead_after and v in self.cluster.members),
                      key=lambda v: self._down_since[v])

    def _swim_sees_alive(self, member_id: int) -> bool:
        """Whether SWIM (when this node runs it) holds ``member_id`` alive or suspect:
        then a down Raft link is this link's trouble, not the member's death, and the
        member is not repaired away."""
        ms = getattr(self.node, "membership", None)
        if ms is None or not ms.running:
            return False
        wanted = f"{member_id:x}"
        return any(m.meta.get("id") == wanted and m.is_live for m in ms.view.values())

    async def repair(self) -> None:
        """Remove one member dead for longer than ``dead_after`` (see module docstring)."""
        now = asyncio.get_running_loop().time()
        dead = self.dead_members(now)
        if not dead:
            return
        victim = dead[0]
        voters = self.node.host.group(META_GROUP).core.conf_state.voters
        if len(voters) - 1 < REPAIR_MIN_VOTERS:
            log.debug("member %x is unreachable but removing it would leave %d voters",
                      victim, len(voters) - 1)
            return
        try:
            self.check_remove_is_safe(victim)
            # Only the table change: this loop is what then takes it out of the groups.
            await self.node.host.propose(META_GROUP,
                                         ClusterStateMachine.encode_remove(victim), timeout=5.0)
        except (NotEnoughStartedMembers, GroupUnavailable, ValueError) as e:
            log.info("replica repair of member %x deferred: %s", victim, e)
            return
        log.warning("replica repair: member %x unreachable for %.0fs, removed from the cluster",
                    victim, now - self._down_since.pop(victim, now))

    def sync_peers(self) -> None:
        """Links to every member of the table; drop ids no group and no member uses."""
        members = self.cluster.members
        if not members:
            return  # a joining node that has not received the table yet
        me = self.node.member_id
        for m in members.values():
            if m.id != me and m.peer_urls:
                try:
                    addr = parse_url(m.peer_urls[0], "peer URL")
                except ValueError:
                    continue
                if self._peers.get(m.id) != addr:
                    self.note_peer(m.id, addr)
        in_groups: set[int] = set()
        for g in self.node.host.groups.values():
            in_groups |= _replicas(g)
        for nid in list(self._peers):
            if nid not in members and nid not in in_groups:
                del self._peers[nid]
                self.node.transport.remove_peer(nid)
                self.node.host.forget_peer(nid)

    def _check_self(self) -> bool:
        """Stop the node once removed (after its leaderships moved), or when the
        cluster's shard count is not the one this node was started with."""
        shard_map = self.cluster.shard_map
        if shard_map and len(shard_map) != self.node.shards:
            self.stopped_reason = (
                f"the cluster has {len(shard_map)} shards but this node was started with "
                f"--shards {self.node.shards}; remove its data directory and start it again "
                f"with --shards {len(shard_map)}")
            log.critical("stopping: %s", self.stopped_reason)
            self.node.removed.set()
            return True
        if self.node.member_id not in self.cluster.removed:
            return False
        loop = asyncio.get_running_loop()
        if self._removed_since is None:
            self._removed_since = loop.time()
            log.warning("this member (%x) was removed from the cluster; it stops serving once "
                        "its leaderships moved to other members", self.node.member_id)
        leads = [gid for gid, g in self.node.host.groups.items() if g.core.role == Role.LEADER]
        for gid in leads:
            self._hand_over(self.node.host.groups[gid])
        if not leads or loop.time() - self._removed_since > REMOVED_GRACE:
            self.stopped_reason = "this member was removed from the cluster"
            log.warning("member %x stops serving: it was removed from the cluster",
                        self.node.member_id)
            self.node.removed.set()
            return True
        return False

    def _told_of_removal(self, g: Group, nid: int) -> bool:
        """Whether the meta group may drop ``nid``: once it holds its own removal (so it
        applies it and stops), or cannot be told (unreachable), or after
        ``TELL_REMOVED_WAIT`` seconds."""
        now = asyncio.get_running_loop().time()
        first = self._telling.setdefault(nid, now)
        pr = g.core.progress.get(nid)
        if pr is None or not self.node.transport.connected(nid) or now - first > TELL_REMOVED_WAIT:
            return True
        if pr.match < self.cluster.removed[nid]:
            return False
        # It holds the entry; heartbeats carry the commit index to it within a few ticks.
        held = self._telling_held.setdefault(nid, now)
        return now - held >= 5 * self.node.config.tick_interval

    def _hand_over(self, g: Group) -> None:
        core = g.core
        best, best_match = 0, -1
        for v in core.conf_state.voters:
            pr = core.progress.get(v)
            if v != self.node.member_id and pr is not None and pr.match > best_match:
                best, best_match = v, pr.match
        if best and core.lead_transferee == 0:
            log.info("group %d: handing leadership to %x before leaving", g.id, best, extra={"group": g.id})
            self.node.host.transfer_leader(g.id, best)

    async def _reconcile(self, g: Group) -> None:
        """One change (at most) toward the table in group ``g`` led by this node."""
        core = g.core
        cs = core.conf_state
        if cs.voters_outgoing:
            return  # joint: the leader leaves it by itself
        table = self.cluster.members
        present = _replicas(g)
        me = self.node.member_id
        cc: ConfChange | None = None
        for nid in sorted(present & self.cluster.removed.keys()):
            if nid == me:
                self._hand_over(g)
                return
            if g.id == META_GROUP and not self._told_of_removal(g, nid):
                return
            cc = _single(ConfChangeType.REMOVE_NODE, nid)
            break
        if cc is None:
            for nid in sorted(set(table) - present - {me}):
                if core.log.snapshot_index == 0:
                    try:
                        await self.node.host.compact_now(g.id)
                    except GroupUnavailable:
                        log.info("group %d: compaction before adding %x deferred", g.id, nid,
                                 extra={"group": g.id})
                        return
                cc = _single(ConfChangeType.ADD_LEARNER, nid)
                break
        if cc is None:
            last = core.last_index
            for nid in sorted(cs.learners):
                rec = table.get(nid)
                pr = core.progress.get(nid)
                if rec is None or rec.is_learner or pr is None:
                    continue
                if pr.recent_active and pr.match > 0 and pr.match + CATCH_UP_SLACK >= last:
                    cc = _single(ConfChangeType.ADD_VOTER, nid)
                    break
        if cc is None:
            return
        try:
            after = await self.node.host.propose_conf_change(g.id, cc, timeout=5.0)
            log.info("group %d: %s %x -> voters %s learners %s", g.id,
                     cc.changes[0].type.name, cc.changes[0].node_id,
                     [f"{v:x}" for v in after.voters], [f"{v:x}" for v in after.learners],
                     extra={"group": g.id})
        except (GroupUnavailable, ConfChangeError) as e:
            log.info("group %d: %s %x deferred: %s", g.id, cc.changes[0].type.name,
                     cc.changes[0].node_id, e, extra={"group": g.id})


def _replicas(g: Group) -> set[int]:
    cs = g.core.conf_state
    return {*cs.voters, *cs.learners, *cs.voters_outgoing, *cs.learners_next}


def groups_report(node: NodeParts) -> dict[str, Any]:
    """Every group's membership and leader as this node sees them (the debug method)."""
    groups = {}
    for gid, g in sorted(node.host.groups.items()):
        cs = g.core.conf_state
        groups[str(gid)] = {
            "voters": list(cs.voters), "learners": list(cs.learners),
            "leader": g.core.leader_id, "applied": g.applied,
        }
    return {"member_id": node.member_id, "groups": groups}


def add_debug_service(server: grpc.aio.Server, node: NodeParts,
                      report: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> None:
    """Serve ``DEBUG_GROUPS_METHOD``: request ignored, answer is ``groups_report`` as JSON
    (``report``: what to answer instead, as a node of several workers merges theirs)."""

    async def groups(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return json.dumps(await report() if report is not None else groups_report(node)).encode()

    handler = grpc.unary_unary_rpc_method_handler(groups)
    service, method = DEBUG_GROUPS_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
