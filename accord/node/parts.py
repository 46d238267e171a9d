"""What a node's collaborators see of it: the parts ``Node`` (``server.py``) assembles.

The KV backend (``backend.py``) and the member-change driver (``members.py``) are built
by the node and hold it; they depend on this protocol, not on ``server.py``, so the
node's modules import each other in one direction only (server -> backend -> members ->
parts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from accord.node.config import Config
from accord.raft.host.multiraft import MultiRaftHost
from accord.raft.transport.links import PeerTransport
from accord.services.cluster.members import ClusterStateMachine, MemberRecord


class MemberChangesLike(Protocol):
    """etcd's member API on a node (``members.MemberChanges`` fits)."""

    async def add(self, peer_urls: Sequence[str], is_learner: bool) -> MemberRecord:
        """Commit a new member."""

    async def remove(self, member_id: int) -> None:
        """Remove a member."""

    async def update(self, member_id: int, peer_urls: Sequence[str]) -> MemberRecord:
        """Change a member's peer URLs."""

    async def promote(self, member_id: int) -> MemberRecord:
        """Make a learner a voter."""


class NodeParts(Protocol):
    """The parts of a started node its collaborators use (read-only views)."""

    @property
    def config(self) -> Config:
        """The resolved configuration."""

    @property
    def data_dir(self) -> Path:
        """The node's data directory."""

    @property
    def member_id(self) -> int:
        """This member's id."""

    @property
    def shards(self) -> int:
        """How many KV shards the cluster has."""

    @property
    def removed(self) -> asyncio.Event:
        """Set when this member must stop (removed, or a shard-count mismatch)."""

    @property
    def transport(self) -> PeerTransport:
        """The links to the other members."""

    @property
    def host(self) -> MultiRaftHost:
        """The Multi-Raft host running every group."""

    @property
    def cluster(self) -> ClusterStateMachine:
        """The meta group's member table."""

    @property
    def members(self) -> MemberChangesLike:
        """The member-change driver."""

    @property
    def restarted(self) -> bool:
        """Whether this process started from a log it had written before (a restart),
        so that its copy of the meta state may lag the meta group's."""

    async def read_meta(self, timeout: float) -> None:
        """Bring this process's meta state up to the meta group's as of the call
        (``Node.read_meta``)."""
