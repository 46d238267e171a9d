"""The meta state copied from worker 0 to the other workers (accord/node/metacopy.py),
over a real forwarding socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from accord.node import metacopy
from accord.node.forward import ForwardClient, ForwardServer
from accord.node.metacopy import MetaCopy, MetaFeed


class Register:
    """A deterministic machine: a dict of keys, with the log of indexes applied."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.indexes: list[int] = []

    def apply(self, index: int, payload: bytes) -> object:
        k, v = msgpack.unpackb(payload)
        self.data[k] = v
        self.indexes.append(index)
        return None

    def prepare_snapshot(self) -> Callable[[], bytes]:
        state = dict(self.data)
        return lambda: msgpack.packb(state)

    def restore(self, data: bytes) -> None:
        self.data = msgpack.unpackb(data)


class Worker0:
    """The meta group on worker 0: a feed around a machine, with its applied index."""

    def __init__(self, keep: int, feed_cls: type[MetaFeed] = MetaFeed) -> None:
        self.applied = 0
        self.feed = feed_cls(Register(), lambda: self.applied, keep=keep)

    def apply(self, k: str, v: str) -> None:
        self.applied += 1
        self.feed.apply(self.applied, msgpack.packb([k, v]))

    def empty(self) -> None:
        """An entry without a command (a new leader's), passed as the host passes it."""
        self.applied += 1
        self.feed.note_applied(self.applied)


@contextlib.asynccontextmanager
async def wired(tmp_path: Path, w0: Worker0,
                wait_s: float = 0.5) -> AsyncIterator[tuple[ForwardServer, MetaCopy]]:
    sock = tmp_path / "worker-0.sock"
    server = ForwardServer(sock, {metacopy.METHOD: w0.feed.serve})
    await server.start()
    client = ForwardClient(sock)
    copy = MetaCopy(Register(), client, wait_s=wait_s, retry_s=0.05)
    task = asyncio.ensure_future(copy.run())
    try:
        yield server, copy
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        await server.stop()


def state(m: Any) -> dict[str, str]:
    return dict(m.data)


async def test_a_copy_follows_every_entry_in_order(tmp_path: Path) -> None:
    w0 = Worker0(keep=100)
    async with wired(tmp_path, w0) as (_, copy):
        for i in range(20):
            w0.apply(f"k{i % 7}", str(i))
            if i % 5 == 0:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(copy.wait_applied(20), 10)
        assert state(copy.machine) == state(w0.feed.machine)
        assert copy.machine.indexes == list(range(1, 21))


async def test_a_copy_behind_the_ring_gets_a_snapshot_then_entries(tmp_path: Path) -> None:
    w0 = Worker0(keep=3)
    for i in range(10):
        w0.apply(f"k{i}", str(i))
    async with wired(tmp_path, w0) as (_, copy):
        await asyncio.wait_for(copy.wait_applied(10), 10)
        assert state(copy.machine) == state(w0.feed.machine)
        assert copy.machine.indexes == []  # all of it came in the snapshot
        w0.apply("after", "snap")
        await asyncio.wait_for(copy.wait_applied(11), 10)
        assert state(copy.machine) == state(w0.feed.machine) and copy.machine.indexes == [11]


async def test_a_restored_worker0_sends_its_new_state(tmp_path: Path) -> None:
    w0 = Worker0(keep=100)
    async with wired(tmp_path, w0) as (_, copy):
        w0.apply("a", "1")
        await asyncio.wait_for(copy.wait_applied(1), 10)
        # worker 0's replica is sent a leader's snapshot at index 50
        w0.feed.restore(msgpack.packb({"a": "2", "b": "3"}))
        w0.applied = 50
        w0.apply("c", "4")
        await asyncio.wait_for(copy.wait_applied(51), 10)
        assert state(copy.machine) == {"a": "2", "b": "3", "c": "4"} == state(w0.feed.machine)


async def test_the_copy_waits_out_a_worker0_restart(tmp_path: Path) -> None:
    w0 = Worker0(keep=100)
    async with wired(tmp_path, w0) as (server, copy):
        w0.apply("a", "1")
        await asyncio.wait_for(copy.wait_applied(1), 10)
        await server.stop()
        w0.apply("b", "2")
        await asyncio.sleep(0.1)  # the copy's calls fail meanwhile; it keeps asking
        await server.start()
        await asyncio.wait_for(copy.wait_applied(2), 10)
        assert state(copy.machine) == {"a": "1", "b": "2"}


