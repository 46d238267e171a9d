"""Every node of a 3-node cluster killed at once, repeatedly: no acknowledged write is lost.

Three ``RaftCore``s, each over its own real ``WriteAheadLog`` and ``SnapshotStore``,
are driven by a small in-test pump that interleaves message deliveries, ticks,
proposals and each node's Ready handling in random order (a node's Ready is split
into "send the leader's messages" and "persist, then send the persisted messages,
apply, advance", so a leader's appends can reach followers before its own fsync).
A write is acknowledged when the node it was proposed to applies it. At random
points every node dies at once: cores, state machines and in-flight messages are
dropped and every node restarts from what its WAL and snapshot store recovered.
At the end every acknowledged write must be applied, at its index, everywhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.types import (
    EntryType,
    Message,
    MessageType,
    ProposalDropped,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from accord.raft.storage.snapshot import SnapshotStore
from accord.raft.storage.wal import WriteAheadLog, WriteBatch

GROUP = 1
VOTERS = (1, 2, 3)
SNAPSHOT_EVERY = 25


@dataclass
class Node:
    id: int
    root: Path
    boot: int
    wal: WriteAheadLog = field(init=False)
    snaps: SnapshotStore = field(init=False)
    core: RaftCore = field(init=False)
    sm: dict[int, bytes] = field(default_factory=dict)
    applied: int = 0
    last_snap: int = 0
    pending: Ready | None = None

    def __post_init__(self) -> None:
        self.wal, rec = WriteAheadLog.open(self.root / "wal", segment_bytes=8192, sync=False)
        self.snaps = SnapshotStore(self.root / "snap", sync=False)
        state = rec.get(GROUP)
        if state is None:
            from accord.raft.core.types import PersistentState

            state = PersistentState()
        if state.snapshot is not None:
            info = self.snaps.latest(GROUP)
            assert info is not None and info.meta.index >= state.snapshot.index
            self._restore(b"".join(self.snaps.data_chunks(info)))
            self.applied = self.last_snap = state.snapshot.index
        self.core = RaftCore(
            Config(id=self.id, seed=self.boot * 31 + self.id), state, voters=VOTERS
        )

    def _restore(self, data: bytes) -> None:
        self.sm = {int(i): bytes(d) for i, d in msgpack.unpackb(data)}

    def _dump(self) -> bytes:
        out: bytes = msgpack.packb(sorted(self.sm.items()))
        return out


class Cluster:
    def __init__(self, base: Path, rng: random.Random) -> None:
        self.base = base
        self.rng = rng
        self.boot = 0
        self.nodes: dict[int, Node] = {}
        self.net: list[Message] = []
        self.acked: dict[int, bytes] = {}
        self.proposed: dict[int, tuple[int, bytes]] = {}
        self.counter = 0
        self.start()

    def start(self) -> None:
        self.boot += 1
        self.nodes = {i: Node(i, self.base / f"n{i}", self.boot) for i in VOTERS}
        self.net = []
        self.proposed = {}

    def kill_all(self) -> None:
        """Every node dies at once: whatever was not yet appended is gone."""
        for n in self.nodes.values():
            n.wal.close()
        self.start()

    # -- node duties

    def send(self, frm: Node, msgs: list[Message]) -> None:
        for m in msgs:
            if m.type == MessageType.SNAP and m.snapshot is not None:
                info = frm.snaps.latest(GROUP)
                if info is None or info.meta.index != m.snapshot.meta.index:
                    frm.core.report_snapshot(m.to, False)
                    continue
                m.snapshot = Snapshot(m.snapshot.meta, b"".join(frm.snaps.data_chunks(info)))
            self.net.append(m)

    def ready_send(self, n: Node) -> None:
        rd = n.core.ready()
        n.pending = rd
        self.send(n, rd.messages)

    def ready_persist(self, n: Node) -> None:
        rd = n.pending
        assert rd is not None
        n.pending = None
        batch = WriteBatch()
        if rd.snapshot is not None:
            with n.snaps.writer(GROUP, rd.snapshot.meta) as w:
                w.write(rd.snapshot.data)
                w.finish()
            n._restore(rd.snapshot.data)
            n.applied = n.last_snap = rd.snapshot.meta.index
        if rd.snapshot is not None or rd.entries or rd.hard_state is not None:
            batch.add(
                GROUP,
                hard_state=rd.hard_state,
                entries=rd.entries,
                snapshot=rd.snapshot.meta if rd.snapshot is not None else None,
            )
            n.wal.append_sync(batch)
        self.send(n, rd.persisted_messages)
        for e in rd.committed_entries:
            assert e.index == n.applied + 1, (n.id, e.index, n.applied)
            n.applied = e.index
            if e.type == EntryType.NORMAL and e.data:
                n.sm[e.index] = e.data
                if self.proposed.get(e.index) == (n.id, e.data):
                    self.acked[e.index] = e.data
        n.core.advance(rd)
        if n.applied - n.last_snap >= SNAPSHOT_EVERY:
            term = n.core.log.term(n.applied)
            assert term is not None
            meta = SnapshotMeta(n.applied, term, n.core.conf_state)
            with n.snaps.writer(GROUP, meta) as w:
                w.write(n._dump())
                w.finish()
            n.core.compact(meta)
            n.wal.append_sync(WriteBatch().compact(GROUP, meta))
            n.last_snap = n.applied

    # -- the pump

    def event(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.45 and self.net:
            m = self.net.pop(rng.randrange(len(self.net)))
            if rng.random() < 0.03:
                return  # lost
            self.nodes[m.to].core.step(m)
        elif r < 0.75:
            n = self.nodes[rng.choice(VOTERS)]
            if n.pending is not None:
                self.ready_persist(n)
            elif n.core.has_ready():
                self.ready_send(n)
        elif r < 0.9:
            self.nodes[rng.choice(VOTERS)].core.tick()
        else:
            leaders = [n for n in self.nodes.values() if n.core.role == Role.LEADER]
            if leaders:
                n = rng.choice(leaders)
                self.counter += 1
                data = b"w%d" % self.counter
                try:
                    idx = n.core.propose(data)
                except ProposalDropped:
                    return
                self.proposed[idx] = (n.id, data)

    def settle(self, max_events: int) -> None:
        """Run without crashes or loss until every node applied every acknowledged write."""
        target = max(self.acked, default=0)
        for _ in range(max_events):
            if all(n.applied >= target for n in self.nodes.values()) and target:
                return
            if self.net:
                m = self.net.pop(0)
                self.nodes[m.to].core.step(m)
            for n in self.nodes.values():
                if n.pending is not None:
                    self.ready_persist(n)
                elif n.core.has_ready():
                    self.ready_send(n)
            for n in self.nodes.values():
                n.core.tick()
        raise AssertionError(f"cluster did not converge: applied {[n.applied for n in self.nodes.values()]}, target {target}")


def test_all_nodes_killed_at_once_lose_no_acknowledged_write(tmp_path: Path) -> None:
    rng = random.Random(4242)
    c = Cluster(tmp_path, rng)
    try:
        for _ in range(8):
            for _ in range(rng.randint(1500, 4000)):
                c.event()
            c.kill_all()
        c.settle(20_000)
        assert len(c.acked) > 50, f"too little progress to mean anything: {len(c.acked)} acked"
        for n in c.nodes.values():
            for idx, data in c.acked.items():
                assert n.sm.get(idx) == data, f"node {n.id} lost acknowledged write {idx}"
    finally:
        for n in c.nodes.values():
            n.wal.close()
