"""The leader's view of one follower: how far it matches, what to send next.

A follower is in one of three states:

* PROBE: the leader does not know where the follower's log matches; it sends
  one APP at a time and waits for the answer (or a heartbeat response) before
  sending another, backtracking ``next`` on rejections.
* REPLICATE: the follower is known to match up to ``match``; the leader streams
  APPs optimistically (``next`` moves ahead before acks arrive), bounded by the
  ``Inflights`` window in message count and bytes.
* SNAPSHOT: the entries the follower needs are compacted away; a snapshot is on
  its way and nothing else is sent until it is acknowledged or reported failed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum


class ProgressState(IntEnum):
    """Replication state of one follower (see module docstring)."""

    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Inflights:
    """The window of APP messages sent but not yet acknowledged.

    Each element is the last index an APP carried and that APP's payload bytes.
    The window is full when it holds ``max_count`` messages or ``max_bytes``
    bytes (``max_bytes == 0`` means no byte bound).
    """

    __slots__ = ("_items", "bytes", "max_bytes", "max_count")

    def __init__(self, max_count: int, max_bytes: int = 0) -> None:
        if max_count <= 0:
            raise ValueError(f"max_inflight_msgs must be > 0, got {max_count}")
        if max_bytes < 0:
            raise ValueError(f"max_inflight_bytes must be >= 0, got {max_bytes}")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: deque[tuple[int, int]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, last_index: int, nbytes: int) -> None:
        """Record an APP ending at ``last_index`` (indexes must increase)."""
        if self.full():
            raise RuntimeError("Inflights.add on a full window")
        self._items.append((last_index, nbytes))
        self.bytes += nbytes

    def free_le(self, index: int) -> None:
        """Forget every APP whose last index is <= ``index`` (they are acked)."""
        items = self._items
        while items and items[0][0] <= index:
            _, nb = items.popleft()
            self.bytes -= nb

    def free_first_one(self) -> None:
        """Forget the oldest APP (used to unstick a full window after losses)."""
        if self._items:
            _, nb = self._items.popleft()
            self.bytes -= nb

    def full(self) -> bool:
        """True when no more APPs may be sent until some are acknowledged."""
        return len(self._items) >= self.max_count or (
            self.max_bytes > 0 and self.bytes >= self.max_bytes
        )

    def reset(self) -> None:
        """Empty the window."""
        self._items.clear()
        self.bytes = 0


@dataclass(slots=True)
class Progress:
    """Replication progress of one peer as tracked by the leader."""

    match: int = 0
    """Highest index known to be in the peer's (durable) log."""
    next: int = 1
    """Next index to send."""
    state: ProgressState = ProgressState.PROBE
    pending_snapshot: int = 0
    """Index of the snapshot in flight (SNAPSHOT state)."""
    recent_active: bool = False
    """Heard from since the last check-quorum round."""
    msg_app_flow_paused: bool = False
    """PROBE: an APP is outstanding, wait for its answer before sending another."""
    is_learner: bool = False
    snapshot_wait: int = 0
    """SNAPSHOT: heartbeat responses seen since the snapshot was sent."""
    sent_commit: int = 0
    """Highest commit index already told to this peer (avoids empty APPs)."""
    inflights: Inflights = field(default_factory=lambda: Inflights(256))

    def _reset_state(self, state: ProgressState) -> None:
        self.msg_app_flow_paused = False
        self.pending_snapshot = 0
        self.snapshot_wait = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        """Go back to probing from just after ``match`` (or after a sent snapshot)."""
        if self.state == ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        """Start streaming from just after ``match``."""
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        """A snapshot at ``snapshot_index`` is being sent; send nothing else meanwhile."""
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def sent_entries(self, last_index: int, n_entries: int, nbytes: int) -> None:
        """An APP ending at ``last_index`` was sent: move ``next``/pause accordingly."""
        if self.state == ProgressState.REPLICATE:
            if n_entries > 0:
                self.next = last_index + 1
                self.inflights.add(last_index, nbytes)
        elif self.state == ProgressState.PROBE:
            self.msg_app_flow_paused = True
        else:
            raise RuntimeError(f"sending entries in state {self.state.name}")

    def maybe_update(self, index: int) -> bool:
        """The peer acknowledged ``index``; returns whether ``match`` moved."""
        updated = False
        if self.match < index:
            self.match = index
            updated = True
            self.msg_app_flow_paused = False
        if self.next < index + 1:
            self.next = index + 1
        return updated

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """The peer rejected an APP at ``rejected``; back ``next`` off.

        ``match_hint`` is the highest index at which the logs may agree (from the
        follower's reject hint). Returns False for stale rejections.
        """
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.msg_app_flow_paused = False
        return True

    def is_paused(self) -> bool:
        """Whether the leader must hold APPs back from this peer for now."""
        if self.state == ProgressState.PROBE:
            return self.msg_app_flow_paused
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True