async def test_a_copy_follows_across_the_logs_empty_entries(tmp_path: Path) -> None:
    """The host applies only entries with a command: a new leader's empty entry (or a
    configuration change) leaves a hole in the indexes the machine sees, which is no
    skipped entry; the copy reaches the group's applied index all the same."""
    w0 = Worker0(keep=100)
    async with wired(tmp_path, w0) as (_, copy):
        w0.apply("a", "1")
        w0.applied += 2  # two empty entries (an election, a configuration change)
        w0.apply("b", "2")
        await asyncio.wait_for(copy.wait_applied(4), 10)
        w0.applied += 1  # an empty entry, nothing after it
        w0.apply("c", "3")
        w0.applied += 3  # the copy's long poll ends with the group's applied index
        await asyncio.wait_for(copy.wait_applied(9), 10)
        assert state(copy.machine) == {"a": "1", "b": "2", "c": "3"}
        assert copy.machine.indexes == [1, 4, 6]


async def test_an_up_to_date_copy_learns_an_empty_entry_without_waiting_out_its_poll(
    tmp_path: Path,
) -> None:
    """The meta group's leader changed: its new leader's empty entry moves the applied
    index and nothing else. A worker's freshness barrier waits for its copy to reach
    that index, so the copy's long poll must end then, not after its 30 s (which the
    barrier's own bound of 5 s would not outlast: every call checked there failed)."""
    w0 = Worker0(keep=100)
    async with wired(tmp_path, w0, wait_s=30.0) as (_, copy):
        w0.apply("a", "1")
        await asyncio.wait_for(copy.wait_applied(1), 10)
        await asyncio.sleep(0.1)  # the copy's next long poll is waiting at worker 0
        w0.empty()
        await asyncio.wait_for(copy.wait_applied(2), 5)
        w0.empty()
        w0.empty()
        w0.apply("b", "2")
        await asyncio.wait_for(copy.wait_applied(5), 5)
        assert state(copy.machine) == {"a": "1", "b": "2"} and copy.machine.indexes == [1, 5]


async def test_a_restarted_worker0_is_followed_from_its_own_log(tmp_path: Path) -> None:
    """Worker 0 restarts as a new process (a new feed): replaying its log from the
    start it sends what the copy lacks; restored from a snapshot first, it sends the
    snapshot (its ring starts at a restore the copy did not see)."""
    w0 = Worker0(keep=100)
    sock = tmp_path / "worker-0.sock"
    client = ForwardClient(sock)
    copy = MetaCopy(Register(), client, wait_s=0.3, retry_s=0.05)
    task = asyncio.ensure_future(copy.run())
    server = ForwardServer(sock, {metacopy.METHOD: w0.feed.serve})
    await server.start()
    try:
        for i in range(3):
            w0.apply(f"k{i}", str(i))
        await asyncio.wait_for(copy.wait_applied(3), 10)
        await server.stop()
        # A new worker 0 replays its log (entries 1..3), then applies entry 4.
        again = Worker0(keep=100)
        for i in range(3):
            again.apply(f"k{i}", str(i))
        again.apply("k3", "3")
        server = ForwardServer(sock, {metacopy.METHOD: again.feed.serve})
        await server.start()
        await asyncio.wait_for(copy.wait_applied(4), 10)
        assert state(copy.machine) == state(again.feed.machine)
        assert copy.machine.indexes == [1, 2, 3, 4]
        await server.stop()
        # Another one restores a snapshot at 40 (entries 5..40 not in any ring here).
        third = Worker0(keep=100)
        third.feed.restore(msgpack.packb({"k0": "0", "k9": "9"}))
        third.applied = 40
        third.apply("k10", "10")
        server = ForwardServer(sock, {metacopy.METHOD: third.feed.serve})
        await server.start()
        await asyncio.wait_for(copy.wait_applied(41), 10)
        assert state(copy.machine) == {"k0": "0", "k9": "9", "k10": "10"}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        await server.stop()


class LatestOnly(MetaFeed):
    """Broken variant: sends only the newest entry, whatever the copy has."""

    def _entries_after(self, since: int,
                       epoch: int | None) -> list[tuple[int | None, int, bytes]] | None:
        got = super()._entries_after(since, epoch)
        return got[-1:] if got else got


async def test_broken_feed_that_skips_entries_is_caught(tmp_path: Path) -> None:
    w0 = Worker0(keep=100, feed_cls=LatestOnly)
    for i in range(5):
        w0.apply(f"k{i}", str(i))
    sock = tmp_path / "worker-0.sock"
    server = ForwardServer(sock, {metacopy.METHOD: w0.feed.serve})
    await server.start()
    client = ForwardClient(sock)
    copy = MetaCopy(Register(), client, wait_s=0.2)
    try:
        with pytest.raises(ValueError, match="skipped from index 0 to 5"):
            await copy.run()
    finally:
        await client.close()
        await server.stop()
