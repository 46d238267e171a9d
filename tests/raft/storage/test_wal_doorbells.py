"""The WAL's doorbells between event loops and its writer thread.

Each event loop that appends gets its own completion eventfd (watched with
``add_reader``); the writer blocks on an eventfd of its own. These tests check the
plumbing: several loops at once (in other threads), loops that come and go, what
``close()`` does to appends queued just before it, and that no descriptor leaks.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from accord.raft.core.types import Entry
from accord.raft.storage.wal import WALFatalError, WriteAheadLog, WriteBatch


def ents(first: int, n: int) -> list[Entry]:
    return [Entry(1, first + i, data=b"v%d" % (first + i)) for i in range(n)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_loops_in_several_threads_share_one_log(tmp_path: Path) -> None:
    before = open_fds()
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    errors: list[BaseException] = []

    def worker(group: int) -> None:
        async def main() -> None:
            for i in range(1, 51):
                await wal.append(WriteBatch().append_entries(group, ents(i, 1)))

        try:
            asyncio.run(main())
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(g,)) for g in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    wal.close()
    assert open_fds() == before, "close() must release every loop's doorbell"
    wal, rec = WriteAheadLog.open(tmp_path, sync=False)
    wal.close()
    assert all(rec[g].entries == ents(1, 50) for g in (1, 2, 3))


def test_one_log_outlives_many_short_loops(tmp_path: Path) -> None:
    before = open_fds()
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)

    async def one(i: int) -> None:
        await wal.append(WriteBatch().append_entries(1, ents(i, 1)))

    for i in range(1, 21):
        asyncio.run(one(i))
    wal.close()
    assert open_fds() == before
    wal, rec = WriteAheadLog.open(tmp_path, sync=False)
    wal.close()
    assert rec[1].entries == ents(1, 20)


async def test_close_on_the_loop_acknowledges_what_was_queued(tmp_path: Path) -> None:
    before = open_fds()
    wal, _ = WriteAheadLog.open(tmp_path, sync=True)
    await wal.append(WriteBatch().append_entries(1, ents(1, 1)))
    # Queued, with the writer's kick still scheduled on this loop, then closed at once.
    tasks = [
        asyncio.create_task(wal.append(WriteBatch().append_entries(g, ents(1, 1))))
        for g in range(2, 6)
    ]
    await asyncio.sleep(0)
    wal.close()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    await asyncio.sleep(0)  # the stale kick runs on a closed log: a no-op
    with pytest.raises(RuntimeError, match="closed"):
        await wal.append(WriteBatch().append_entries(1, ents(2, 1)))
    assert open_fds() == before
    wal, rec = WriteAheadLog.open(tmp_path, sync=False)
    wal.close()
    assert sorted(rec) == [1, 2, 3, 4, 5]


def test_close_from_another_thread_while_the_loop_runs(tmp_path: Path) -> None:
    before = open_fds()
    wal, _ = WriteAheadLog.open(tmp_path, sync=False)
    appended = threading.Event()
    release = threading.Event()

    async def main() -> None:
        await wal.append(WriteBatch().append_entries(1, ents(1, 1)))
        appended.set()
        # Keep the loop running (and its doorbell registered) while another thread closes.
        while not release.is_set():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)  # let the detach scheduled by close() run

    t = threading.Thread(target=asyncio.run, args=(main(),))
    t.start()
    assert appended.wait(30)
    wal.close()
    release.set()
    t.join(timeout=30)
    assert not t.is_alive()
    assert open_fds() == before


async def test_failure_reaches_every_loop_waiting(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, sync=True)

    def broken(fd: int | Any) -> None:
        raise OSError(5, "Input/output error")

    wal._sync_file = broken
    results: list[BaseException | None] = []

    def other_loop() -> None:
        async def main() -> None:
            try:
                await wal.append(WriteBatch().append_entries(2, ents(1, 1)))
                results.append(None)
            except WALFatalError as e:
                results.append(e)

        asyncio.run(main())

    t = threading.Thread(target=other_loop)
    t.start()
    try:
        with pytest.raises(WALFatalError, match="fsync failed"):
            await wal.append(WriteBatch().append_entries(1, ents(1, 1)))
        await asyncio.to_thread(t.join, 30)
        assert not t.is_alive()
        assert len(results) == 1 and isinstance(results[0], WALFatalError)
    finally:
        wal.close()


async def test_no_append_returns_before_an_fsync_that_covers_it(tmp_path: Path) -> None:
    """Each acknowledgement follows an fsync that started after the append was queued."""
    wal, _ = WriteAheadLog.open(tmp_path, sync=True)
    events: list[tuple[str, int]] = []  # list.append is atomic: shared by both threads
    real = wal._sync_file

    def traced_sync(fd: int | Any) -> None:
        events.append(("sync-start", 0))
        real(fd)
        events.append(("sync-end", 0))

    wal._sync_file = traced_sync
    try:

        async def proposer(g: int) -> None:
            for i in range(1, 16):
                b = WriteBatch().append_entries(g, ents(i, 1))
                events.append(("submit", g))
                await wal.append(b)
                events.append(("ack", g))

        await asyncio.gather(*(proposer(g) for g in range(1, 17)))
    finally:
        wal.close()
    pending: dict[int, int] = {}  # group -> position of its unacknowledged submit
    last_start_after: dict[int, bool] = {}
    acks = 0
    for pos, (kind, g) in enumerate(events):
        if kind == "submit":
            pending[g] = pos
            last_start_after[g] = False
        elif kind == "sync-start":
            for h in pending:
                last_start_after[h] = True
        elif kind == "sync-end":
            for h, started in last_start_after.items():
                if started:
                    pending.pop(h, None)
            last_start_after = {h: s for h, s in last_start_after.items() if h in pending}
        else:
            assert g not in pending, f"group {g} acknowledged at event {pos} before an fsync covered it"
            acks += 1
    assert acks == 16 * 15
