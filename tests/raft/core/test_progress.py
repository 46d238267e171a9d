"""Progress states and the Inflights window (count and byte bounds)."""

from __future__ import annotations

import pytest

from accord.raft.core.progress import Inflights, Progress, ProgressState


def test_inflights_count_bound() -> None:
    w = Inflights(3)
    for i in (5, 7, 9):
        assert not w.full()
        w.add(i, 10)
    assert w.full()
    with pytest.raises(RuntimeError):
        w.add(11, 1)
    w.free_le(6)
    assert len(w) == 2 and not w.full()
    w.free_le(100)
    assert len(w) == 0 and w.bytes == 0


def test_inflights_byte_bound() -> None:
    w = Inflights(100, max_bytes=250)
    w.add(1, 100)
    w.add(2, 100)
    assert not w.full()
    w.add(3, 100)
    assert w.full() and w.bytes == 300
    w.free_le(1)
    assert w.bytes == 200 and not w.full()
    w.free_first_one()
    assert w.bytes == 100 and len(w) == 1


def test_inflights_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="max_inflight_msgs"):
        Inflights(0)
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        Inflights(1, -1)


def test_probe_sends_one_at_a_time() -> None:
    pr = Progress(match=0, next=5)
    assert not pr.is_paused()
    pr.sent_entries(7, 3, 30)
    assert pr.is_paused() and pr.next == 5  # probing does not move next
    assert pr.maybe_update(7)
    assert not pr.is_paused() and pr.next == 8


def test_replicate_streams_until_window_full() -> None:
    pr = Progress(match=4, next=5, inflights=Inflights(2))
    pr.become_replicate()
    pr.sent_entries(6, 2, 2)
    assert pr.next == 7 and not pr.is_paused()
    pr.sent_entries(8, 2, 2)
    assert pr.next == 9 and pr.is_paused()
    pr.maybe_update(6)
    pr.inflights.free_le(6)
    assert not pr.is_paused()


def test_maybe_decr_to_probe_and_stale() -> None:
    pr = Progress(match=0, next=10)
    # stale rejection (not of the probe we sent at next-1 = 9)
    assert not pr.maybe_decr_to(5, 3)
    assert pr.maybe_decr_to(9, 3)
    assert pr.next == 4
    # the hint can never take next below match + 1
    pr = Progress(match=5, next=10)
    assert pr.maybe_decr_to(9, 0)
    assert pr.next == 6


def test_maybe_decr_to_replicate() -> None:
    pr = Progress(match=5, next=10)
    pr.become_replicate()
    pr.next = 10
    assert not pr.maybe_decr_to(5, 0)  # at or below match: stale
    assert pr.maybe_decr_to(8, 0)
    assert pr.next == 6


def test_snapshot_state_transitions() -> None:
    pr = Progress(match=3, next=4)
    pr.become_snapshot(20)
    assert pr.state == ProgressState.SNAPSHOT and pr.is_paused()
    pr.become_probe()
    assert pr.state == ProgressState.PROBE and pr.next == 21
    pr.maybe_update(20)
    pr.become_replicate()
    assert pr.state == ProgressState.REPLICATE and pr.next == 21
    with pytest.raises(RuntimeError):
        pr.become_snapshot(30)
        pr.sent_entries(31, 1, 1)
