"""The vocabulary of the Raft core: entries, hard state, messages, snapshots, Ready.

These types are the contract between the pure core (``raft.py``) and everything
around it: the shared write-ahead log persists ``HardState`` and ``Entry``;
the transport carries ``Message``; the host drives ``Ready``/``advance``.
They are plain data with no behaviour, so that every layer (and the
deterministic simulator) can build and compare them freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

NO_NODE = 0
"""Node id meaning "nobody" (no vote, no leader). Real node ids are > 0."""


class EntryType(IntEnum):
    """What an entry's ``data`` holds."""

    NORMAL = 0
    """An application command (possibly empty: the leader's no-op of its term)."""
    CONF_CHANGE = 1
    """A msgpack-encoded ``ConfChange`` (see ``confchange.py``)."""


@dataclass(slots=True, frozen=True)
class Entry:
    """One log entry."""

    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""


@dataclass(slots=True, frozen=True)
class HardState:
    """State that must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: int = NO_NODE
    commit: int = 0


@dataclass(slots=True, frozen=True)
class ConfState:
    """The membership of a group, possibly in a joint configuration.

    ``voters_outgoing`` is non-empty exactly while the group is in joint consensus
    (C_old,new): decisions then need a majority of ``voters`` *and* of
    ``voters_outgoing``. ``learners_next`` are voters of the outgoing config that
    become learners when the joint config is left.
    """

    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    voters_outgoing: tuple[int, ...] = ()
    learners_next: tuple[int, ...] = ()
    auto_leave: bool = False


@dataclass(slots=True, frozen=True)
class SnapshotMeta:
    """Where a snapshot sits in the log, and the membership at that point."""

    index: int = 0
    term: int = 0
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(slots=True, frozen=True)
class Snapshot:
    """A state-machine snapshot. ``data`` may be empty when only the metadata travels
    (the core never holds snapshot data; the host attaches it when it ships one)."""

    meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    data: bytes = b""


class MessageType(IntEnum):
    """Every message exchanged between cores (numbers are part of the wire format)."""

    APP = 1
    APP_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    PRE_VOTE = 5
    PRE_VOTE_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAP = 9
    TIMEOUT_NOW = 10
    READ_INDEX = 11
    READ_INDEX_RESP = 12
    PROPOSE = 13
    """A follower forwarding a proposal to the leader (optional; off by default)."""
    TRANSFER_LEADER = 14
    """A follower asking the leader to transfer leadership."""


@dataclass(slots=True)
class Message:
    """A message between two cores of the same group.

    Field use follows etcd raft's ``raftpb.Message``: ``index``/``log_term`` name
    the entry preceding ``entries`` (APP) or the candidate's last entry (VOTE);
    ``reject_hint``/``hint_term`` drive fast conflict backtracking; ``context``
    carries ReadIndex request ids, campaign kinds, and marks an APP that only carries
    the commit index (``raft.COMMIT_ONLY``, left unanswered).
    """

    type: MessageType
    to: int
    frm: int
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: list[Entry] = field(default_factory=list)
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    hint_term: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


class Role(IntEnum):
    """A core's role."""

    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


@dataclass(slots=True, frozen=True)
class SoftState:
    """Volatile state worth reporting (leader changes), never persisted."""

    leader: int = NO_NODE
    role: Role = Role.FOLLOWER


@dataclass(slots=True, frozen=True)
class ReadState:
    """A ReadIndex answer: once ``applied >= index``, a read for ``request_ctx`` is linearizable."""

    index: int
    request_ctx: bytes


@dataclass(slots=True)
class Ready:
    """Everything the core asks of the outside world since the last ``advance``.

    Order of duty for the caller:
      1. send ``messages`` right away (they do not depend on unpersisted state: the
         leader's appends and heartbeats, Raft thesis §10.2.1);
      2. make ``snapshot`` (if any), ``entries`` and ``hard_state`` (if any) durable,
         in one batch (a ``hard_state`` whose term and vote are those already durable
         may be skipped: its commit index is volatile state, and a restarted core
         starts from ``max(commit, snapshot index)`` and learns the rest again);
      3. then send ``persisted_messages`` (votes, append acks, ...: they promise
         what step 2 made durable);
      4. apply ``committed_entries`` in order (may run later, asynchronously);
      5. call ``advance(ready)``.
    """

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed_entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    persisted_messages: list[Message] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)


@dataclass(slots=True)
class PersistentState:
    """What a core restarts from: everything the storage made durable."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)
    """Entries after the snapshot, contiguous from ``snapshot.index + 1`` (or 1)."""
    conf_state: ConfState | None = None
    """The membership in force (latest applied config); defaults to the snapshot's."""


class ProposalDropped(Exception):
    """A proposal or request the core refused; the message says why and what to do."""
