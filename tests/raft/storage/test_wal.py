"""Unit tests of the shared write-ahead log: semantics, validation, group commit, GC, failures."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path
from typing import Any

import pytest

from accord.raft.core.types import ConfState, Entry, HardState, PersistentState, SnapshotMeta
from accord.raft.storage.wal import WALFatalError, WriteAheadLog, WriteBatch


def ents(first: int, n: int, term: int = 1, tag: bytes = b"") -> list[Entry]:
    return [Entry(term, first + i, data=tag + str(first + i).encode()) for i in range(n)]


def reopen(wal: WriteAheadLog, **kw: Any) -> tuple[WriteAheadLog, dict[int, PersistentState]]:
    wal.close()
    return WriteAheadLog.open(wal.directory, **kw)


def test_roundtrip_many_groups(tmp_path: Path) -> None:
    wal, rec = WriteAheadLog.open(tmp_path / "wal", sync=False)
    assert rec == {}
    cs = ConfState(voters=(1, 2, 3))
    for i in range(1, 11):
        b = WriteBatch()
        for g in (1, 2, 7):
            b.add(g, entries=ents(i, 1, term=g), hard_state=HardState(g, 1, i - 1))
        wal.append_sync(b)
    wal.append_sync(WriteBatch().set_conf_state(7, 3, cs))
    wal, rec = reopen(wal, sync=False)
    try:
        assert sorted(rec) == [1, 2, 7]
        for g in (1, 2, 7):
            assert rec[g].hard_state == HardState(g, 1, 9)
            assert rec[g].entries == ents(1, 10, term=g)
            assert rec[g].snapshot is None
        assert rec[7].conf_state == cs
        assert rec[1].conf_state is None
    finally:
        wal.close()


def test_conflicting_suffix_is_truncated(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    wal.append_sync(WriteBatch().append_entries(1, ents(1, 10, term=1)))
    wal.append_sync(WriteBatch().append_entries(1, ents(6, 2, term=2, tag=b"new")))
    wal, rec = reopen(wal, sync=False)
    try:
        assert rec[1].entries == ents(1, 5, term=1) + ents(6, 2, term=2, tag=b"new")
    finally:
        wal.close()


def test_compaction_and_install_snapshot(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    cs = ConfState(voters=(1, 2))
    wal.append_sync(WriteBatch().append_entries(1, ents(1, 10)).append_entries(2, ents(1, 10)))
    wal.append_sync(WriteBatch().compact(1, SnapshotMeta(6, 1, cs)))
    wal.append_sync(
        WriteBatch().add(2, snapshot=SnapshotMeta(20, 3, cs), hard_state=HardState(3, 0, 20))
    )
    wal.append_sync(WriteBatch().append_entries(2, ents(21, 2, term=3)))
    wal, rec = reopen(wal, sync=False)
    try:
        assert rec[1].snapshot == SnapshotMeta(6, 1, cs)
        assert rec[1].entries == ents(7, 4)
        assert rec[2].snapshot == SnapshotMeta(20, 3, cs)
        assert rec[2].entries == ents(21, 2, term=3)
        assert rec[2].hard_state == HardState(3, 0, 20)
        # A conf state recorded before a newer snapshot defers to the snapshot's.
        assert rec[2].conf_state is None
    finally:
        wal.close()


def test_invalid_batches_are_refused_and_change_nothing(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    try:
        wal.append_sync(
            WriteBatch().add(1, entries=ents(1, 3), hard_state=HardState(5, 1, 2))
        )
        wal.append_sync(WriteBatch().compact(1, SnapshotMeta(2, 1)))
        bad = [
            (WriteBatch().append_entries(1, ents(5, 1)), "gap"),
            (WriteBatch().set_hard_state(1, HardState(4, 0, 0)), "terms never go backwards"),
            (WriteBatch().install_snapshot(1, SnapshotMeta(1, 1)), "older than the durable snapshot"),
            (
                WriteBatch().append_entries(2, ents(1, 1)).append_entries(1, ents(9, 1)),
                "gap",
            ),
        ]
        for batch, msg in bad:
            with pytest.raises(ValueError, match=msg):
                wal.append_sync(batch)
        # Group 2 of the last (refused) batch must not have been half-applied:
        wal.append_sync(WriteBatch().append_entries(2, ents(1, 1, tag=b"ok")))
        with pytest.raises(ValueError, match="contiguous"):
            WriteBatch().append_entries(1, [Entry(1, 4), Entry(1, 6)])
        with pytest.raises(ValueError, match="must be bytes"):
            WriteBatch().append_entries(1, [Entry(1, 4, data="text")])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="group id"):
            WriteBatch().append_entries(0, ents(1, 1))
        with pytest.raises(ValueError, match="removed in this batch"):
            WriteBatch().remove_group(3).append_entries(3, ents(1, 1))
        # A stale compaction (older than the durable snapshot) is a no-op, not an error.
        wal.append_sync(WriteBatch().compact(1, SnapshotMeta(1, 1)))
        b = WriteBatch().append_entries(1, ents(4, 1))
        wal.append_sync(b)
        with pytest.raises(ValueError, match="already appended"):
            wal.append_sync(b)
        with pytest.raises(ValueError, match="already appended"):
            b.append_entries(1, ents(5, 1))
        wal, rec = reopen(wal, sync=False)
        assert rec[1].entries == ents(3, 2)
        assert rec[1].snapshot == SnapshotMeta(2, 1)
        assert rec[1].hard_state == HardState(5, 1, 2)
        assert rec[2].entries == ents(1, 1, tag=b"ok")
    finally:
        wal.close()


def test_batch_merging_within_one_batch(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    b = WriteBatch().append_entries(1, ents(1, 5)).append_entries(1, ents(3, 2, term=2))
    b.append_entries(2, ents(1, 3)).install_snapshot(2, SnapshotMeta(10, 2))
    b.append_entries(2, ents(11, 1, term=2))
    wal.append_sync(b)
    wal, rec = reopen(wal, sync=False)
    try:
        assert rec[1].entries == ents(1, 2) + ents(3, 2, term=2)
        assert rec[2].entries == ents(11, 1, term=2)
        assert rec[2].snapshot == SnapshotMeta(10, 2)
    finally:
        wal.close()


def test_remove_group_and_recreate(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False, segment_bytes=4096)
    for i in range(1, 60):
        wal.append_sync(WriteBatch().add(1, entries=ents(i, 1, tag=b"x" * 100)))
    wal.append_sync(WriteBatch().add(2, entries=ents(1, 1), hard_state=HardState(1, 1, 0)))
    wal.append_sync(WriteBatch().remove_group(1))
    assert len(wal.segment_files()) == 1, "segments holding only the removed group are deleted"
    wal.append_sync(WriteBatch().append_entries(1, ents(1, 1, tag=b"again")))
    wal, rec = reopen(wal, sync=False, segment_bytes=4096)
    try:
        assert rec[1].entries == ents(1, 1, tag=b"again")
        assert rec[2].entries == ents(1, 1)
        assert rec[2].hard_state == HardState(1, 1, 0)
    finally:
        wal.close()


def test_segments_are_deleted_once_every_group_compacted(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False, segment_bytes=4096)
    try:
        pad = b"p" * 200
        for i in range(1, 101):
            b = WriteBatch()
            b.add(1, entries=ents(i, 1, tag=pad), hard_state=HardState(2, 1, i))
            if i <= 10:
                b.add(2, entries=ents(i, 1, tag=pad), hard_state=HardState(1, 0, i))
            wal.append_sync(b)
        nseg = len(wal.segment_files())
        assert nseg > 5
        wal.append_sync(WriteBatch().compact(1, SnapshotMeta(100, 2)))
        # Group 2 lags: its entries in the first segment keep it (and all later ones).
        assert len(wal.segment_files()) == nseg
        wal.append_sync(WriteBatch().compact(2, SnapshotMeta(10, 1)))
        assert len(wal.segment_files()) == 1
        assert wal.stats.segments_deleted == nseg - 1
        wal, rec = reopen(wal, sync=False, segment_bytes=4096)
        assert rec[1].hard_state == HardState(2, 1, 100)
        assert rec[1].snapshot == SnapshotMeta(100, 2) and rec[1].entries == []
        assert rec[2].hard_state == HardState(1, 0, 10)
        assert rec[2].snapshot == SnapshotMeta(10, 1)
    finally:
        wal.close()


def test_second_open_of_same_directory_is_refused(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    try:
        with pytest.raises(OSError, match="in use"):
            WriteAheadLog.open(tmp_path, sync=False)
    finally:
        wal.close()


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=True)
    real = wal._sync_file

    def slow_sync(fd: int | Any) -> None:
        time.sleep(0.003)
        real(fd)

    wal._sync_file = slow_sync
    try:
        done: list[int] = []

        async def proposer(g: int) -> None:
            for i in range(1, 6):
                await wal.append(WriteBatch().append_entries(g, ents(i, 1)))
                done.append(g)

        await asyncio.gather(*(proposer(g) for g in range(1, 65)))
        assert len(done) == 320
        assert wal.stats.batches == 320
        assert wal.stats.fsyncs < 320 / 4, wal.stats
    finally:
        wal.close()
    wal, rec = WriteAheadLog.open(tmp_path, sync=False)
    wal.close()
    assert all(rec[g].entries == ents(1, 5) for g in range(1, 65))


async def test_append_sync_on_event_loop_is_refused(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    try:
        with pytest.raises(RuntimeError, match="event loop"):
            wal.append_sync(WriteBatch().append_entries(1, ents(1, 1)))
        await wal.append(WriteBatch())  # an empty batch is a durability barrier
    finally:
        wal.close()


async def test_failed_fsync_is_fatal_and_never_acknowledged(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=True)
    await wal.append(WriteBatch().append_entries(1, ents(1, 1)))

    def broken(fd: int | Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    wal._sync_file = broken
    try:
        with pytest.raises(WALFatalError, match="fsync failed"):
            await wal.append(WriteBatch().append_entries(1, ents(2, 1)))
        assert wal.failed is not None
        with pytest.raises(WALFatalError):
            await wal.append(WriteBatch().append_entries(1, ents(3, 1)))
        with pytest.raises(WALFatalError):
            await asyncio.to_thread(wal.append_sync, WriteBatch().append_entries(1, ents(3, 1)))
    finally:
        wal.close()


async def test_cancelled_append_is_still_written(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=True)
    task = asyncio.create_task(wal.append(WriteBatch().append_entries(1, ents(1, 1))))
    await asyncio.sleep(0)
    task.cancel()
    await wal.append(WriteBatch().append_entries(1, ents(2, 1)))
    wal, rec = reopen(wal, sync=False)
    wal.close()
    assert rec[1].entries == ents(1, 2)


def _churn(wal: WriteAheadLog, start: int, n: int) -> None:
    """Entries for group 3, compacted as they go, to rotate and collect segments."""
    for i in range(start, start + n):
        b = WriteBatch().append_entries(3, ents(i, 1, tag=b"z" * 100))
        if i % 10 == 0:
            b.compact(3, SnapshotMeta(i - 1, 1))
        wal.append_sync(b)


def test_state_survives_deletion_of_the_segments_that_recorded_it(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=False, segment_bytes=4096)
    cs = ConfState(voters=(1, 2, 3))
    wal.append_sync(
        WriteBatch()
        .add(1, entries=ents(1, 5), hard_state=HardState(3, 1, 5))
        .set_conf_state(1, 5, cs)
        .compact(1, SnapshotMeta(5, 3, cs))
        .add(2, snapshot=SnapshotMeta(50, 2, cs), hard_state=HardState(2, 2, 50))
    )
    first_segment = wal.segment_files()[0]
    _churn(wal, 1, 200)
    assert not first_segment.exists(), "the first segment should have been collected"
    # Twice: after a restart, the state rebuilt by recovery must be carried forward
    # by later rotations too.
    for last in (200, 400):
        wal, rec = reopen(wal, sync=False, segment_bytes=4096)
        assert rec[1].snapshot == SnapshotMeta(5, 3, cs) and rec[1].entries == []
        assert rec[1].hard_state == HardState(3, 1, 5)
        assert rec[1].conf_state == cs
        assert rec[2].snapshot == SnapshotMeta(50, 2, cs) and rec[2].entries == []
        assert rec[2].hard_state == HardState(2, 2, 50)
        assert rec[3].snapshot == SnapshotMeta(last - 1, 1)
        assert rec[3].entries == ents(last, 1, tag=b"z" * 100)
        if last == 200:
            before = set(wal.segment_files())
            _churn(wal, 201, 200)
            assert not before & set(wal.segment_files())
    wal.close()
