"""A tiny in-test network for RaftCore unit tests: a dict of cores and a message pump.

It persists every Ready in memory (so nodes can be restarted from what they
made durable), applies committed entries to a list per node, attaches the
sender's state to SNAP messages, and can drop links. The full simulator lives
in ``accord/raft/simulation/``; this is only enough to drive the core.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    PersistentState,
    ReadState,
    Role,
    Snapshot,
    SnapshotMeta,
)


@dataclass
class Disk:
    """What one node made durable."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)

    def persistent_state(self) -> PersistentState:
        return PersistentState(self.hard_state, self.snapshot, list(self.entries))


class Net:
    """Cores wired together through an in-memory message queue."""

    def __init__(self, ids: Iterable[int], learners: Iterable[int] = (), **cfg: Any) -> None:
        self.ids = list(ids)
        self.learner_ids = list(learners)
        self.cfg = cfg
        self.disks: dict[int, Disk] = {}
        self.cores: dict[int, RaftCore] = {}
        self.applied: dict[int, list[tuple[int, bytes]]] = {}
        self.read_states: dict[int, list[ReadState]] = {}
        self.queue: deque[Message] = deque()
        self.cut: set[tuple[int, int]] = set()
        self.sent: list[Message] = []
        self.msg_filter: Any = None
        self.snap_data: dict[tuple[int, int], list[Any]] = {}
        for i in self.ids + self.learner_ids:
            self.add_node(i)

    def add_node(self, i: int, voters: Iterable[int] | None = None,
                 learners: Iterable[int] | None = None) -> RaftCore:
        self.disks[i] = Disk()
        self.applied[i] = []
        self.read_states[i] = []
        core = RaftCore(Config(id=i, seed=i, **self.cfg), PersistentState(),
                        list(self.ids if voters is None else voters),
                        list(self.learner_ids if learners is None else learners))
        self.cores[i] = core
        return core

    def restart(self, i: int, **cfg: Any) -> RaftCore:
        """Rebuild node ``i`` from its disk (its volatile state and app state are lost)."""
        disk = self.disks[i]
        kw = {**self.cfg, **cfg}
        core = RaftCore(Config(id=i, seed=i + 100, **kw), disk.persistent_state(),
                        self.ids, self.learner_ids)
        self.cores[i] = core
        self.applied[i] = self._snapshot_state(i) if disk.snapshot else []
        return core

    def _snapshot_state(self, i: int) -> list[tuple[int, bytes]]:
        snap = self.disks[i].snapshot
        assert snap is not None
        return [(int(x[0]), bytes(x[1])) for x in self.snap_data.get((i, snap.index), [])]

    # -- links
    def isolate(self, i: int) -> None:
        for j in self.cores:
            if j != i:
                self.cut.add((i, j))
                self.cut.add((j, i))

    def heal(self) -> None:
        self.cut.clear()

    # -- pumping
    def process(self, i: int) -> bool:
        core = self.cores[i]
        if not core.has_ready():
            return False
        rd = core.ready()
        disk = self.disks[i]
        self.queue.extend(rd.messages)
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            disk.snapshot = meta
            disk.entries = [e for e in disk.entries if e.index > meta.index]
            state = msgpack.unpackb(rd.snapshot.data)
            self.snap_data[(i, meta.index)] = state
            self.applied[i] = [(int(x[0]), bytes(x[1])) for x in state]
        if rd.entries:
            first = rd.entries[0].index
            disk.entries = [e for e in disk.entries if e.index < first] + list(rd.entries)
        if rd.hard_state is not None:
            disk.hard_state = rd.hard_state
        self.queue.extend(rd.persisted_messages)
        for e in rd.committed_entries:
            if e.type == EntryType.NORMAL and e.data:
                self.applied[i].append((e.index, e.data))
        self.read_states[i].extend(rd.read_states)
        core.advance(rd)
        return True

    def deliver(self, m: Message) -> None:
        self.sent.append(m)
        if (m.frm, m.to) in self.cut or m.to not in self.cores:
            return
        if self.msg_filter is not None and not self.msg_filter(m):
            return
        if m.type == MessageType.SNAP and m.snapshot is not None:
            idx = m.snapshot.meta.index
            state = [list(x) for x in self.applied[m.frm] if x[0] <= idx]
            m.snapshot = Snapshot(m.snapshot.meta, msgpack.packb(state))
        self.cores[m.to].step(m)

    def stabilize(self, limit: int = 10000) -> None:
        for _ in range(limit):
            progressed = False
            for i in list(self.cores):
                progressed |= self.process(i)
            while self.queue:
                self.deliver(self.queue.popleft())
                progressed = True
            if not progressed:
                return
        raise AssertionError("network did not stabilize")

    def tick(self, n: int = 1, nodes: Iterable[int] | None = None) -> None:
        targets = list(self.cores if nodes is None else nodes)
        for _ in range(n):
            for i in targets:
                self.cores[i].tick()
            self.stabilize()

    def elect(self, i: int) -> RaftCore:
        self.cores[i].campaign()
        self.stabilize()
        assert self.cores[i].role == Role.LEADER, f"node {i} did not win"
        return self.cores[i]

    def leader(self) -> RaftCore | None:
        leaders = [c for c in self.cores.values() if c.role == Role.LEADER]
        top = max((c.term for c in leaders), default=0)
        best = [c for c in leaders if c.term == top]
        return best[0] if best else None

    def compact(self, i: int) -> None:
        """Node ``i`` snapshots at its applied index and compacts its log."""
        core = self.cores[i]
        idx = core.applied_index
        term = core.log.term(idx)
        assert term is not None
        meta = SnapshotMeta(idx, term, core.conf_state)
        core.compact(meta)
        disk = self.disks[i]
        disk.snapshot = meta
        disk.entries = [e for e in disk.entries if e.index > idx]
        self.snap_data[(i, idx)] = [list(x) for x in self.applied[i] if x[0] <= idx]


def conf(*voters: int, learners: Iterable[int] = ()) -> ConfState:
    return ConfState(voters=tuple(voters), learners=tuple(learners))
