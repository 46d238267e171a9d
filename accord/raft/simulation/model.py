"""The simulated machines: disks, state machines, client requests, results.

Plain data with just enough behaviour to recover a core from its disk and to
apply entries to the register store; the simulation and the checker share it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    PersistentState,
    Role,
    SnapshotMeta,
)


class InvariantViolation(AssertionError):
    """A safety or liveness property of Raft was broken; the message says how to replay."""


@dataclass(slots=True)
class Disk:
    """What a node has made durable; survives crashes."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    entries: list[Entry] = field(default_factory=list)
    conf_state: ConfState | None = None

    def first_index(self) -> int:
        """Index of the first entry after the snapshot."""
        return (self.snapshot.index if self.snapshot else 0) + 1

    def last_index(self) -> int:
        """Index of the last durable entry (or the snapshot's)."""
        return self.first_index() - 1 + len(self.entries)

    def term_at(self, index: int) -> int | None:
        """Term of the durable entry at ``index``; None when compacted away or absent."""
        snap = self.snapshot
        if index == 0:
            return 0
        if snap is not None and index == snap.index:
            return snap.term
        pos = index - self.first_index()
        if 0 <= pos < len(self.entries):
            return self.entries[pos].term
        return None

    def recovered(self) -> PersistentState:
        """The state a restarted core is built from."""
        return PersistentState(self.hard_state, self.snapshot, list(self.entries),
                               self.conf_state)


@dataclass(slots=True)
class StateMachine:
    """A register store: key -> (value, index of the write); snapshots are JSON."""

    kv: dict[str, tuple[int, int]] = field(default_factory=dict)
    applied: int = 0
    applied_term: int = 0

    def encode(self) -> bytes:
        """Serialize (deterministically) for a snapshot."""
        return json.dumps([self.applied, self.applied_term, sorted(self.kv.items())]).encode()

    @staticmethod
    def decode(data: bytes) -> StateMachine:
        """Rebuild from ``encode`` output."""
        applied, term, items = json.loads(data)
        return StateMachine({k: (v[0], v[1]) for k, v in items}, applied, term)


@dataclass(slots=True)
class Write:
    """A client write: acknowledged when the proposing node applies it."""

    wid: str
    key: str
    value: int
    node: int
    index: int
    acked: bool = False


@dataclass(slots=True)
class Read:
    """A client ReadIndex read: must see every write acknowledged before it was issued."""

    ctx: bytes
    key: str
    node: int
    required: int
    issued_tick: int


@dataclass(slots=True)
class SimNode:
    """A simulated machine: disk always, core and state machine only while up."""

    id: int
    disk: Disk = field(default_factory=Disk)
    core: RaftCore | None = None
    sm: StateMachine = field(default_factory=StateMachine)
    incarnation: int = 0
    down_until: int = -1
    torn_crash: bool = False
    reads: dict[bytes, Read] = field(default_factory=dict)
    servable: list[tuple[int, Read]] = field(default_factory=list)
    writes: dict[str, Write] = field(default_factory=dict)
    last_role: Role = Role.FOLLOWER
    last_commit: int = 0
    conf_to_persist: ConfState | None = None
    fast_every: int = 0
    """The clock ticks twice every ``fast_every`` ticks (0: exact clock)."""


def encode_write(wid: str, key: str, value: int) -> bytes:
    """The command a client write proposes."""
    return f"{wid} {key} {value}".encode()


def decode_write(data: bytes) -> tuple[str, str, int]:
    """Inverse of ``encode_write``."""
    wid, key, value = data.decode().split(" ")
    return wid, key, int(value)


@dataclass(slots=True)
class SimResult:
    """Figures of one run (for reports and the demo)."""

    seed: int
    profile: str
    ticks: int
    writes_acked: int
    reads_served: int
    max_term: int
    elections: int
    liveness_ticks: int
    fingerprint: str


CoreFactory = Callable[[Config, PersistentState, Sequence[int], Sequence[int]], RaftCore]


def default_core(config: Config, state: PersistentState, voters: Sequence[int],
                 learners: Sequence[int]) -> RaftCore:
    """Build the real core."""
    return RaftCore(config, state, voters, learners)


def apply_entry(sm: StateMachine, entry: Entry) -> None:
    """Apply one committed entry to a register store."""
    if entry.type == EntryType.NORMAL and entry.data:
        _, key, value = decode_write(entry.data)
        sm.kv[key] = (value, entry.index)
    sm.applied = entry.index
    sm.applied_term = entry.term
