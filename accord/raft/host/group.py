"""What the Multi-Raft host is made of: the per-group record and the host's contracts.

``multiraft.py`` drives groups; this module holds what it drives them with: the
:class:`StateMachine` and :class:`Transport` protocols it needs from the node, its
:class:`HostConfig`, the :class:`Group` record (a core, its state machine, and the
futures waiting on it), the errors clients see, and :class:`FileSource` (a snapshot
file streamed to a follower).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from accord.raft.core.raft import RaftCore
from accord.raft.core.types import NO_NODE, ConfState, Entry, Message, Snapshot, SnapshotMeta
from accord.raft.storage.snapshot import SnapshotStore


class StateMachine(Protocol):
    """What a group replicates. ``apply`` must be deterministic.

    A state machine may also have ``apply_unanswered(index, payload) -> None``
    (:class:`AnswerOptional`): the host calls it instead of ``apply`` for an entry no
    caller on this node waits for (another node's proposal, an entry replayed at start),
    so that the answer only the proposing node reads is built there alone. It must
    change the state exactly as ``apply`` does."""

    def apply(self, index: int, payload: bytes) -> object:
        """Apply one committed command; the return value answers the proposer."""

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """Capture the state now (cheaply, on the loop); the function returned
        serializes that capture and runs in a worker thread."""

    def restore(self, data: bytes) -> None:
        """Replace the whole state by a snapshot's."""


class AnswerOptional(Protocol):
    """A state machine that can apply a command without building its answer."""

    def apply_unanswered(self, index: int, payload: bytes) -> None:
        """``apply`` for an entry nobody on this node waits for: the same state
        change, no answer (a refusal may still raise, and is ignored as ``apply``'s)."""


class AppliedIndexListener(Protocol):
    """A state machine that wants to know when the group's applied index moves over
    entries that carried no command (a new leader's empty entry, a configuration
    change): the host applies nothing then, so without this a reader that waits for the
    applied index to move (a long poll that copies the group's state elsewhere) would
    not learn of it until something else woke it."""

    def note_applied(self, index: int) -> None:
        """The group's applied index is now ``index``; the entries up to it that were not
        handed to ``apply`` carried no command."""


class Transport(Protocol):
    """The part of ``PeerTransport`` the host uses."""

    def send(self, to_node: int, group_id: int, msg: Message) -> None: ...

    def flush(self) -> None: ...

    def send_heartbeat(self, to_node: int, group_id: int, term: int, commit: int) -> None: ...

    def start_snapshot(
        self,
        to_node: int,
        group_id: int,
        meta: SnapshotMeta,
        source: FileSource,
        on_done: Callable[[bool], None],
    ) -> None: ...

    def add_peer_lost_listener(self, listener: Callable[[int], None]) -> None: ...

    def connected(self, node_id: int) -> bool: ...

    def has_room(self, node_id: int) -> bool: ...


class GroupUnavailable(Exception):
    """The group cannot serve the request now; retrying later may succeed.

    ``reason`` is one of etcd's transient errors: ``no leader``, ``leader
    changed``, ``request timed out``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ApplyError(Exception):
    """Wraps an exception the state machine raised for a command (its answer)."""


SNAPSHOT_STRETCH = 10
"""However large the state, a group snapshots by this many times ``snapshot_entries``
applied entries (the log held in memory stays bounded in entries too)."""


@dataclass(slots=True)
class HostConfig:
    """Timing and batching knobs of a host."""

    tick_interval: float = 0.1
    """Seconds per Raft tick (the heartbeat interval)."""
    election_ticks: int = 10
    request_timeout: float = 7.0
    """How long a proposal or read may wait for its answer."""
    snapshot_entries: int = 10_000
    """Applied entries between two snapshots of a group, at least (:meth:`Group.snapshot_due`)."""
    snapshot_log_percent: int = 50
    """A snapshot also waits until the entries applied since the last one add up to this
    percentage of that snapshot's size, in bytes (0: it does not wait; etcd's rule)."""
    lease_read: bool = False
    clock_drift_ticks: int = 0
    max_apply_batch: int = 512
    """Entries applied before the apply task yields to the event loop."""
    quiesce: bool = True
    """Stop ticking idle groups (``quiesce.py``); never with lease reads, whose lease
    needs ticks to expire."""
    quiesce_after_ticks: int = 3
    """Idle ticks before a leader quiesces its group."""


@dataclass(slots=True)
class ReadWaiter:
    future: asyncio.Future[None]
    index: int = 0


@dataclass(slots=True, eq=False)
class Group:
    """One Raft group hosted on this node: its core, state machine and waiters."""

    id: int
    core: RaftCore
    sm: StateMachine
    applied: int = 0
    applied_term: int = 0
    last_snapshot_index: int = 0
    last_snapshot_bytes: int = 0
    """Size of the state in the group's latest snapshot (taken, installed or loaded)."""
    applied_bytes: int = 0
    """Bytes of the commands applied since that snapshot."""
    proposals: dict[int, asyncio.Future[object]] = field(default_factory=dict)
    reads_pending: list[asyncio.Future[None]] = field(default_factory=list)
    reads_issued: dict[bytes, tuple[int, list[asyncio.Future[None]]]] = field(default_factory=dict)
    """ReadIndex context -> (the leader it went to, the reads waiting for its answer)."""
    reads_round_at: float = 0.0
    """When the last ReadIndex round was issued (one round in flight at a time)."""
    reads_waiting: list[ReadWaiter] = field(default_factory=list)
    apply_queue: deque[Entry] = field(default_factory=deque)
    pending_restore: Snapshot | None = None
    persisted_conf: ConfState | None = None
    leader_listeners: list[Callable[[int, int], None]] = field(default_factory=list)
    idle_ticks: int = 0
    quiesce_from: int = NO_NODE
    """A leader that asked this follower to quiesce (checked once the turn is done)."""
    conf_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    """Woken when the membership this node applied changes (``propose_conf_change``)."""
    snapshot_busy: bool = False
    """A snapshot of this group is being written (one at a time)."""
    load: dict[int, int] = field(default_factory=dict)
    """While this node leads: requests (proposals, ReadIndex rounds) by the node they
    arrived at, since ``MultiRaftHost.take_loads`` last took them (leader balancing)."""
    saved_vote: tuple[int, int] = (0, 0)
    """Term and vote of the last hard state written to the log."""
    saved_commit: int = 0
    """Commit index of the last hard state written to the log."""
    want_compaction: bool = False
    """A node was added while the log still starts at index 1: snapshot soon, so a
    leader (this one, or whichever follows) can send the newcomer a snapshot."""
    read_fence: Callable[[], bytes | None] | None = None
    """The state machine's read fence (``MultiRaftHost.fence_reads``): the command a
    leader appends before anything it appends after answering reads; it raises
    ``GroupUnavailable`` when it cannot be made now. None: reads are not fenced."""
    fenced_at: tuple[int, int] = (0, -1)
    """``(term, reads answered)`` of the core when the fence was last appended."""
    apply_unanswered: Callable[[int, bytes], None] | None = field(init=False)
    """The state machine's ``apply_unanswered`` (:class:`AnswerOptional`), or None."""
    note_applied: Callable[[int], None] | None = field(init=False)
    """The state machine's ``note_applied`` (:class:`AppliedIndexListener`), or None."""

    def __post_init__(self) -> None:
        self.apply_unanswered = getattr(self.sm, "apply_unanswered", None)
        self.note_applied = getattr(self.sm, "note_applied", None)

    @property
    def leader(self) -> int:
        """The leader this node knows of (``NO_NODE`` if none)."""
        return self.core.leader_id

    def snapshot_due(self, config: HostConfig) -> bool:
        """Whether to snapshot now: a newcomer's log to compact (``want_compaction``), or
        ``config.snapshot_entries`` applied since the last snapshot whose bytes reach
        ``config.snapshot_log_percent`` of its size, or ``SNAPSHOT_STRETCH`` times
        ``snapshot_entries`` applied whatever their size.

        Serializing a snapshot costs time in proportion to the state; taking one every
        fixed number of entries makes each write pay a share that grows with the store
        (a million keys: ~300 MB serialized every 10,000 writes). Waiting until the log
        since the last snapshot is a fixed fraction of its size keeps that share constant
        (the Raft thesis, section 5.1.3), for a log that holds about that fraction of the
        state in memory and on disk (or ``snapshot_entries`` entries, if more)."""
        if self.want_compaction and self.applied > 0:
            return True
        since = self.applied - self.last_snapshot_index
        if since < config.snapshot_entries:
            return False
        if since >= config.snapshot_entries * SNAPSHOT_STRETCH:
            return True
        return self.applied_bytes * 100 >= self.last_snapshot_bytes * config.snapshot_log_percent


class FileSource:
    """A snapshot file as a ``SnapshotSource`` (reads happen off the event loop)."""

    def __init__(self, store: SnapshotStore, group: int, path: str, size: int) -> None:
        self._store = store
        self._group = group
        self._path = path
        self._size = size

    @property
    def size(self) -> int:
        return self._size

    async def read(self, offset: int, max_bytes: int) -> bytes:
        def _read() -> bytes:
            with open(self._path, "rb") as f:
                f.seek(offset)
                return f.read(max_bytes)

        return await asyncio.to_thread(_read)
