"""The core's in-memory Raft log: snapshot metadata, entries, and what is durable.

Layout: everything up to ``snapshot_index`` is compacted into a snapshot; the
entries after it are held in one list. Three cursors describe durability and
application:

* ``_stable``: entries up to here are known durable (an ``advance`` confirmed them);
* ``_in_progress``: entries up to here were handed out in a ``Ready`` to persist;
* ``committed`` / ``applying`` / ``applied``: commit index, the last index handed
  out for application, and the last index the application confirmed.

A snapshot received from the leader is held as ``pending_snapshot`` until the
caller persists it; no committed entries are handed out meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from accord.raft.core.types import Entry, Snapshot, SnapshotMeta


class LogError(RuntimeError):
    """An operation would break a Raft log invariant (a bug, never bad luck)."""


class RaftLog:
    """Entries after a snapshot plus the commit/apply/persist cursors."""

    __slots__ = (
        "_ents",
        "_in_progress",
        "_snap_in_progress",
        "_stable",
        "applied",
        "applying",
        "committed",
        "pending_snapshot",
        "snapshot_meta",
    )

    def __init__(
        self, snapshot: SnapshotMeta | None, entries: Sequence[Entry], commit: int
    ) -> None:
        self.snapshot_meta = snapshot if snapshot is not None else SnapshotMeta()
        first = self.snapshot_meta.index + 1
        # Entries the snapshot already covers (a WAL may still hold them) are dropped.
        ents = [e for e in entries if e.index >= first]
        for i, e in enumerate(ents):
            if e.index != first + i:
                raise ValueError(
                    f"entries must be contiguous from {first}: position {i} has index {e.index}"
                )
        self._ents = ents
        last = self.last_index()
        if commit > last:
            raise ValueError(f"hard state commit {commit} is beyond the last log index {last}")
        self.committed = max(commit, self.snapshot_meta.index)
        self.applied = self.snapshot_meta.index
        self.applying = self.applied
        self._stable = last
        self._in_progress = last
        self.pending_snapshot: Snapshot | None = None
        self._snap_in_progress = False

    # -- queries -----------------------------------------------------------
    @property
    def snapshot_index(self) -> int:
        """Index of the last compacted entry (0 when nothing was compacted)."""
        return self.snapshot_meta.index

    def first_index(self) -> int:
        """The first index still held as an entry."""
        return self.snapshot_meta.index + 1

    def last_index(self) -> int:
        """The index of the last entry (the snapshot index when there are none)."""
        return self.snapshot_meta.index + len(self._ents)

    def last_term(self) -> int:
        """The term of the last entry."""
        if self._ents:
            return self._ents[-1].term
        return self.snapshot_meta.term

    def term(self, index: int) -> int | None:
        """The term of ``index``, or None when it is compacted away or beyond the end."""
        off = index - self.snapshot_meta.index
        if off == 0:
            return self.snapshot_meta.term
        if off < 0 or off > len(self._ents):
            return None
        return self._ents[off - 1].term

    def match_term(self, index: int, term: int) -> bool:
        """Whether the log holds an entry at ``index`` with ``term``."""
        return self.term(index) == term

    def stable_index(self) -> int:
        """Entries up to here are durable."""
        return self._stable

    def entry(self, index: int) -> Entry:
        """The entry at ``index`` (must be held)."""
        off = index - self.snapshot_meta.index
        if off <= 0 or off > len(self._ents):
            raise LogError(f"entry {index} is not held (first {self.first_index()}, "
                           f"last {self.last_index()})")
        return self._ents[off - 1]

    def slice(self, lo: int, hi: int, max_bytes: int = 0) -> list[Entry]:
        """Entries ``[lo, hi)``, cut once ``max_bytes`` of payload is reached.

        At least one entry is returned when the range is non-empty.
        """
        base = self.snapshot_meta.index + 1
        if lo < base or hi > self.last_index() + 1:
            raise LogError(f"slice [{lo}, {hi}) outside held entries [{base}, {self.last_index()}]")
        ents = self._ents[lo - base : hi - base]
        if max_bytes > 0 and len(ents) > 1:
            size = 0
            for i, e in enumerate(ents):
                size += len(e.data)
                if size > max_bytes and i > 0:
                    return ents[:i]
        return ents

    def is_up_to_date(self, last_term: int, last_index: int) -> bool:
        """Whether a log ending at (last_term, last_index) is at least as new as ours."""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest index <= ``index`` whose term is <= ``term``, and that term.

        Used on both sides of fast backtracking: it skips whole terms that cannot
        match instead of one entry per round trip.
        """
        index = min(index, self.last_index())
        while index > self.snapshot_meta.index:
            t = self._ents[index - self.snapshot_meta.index - 1].term
            if t <= term:
                return index, t
            index -= 1
        return index, self.snapshot_meta.term if index == self.snapshot_meta.index else 0

    # -- mutation ----------------------------------------------------------
    def append(self, entries: Sequence[Entry]) -> int:
        """Append ``entries``, truncating any conflicting suffix first. Returns last index."""
        if not entries:
            return self.last_index()
        after = entries[0].index - 1
        if after < self.committed:
            raise LogError(f"append after {after} would overwrite committed entries "
                           f"(committed {self.committed})")
        last = self.last_index()
        if after < last:
            del self._ents[after - self.snapshot_meta.index :]
            if self._stable > after:
                self._stable = after
            if self._in_progress > after:
                self._in_progress = after
        elif after > last:
            raise LogError(f"append at {after + 1} leaves a gap after last index {last}")
        self._ents.extend(entries)
        return self.last_index()

    def append_one(self, entry: Entry) -> None:
        """Append a single entry at the end (the leader's proposals)."""
        self._ents.append(entry)

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry in ``entries`` not already in the log (0: none)."""
        for e in entries:
            if self.term(e.index) != e.term:
                return e.index
        return 0

    def maybe_append(
        self, index: int, log_term: int, commit: int, entries: Sequence[Entry]
    ) -> int | None:
        """Follower side of APP: append if (index, log_term) matches; None if it does not.

        Returns the index of the last entry the message proves we share with the
        leader; commit moves up to min(commit, that index).
        """
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        ci = self.find_conflict(entries)
        if ci:
            if ci <= self.committed:
                raise LogError(f"entry {ci} conflicts with committed entry "
                               f"(committed {self.committed})")
            self.append(entries[ci - index - 1 :])
        self.commit_to(min(commit, last_new))
        return last_new

    def commit_to(self, index: int) -> bool:
        """Move the commit index forward (never backward). Returns whether it moved."""
        if index > self.committed:
            if index > self.last_index():
                raise LogError(f"commit {index} beyond last index {self.last_index()}")
            self.committed = index
            return True
        return False

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log with ``snapshot`` (a follower installing one)."""
        self.snapshot_meta = snapshot.meta
        self._ents = []
        idx = snapshot.meta.index
        self.committed = idx
        self._stable = idx
        self._in_progress = idx
        self.pending_snapshot = snapshot
        self._snap_in_progress = False

    def compact(self, meta: SnapshotMeta) -> None:
        """Drop entries up to ``meta.index`` (already applied) from memory.

        Compacting to an index the log is already compacted past does nothing (a
        late snapshot racing a newer one, or an installed snapshot, is harmless).
        """
        if meta.index <= self.snapshot_meta.index:
            return
        if meta.index > self.applied:
            raise ValueError(f"cannot compact to {meta.index}: only {self.applied} is applied")
        term = self.term(meta.index)
        if term != meta.term:
            raise ValueError(f"snapshot term {meta.term} at index {meta.index} does not "
                             f"match the log's term {term}")
        del self._ents[: meta.index - self.snapshot_meta.index]
        self.snapshot_meta = meta
        self._stable = max(self._stable, meta.index)
        self._in_progress = max(self._in_progress, meta.index)

    # -- Ready plumbing ----------------------------------------------------
    def has_unstable(self) -> bool:
        """Entries or a snapshot not yet handed out for persistence."""
        return self._in_progress < self.last_index() or (
            self.pending_snapshot is not None and not self._snap_in_progress
        )

    def take_unstable(self) -> list[Entry]:
        """Hand out the entries not yet handed out for persistence."""
        last = self.last_index()
        if self._in_progress >= last:
            return []
        ents = self._ents[self._in_progress - self.snapshot_meta.index :]
        self._in_progress = last
        return ents

    def take_snapshot(self) -> Snapshot | None:
        """Hand out the pending snapshot, once."""
        if self.pending_snapshot is None or self._snap_in_progress:
            return None
        self._snap_in_progress = True
        return self.pending_snapshot

    def stable_to(self, index: int, term: int) -> None:
        """The caller made entries up to (index, term) durable."""
        if index > self._stable and self.term(index) == term:
            self._stable = min(index, self._in_progress)

    def snapshot_persisted(self, snapshot: Snapshot) -> None:
        """The caller made ``snapshot`` durable and installed it in the state machine."""
        if self.pending_snapshot is snapshot:
            self.pending_snapshot = None
            self._snap_in_progress = False
        idx = snapshot.meta.index
        if idx > self.applied:
            self.applied = idx
        if idx > self.applying:
            self.applying = idx

    def has_committed_to_apply(self) -> bool:
        """Committed entries not yet handed out for application."""
        return self.committed > self.applying and self.pending_snapshot is None

    def take_committed(self) -> list[Entry]:
        """Hand out committed entries not yet handed out."""
        if not self.has_committed_to_apply():
            return []
        lo = self.applying + 1
        ents = self.slice(lo, self.committed + 1)
        self.applying = self.committed
        return ents

    def applied_to(self, index: int) -> None:
        """The application applied entries up to ``index``."""
        if index > self.applied:
            self.applied = index
