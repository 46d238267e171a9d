"""Raft's safety properties, checked incrementally while a simulation runs.

Each ``on_*`` hook is called by the simulation at the moment the property can
first be judged (a node seen leading, entries persisted, an entry applied, a
hard state persisted, a read served); violations go to ``fail``, which raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from accord.raft.core.types import Entry, EntryType, HardState
from accord.raft.simulation.model import Read, SimNode, StateMachine, apply_entry


class Checker:
    """Raft's safety properties, checked incrementally as the simulation runs."""

    def __init__(self, fail: Callable[[str], None]) -> None:
        self.fail = fail
        self.leader_of_term: dict[int, int] = {}
        self.entry_ids: dict[tuple[int, int], tuple[EntryType, bytes, int]] = {}
        self.applied: dict[int, Entry] = {}
        self.commit_term: dict[int, int] = {}
        self.checked_leaders: set[tuple[int, int, int]] = set()

    def on_leader(self, node: SimNode, term: int) -> None:
        """At most one leader per term; a new leader holds every earlier-committed entry."""
        other = self.leader_of_term.setdefault(term, node.id)
        if other != node.id:
            self.fail(f"election safety: nodes {other} and {node.id} both leader in term {term}")
        key = (node.id, node.incarnation, term)
        if key not in self.checked_leaders:
            self.checked_leaders.add(key)
            for index in sorted(self.applied):
                self._check_holds(node, term, index)

    def _check_holds(self, node: SimNode, term: int, index: int) -> None:
        if self.commit_term[index] >= term:
            return
        snap = node.disk.snapshot
        if snap is not None and index < snap.index:
            return
        have = node.disk.term_at(index)
        want = self.applied[index].term
        if have != want:
            self.fail(f"leader completeness: leader {node.id} of term {term} has term {have} "
                      f"at index {index}, committed in term {self.commit_term[index]} "
                      f"with term {want}")

    def on_append(self, node: SimNode, entries: Sequence[Entry]) -> None:
        """Log matching: one (index, term) names one entry, with one predecessor term."""
        for e in entries:
            prev = node.disk.term_at(e.index - 1)
            if prev is None:
                self.fail(f"node {node.id} persisted entry {e.index} without its predecessor")
            ident = (e.type, e.data, prev or 0)
            known = self.entry_ids.setdefault((e.index, e.term), ident)
            if known != ident:
                self.fail(f"log matching: entry {e.index}/{e.term} on node {node.id} is "
                          f"{ident!r}, elsewhere {known!r}")

    def on_apply(self, node: SimNode, entry: Entry, term_now: int,
                 leaders: Sequence[tuple[SimNode, int]]) -> None:
        """State machine safety: every node applies the same entry at each index."""
        if entry.index != node.sm.applied + 1:
            self.fail(f"node {node.id} applied index {entry.index} after {node.sm.applied}")
        known = self.applied.get(entry.index)
        if known is None:
            self.applied[entry.index] = entry
            self.commit_term[entry.index] = term_now
            for leader, term in leaders:
                self._check_holds(leader, term, entry.index)
        elif known != entry:
            self.fail(f"state machine safety: node {node.id} applied {entry!r} at index "
                      f"{entry.index}, another node applied {known!r}")

    def reference_state(self, index: int) -> StateMachine:
        """The state machine every node must hold after applying ``index``."""
        sm = StateMachine()
        for i in range(1, index + 1):
            e = self.applied.get(i)
            if e is None:
                self.fail(f"snapshot at {index} covers index {i} that no node applied")
                break
            apply_entry(sm, e)
        return sm

    def on_hard_state(self, node: SimNode, old: HardState, new: HardState) -> None:
        """Terms never go back; a vote once cast in a term never changes."""
        if new.term < old.term:
            self.fail(f"node {node.id} persisted term {new.term} after {old.term}")
        if new.term == old.term and old.vote and new.vote != old.vote:
            self.fail(f"node {node.id} changed its vote in term {new.term}: "
                      f"{old.vote} -> {new.vote}")
        if new.commit < old.commit:
            self.fail(f"node {node.id} persisted commit {new.commit} after {old.commit}")

    def on_read(self, node: SimNode, read: Read) -> None:
        """Linearizable reads: see every write acknowledged before the read was issued."""
        seen = node.sm.kv.get(read.key, (0, 0))[1]
        if seen < read.required:
            self.fail(f"linearizability: read {read.ctx.decode()} of {read.key!r} on node "
                      f"{node.id} (issued tick {read.issued_tick}) saw the write at index "
                      f"{seen}, but the write at index {read.required} was acknowledged "
                      f"before the read was issued")
