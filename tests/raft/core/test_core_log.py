"""The core's in-memory log and the ReadIndex bookkeeping, tested directly."""

from __future__ import annotations

import pytest

from accord.raft.core.log import LogError, RaftLog
from accord.raft.core.readonly import ReadOnly, decode_round, encode_round
from accord.raft.core.types import ConfState, Entry, Snapshot, SnapshotMeta


def ents(*terms: int, start: int = 1) -> list[Entry]:
    return [Entry(t, start + i) for i, t in enumerate(terms)]


def test_terms_and_bounds() -> None:
    log = RaftLog(SnapshotMeta(3, 2), ents(2, 3, 3, start=4), commit=4)
    assert (log.first_index(), log.last_index(), log.last_term()) == (4, 6, 3)
    assert [log.term(i) for i in range(2, 8)] == [None, 2, 2, 3, 3, None]
    assert log.committed == 4 and log.applied == 3
    with pytest.raises(LogError):
        log.entry(3)


def test_maybe_append_truncates_conflicts_and_bounds_commit() -> None:
    log = RaftLog(None, ents(1, 1, 1, 1), commit=1)
    log.take_unstable()
    assert log.maybe_append(9, 1, 5, []) is None  # beyond our log
    assert log.maybe_append(2, 2, 5, []) is None  # term mismatch
    last = log.maybe_append(2, 1, 9, ents(2, 2, start=3))
    assert last == 4
    assert [log.term(i) for i in range(1, 5)] == [1, 1, 2, 2]
    assert log.committed == 4  # min(leader commit 9, last new entry 4)
    assert [e.index for e in log.take_unstable()] == [3, 4]
    # an APP that is already contained changes nothing (no truncation)
    assert log.maybe_append(1, 1, 0, ents(1, start=2)) == 2
    assert log.last_index() == 4


def test_append_refuses_to_touch_committed_entries() -> None:
    log = RaftLog(None, ents(1, 1, 1), commit=2)
    with pytest.raises(LogError, match="committed"):
        log.append(ents(5, start=2))
    with pytest.raises(LogError, match="gap"):
        log.append(ents(5, start=9))


def test_find_conflict_by_term_skips_whole_terms() -> None:
    log = RaftLog(None, ents(1, 1, 2, 2, 2, 5, 5), commit=0)
    assert log.find_conflict_by_term(7, 4) == (5, 2)
    assert log.find_conflict_by_term(7, 9) == (7, 5)
    assert log.find_conflict_by_term(4, 1) == (2, 1)
    assert log.find_conflict_by_term(7, 0) == (0, 0)
    assert log.find_conflict_by_term(99, 2) == (5, 2)


def test_stable_tracking_survives_truncation() -> None:
    log = RaftLog(None, [], commit=0)
    log.append(ents(1, 1, 1))
    handed = log.take_unstable()
    assert not log.has_unstable()
    log.append(ents(2, start=3))  # truncates an in-progress entry
    assert log.has_unstable()
    log.stable_to(handed[-1].index, handed[-1].term)  # stale: entry 3 is now term 2
    assert log.stable_index() == 0
    log.stable_to(2, 1)
    assert log.stable_index() == 2
    assert [e.index for e in log.take_unstable()] == [3]


def test_compaction_and_restore() -> None:
    log = RaftLog(None, ents(1, 1, 2, 2), commit=4)
    committed = log.take_committed()
    assert [e.index for e in committed] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="only 0 is applied"):
        log.compact(SnapshotMeta(2, 1))
    log.applied_to(4)
    with pytest.raises(ValueError, match="does not match"):
        log.compact(SnapshotMeta(3, 1))
    log.compact(SnapshotMeta(3, 2, ConfState(voters=(1,))))
    assert log.first_index() == 4 and log.term(3) == 2 and log.term(2) is None
    snap = Snapshot(SnapshotMeta(10, 3, ConfState(voters=(1,))), b"state")
    log.restore(snap)
    assert log.committed == 10 and log.last_index() == 10
    assert not log.has_committed_to_apply()
    assert log.take_snapshot() is snap and log.take_snapshot() is None
    log.snapshot_persisted(snap)
    assert log.applied == 10 and log.pending_snapshot is None


def test_slice_respects_byte_limit_but_returns_one() -> None:
    big = [Entry(1, i, data=b"x" * 10) for i in range(1, 6)]
    log = RaftLog(None, big, commit=0)
    assert len(log.slice(1, 6, 25)) == 2
    assert len(log.slice(1, 6, 1)) == 1
    assert len(log.slice(1, 6, 0)) == 5


def test_readonly_batches_release_by_quorum_of_rounds() -> None:
    ro = ReadOnly()
    ro.queue(1, b"a")
    ro.queue(2, b"b")
    ro.start_round(1, index=7)
    ro.queue(1, b"c")
    ro.start_round(2, index=9)
    voters = (1, 2, 3)
    assert ro.release(voters, (), 1, current_seq=2) == []
    ro.ack(3, 1, tick=0)
    released = ro.release(voters, (), 1, current_seq=2)
    assert [(b.index, b.requests) for b in released] == [(7, [(1, b"a"), (2, b"b")])]
    ro.ack(2, 2, tick=0)  # a later round covers every earlier batch too
    assert [b.index for b in ro.release(voters, (), 1, current_seq=2)] == [9]
    assert ro.pending_batches() == 0


def test_readonly_quorum_tick_and_round_encoding() -> None:
    ro = ReadOnly()
    assert ro.quorum_tick((1, 2, 3), (), 1, now=50) == -1
    ro.ack(2, 4, tick=40)
    ro.ack(3, 5, tick=45)
    assert ro.quorum_tick((1, 2, 3), (), 1, now=50) == 45
    ro.ack(3, 3, tick=99)  # an older round never moves the lease back or forward
    assert ro.quorum_tick((1, 2, 3), (), 1, now=50) == 45
    assert decode_round(encode_round(3, 4, 5)) == (3, 4, 5)
    assert decode_round(b"user ctx") is None
