"""The members of a cluster as the meta group replicates them.

Every node knows the initial members (names and peer URLs) from
``--initial-cluster``; what it cannot know is where the *other* members serve
clients. As etcd does, each node publishes its own attributes (client URLs)
through consensus once it runs, so ``MemberList`` on any member lists every
member's client URLs.

The meta group also holds the shard map: for each KV shard, its Raft group and the
nodes holding its replicas. It is fixed when the cluster is created (``--shards``;
every member of ``--initial-cluster`` holds a replica of every shard).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgpack


@dataclass(slots=True)
class MemberRecord:
    """One member as the cluster knows it."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    """Where one KV shard lives: its Raft group and the nodes with a replica."""

    shard: int
    group: int
    replicas: tuple[int, ...]


class ClusterStateMachine:
    """Replicated member table and shard map (the meta group's state machine)."""

    def __init__(
        self, initial: dict[int, MemberRecord], shard_map: list[ShardPlacement] | None = None
    ) -> None:
        self.members: dict[int, MemberRecord] = dict(initial)
        self.shard_map: list[ShardPlacement] = list(shard_map or [])

    @staticmethod
    def encode_publish(member_id: int, name: str, client_urls: list[str]) -> bytes:
        """Command: ``member_id`` serves clients at ``client_urls``."""
        return bytes(msgpack.packb(["publish", member_id, name, list(client_urls)]))

    def apply(self, index: int, payload: bytes) -> object:
        """Apply one command; returns the updated member."""
        op, *args = msgpack.unpackb(payload)
        if op != "publish":
            raise ValueError(f"unknown cluster command {op!r}")
        member_id, name, client_urls = args
        rec = self.members.get(member_id)
        if rec is None:
            raise ValueError(f"member {member_id:x} ({name}) is not part of this cluster")
        rec.client_urls = tuple(client_urls)
        return rec

    def snapshot(self) -> bytes:
        """Every member, msgpack-encoded."""
        return self.prepare_snapshot()()

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """Capture the table now; the function returned encodes it (anywhere)."""
        rows = [[m.id, m.name, list(m.peer_urls), list(m.client_urls), m.is_learner]
                for m in sorted(self.members.values(), key=lambda m: m.id)]
        shards = [[p.shard, p.group, list(p.replicas)] for p in self.shard_map]
        return lambda: bytes(msgpack.packb({"members": rows, "shards": shards}))

    def restore(self, data: bytes) -> None:
        """Replace the table and the shard map by a snapshot's."""
        image = msgpack.unpackb(data)
        if not isinstance(image, dict):
            raise ValueError("malformed meta snapshot: expected a map of members and shards")
        self.members = {
            r[0]: MemberRecord(r[0], r[1], tuple(r[2]), tuple(r[3]), bool(r[4]))
            for r in image["members"]
        }
        self.shard_map = [ShardPlacement(s, g, tuple(r)) for s, g, r in image["shards"]]
