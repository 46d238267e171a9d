"""The single-request fast paths: frames read by a protocol, turns run from the inbound
callback, commits applied inline by the poll loop.

``FrameReceiver`` is driven over real loopback sockets (split frames, several frames
per read, bytes buffered before the hand-over, every way a connection ends). The host
checks use the three-node cluster of ``test_host``: with the apply task cancelled, a
lone proposal must still be answered (the poll loop applied its commit itself); a
queue longer than ``INLINE_APPLY_MAX`` is left to the task; and a cluster with the
direct turns keeps answering proposals and ReadIndex reads from every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from accord.raft.core.types import Entry, EntryType, Role
from accord.raft.host.apply import INLINE_APPLY_MAX
from accord.raft.host.multiraft import GroupUnavailable
from accord.raft.transport.framing import FrameError, FrameReceiver, frame, take_buffered
from tests.raft.host.test_host import FAST, Cluster, running_cluster

# ---------------------------------------------------------------------------
# FrameReceiver over loopback


class Link:
    """A loopback connection whose accepting side hands over to a FrameReceiver after
    reading a 5-byte hello through the stream (as the transport does)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.receiver: FrameReceiver | None = None
        self.ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.server: asyncio.Server | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.fail_on: bytes | None = None

    async def open(self, *, max_bytes: int = 1024, idle: float = 5.0,
                   first: bytes = b"") -> asyncio.StreamWriter:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(5)
            if first:  # let the bytes written after the hello reach the stream's buffer
                while len(getattr(reader, "_buffer", b"")) < len(first):
                    await asyncio.sleep(0.005)
            self.receiver = FrameReceiver(self.on_frame, max_bytes, idle)
            self.receiver.attach(writer.transport, take_buffered(reader))
            try:
                await self.receiver.closed()
                self.ended.set_result(None)
            except BaseException as exc:  # the test inspects what ended the link
                self.ended.set_result(exc)
            finally:
                self.receiver.detach()
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        _, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.writer.write(b"hello" + first)
        return self.writer

    def on_frame(self, payload: bytes) -> None:
        if payload == self.fail_on:
            raise FrameError("refused by the handler")
        self.frames.append(payload)

    async def until(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.frames) < n:
                await asyncio.sleep(0.005)

    async def end(self) -> BaseException | None:
        async with asyncio.timeout(5):
            return await self.ended

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await self.server.wait_closed()


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    lk = Link()
    try:
        yield lk
    finally:
        await lk.close()


async def test_frames_split_across_reads_and_packed_in_one_read(link: Link) -> None:
    w = await link.open()
    payloads = [b"", b"a", b"bc" * 100, bytes(range(256)) * 3]
    wire = b"".join(frame(p) for p in payloads)
    for i in range(0, len(wire), 7):  # dribbled: headers and bodies cut anywhere
        w.write(wire[i:i + 7])
        await w.drain()
        await asyncio.sleep(0.001)
    w.write(wire)  # and all at once
    await link.until(2 * len(payloads))
    assert link.frames == payloads + payloads
    w.close()
    assert isinstance(await link.end(), EOFError)


async def test_bytes_buffered_before_the_hand_over_are_not_lost(link: Link) -> None:
    early = frame(b"early-1") + frame(b"early-2") + frame(b"ear")[:5]
    w = await link.open(first=early)
    w.write(frame(b"ear")[5:] + frame(b"late"))
    await link.until(4)
    assert link.frames == [b"early-1", b"early-2", b"ear", b"late"]


async def test_a_length_above_the_limit_closes_the_connection(link: Link) -> None:
    w = await link.open(max_bytes=16)
    w.write(frame(b"ok") + frame(b"x" * 17) + frame(b"never"))
    err = await link.end()
    assert isinstance(err, FrameError) and "exceeds the limit of 16" in str(err)
    assert link.frames == [b"ok"]


@pytest.mark.parametrize(("tail", "what"), [
    (frame(b"cut short")[:7], "truncated frame (3 of 9 bytes)"),
    (b"\x00\x00", "truncated frame header (2 of 4 bytes)"),
])
async def test_a_close_inside_a_frame_is_a_truncation(link: Link, tail: bytes, what: str) -> None:
    w = await link.open()
    w.write(frame(b"whole") + tail)
    await link.until(1)
    w.close()
    err = await link.end()
    assert isinstance(err, FrameError) and what in str(err)
    assert link.frames == [b"whole"]


async def test_a_handler_error_closes_the_connection_and_is_reported(link: Link) -> None:
    link.fail_on = b"bad"
    w = await link.open()
    w.write(frame(b"good") + frame(b"bad") + frame(b"after"))
    err = await link.end()
    assert isinstance(err, FrameError) and "refused by the handler" in str(err)
    assert link.frames == [b"good"]


async def test_a_silent_connection_times_out_and_a_talking_one_does_not(link: Link) -> None:
    w = await link.open(idle=0.3)
    for _ in range(6):  # 0.6 s of traffic, never 0.3 s of silence
        w.write(frame(b"tick"))
        await asyncio.sleep(0.1)
    assert not link.ended.done()
    err = await link.end()  # then silence
    assert isinstance(err, TimeoutError)
    assert len(link.frames) == 6


async def test_detach_ends_the_wait_quietly(link: Link) -> None:
    await link.open()
    async with asyncio.timeout(5):
        while link.receiver is None:
            await asyncio.sleep(0.005)
    link.receiver.detach()
    assert await link.end() is None


# ---------------------------------------------------------------------------
# the host: inline apply and direct turns


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in running_cluster(tmp_path, Cluster):
        yield c


def _cancel_apply_task(c: Cluster, nid: int) -> asyncio.Task[None]:
    host = c.nodes[nid].host
    (task,) = [t for t in host._tasks if t.get_name() == f"raft-apply-{nid}"]
    task.cancel()
    return task


STEADY = dataclasses.replace(FAST, election_ticks=100)
"""FAST with a 2 s election timeout: the lone-commit check needs its leader to stay leader
while the apply task is gone, and FAST's 200 ms elect a new one on a busy machine."""


async def test_a_lone_commit_is_applied_by_the_poll_loop(tmp_path: Path) -> None:
    # The premise is one leader without an apply task: if an election moves the group
    # anyway (a machine stalled for 2 s), the attempt is repeated on the new leader,
    # whose apply task is then cancelled too. A commit the poll loop failed to apply
    # times out without any change of term, and that fails at once.
    clusters = running_cluster(tmp_path, Cluster, STEADY)
    async with contextlib.aclosing(clusters):
        cluster = await anext(clusters)
        for _attempt in range(3):
            lead = await cluster.leader(1)
            await cluster.put(lead, 1, "warm", "up")
            host = cluster.nodes[lead].host
            term = host.group(1).core.term
            task = _cancel_apply_task(cluster, lead)
            with contextlib.suppress(asyncio.CancelledError):
                await task
            try:
                for i in range(5):  # one at a time: each commit arrives in a turn that writes nothing
                    index = await host.propose(1, bytes(msgpack.packb([f"k{i}", str(i)])), timeout=3.0)
                    assert isinstance(index, int)
            except GroupUnavailable:
                if host.group(1).core.term == term and host.group(1).core.role == Role.LEADER:
                    raise
                continue  # leadership moved: try again on the new leader
            assert cluster.nodes[lead].sms[1].data["k4"] == "4"
            return
        raise AssertionError("group 1 changed leader in each of 3 attempts")


@pytest.mark.parametrize(("count", "inline"), [
    (INLINE_APPLY_MAX, True), (INLINE_APPLY_MAX + 1, False)])
async def test_only_a_short_queue_is_applied_inline(cluster: Cluster, count: int,
                                                    inline: bool) -> None:
    lead = await cluster.leader(3)
    await cluster.put(lead, 3, "warm", "up")
    await cluster.nodes[lead].host.read_barrier(3, timeout=3.0)
    node = cluster.nodes[lead]
    host, g = node.host, node.host.group(3)
    assert not g.apply_queue and not g.snapshot_busy
    start = g.applied
    # Entries from another origin (no future to answer): checked synchronously, before
    # the apply task could run.
    g.apply_queue.extend(
        Entry(term=g.applied_term, index=start + i, type=EntryType.NORMAL,
              data=bytes(msgpack.packb([99, i, msgpack.packb([f"q{i}", "v"])])))
        for i in range(1, count + 1))
    host.applier.dispatch([g], inline=True)
    if inline:
        assert g.applied == start + count and not g.apply_queue
        assert node.sms[3].data[f"q{count}"] == "v"
        assert g not in host.applier.ready
    else:
        assert g.applied == start and len(g.apply_queue) == count
        assert g in host.applier.ready and host.applier.wake.is_set()
    # Not inline either when the turn writes: the task applies during the write.
    g.apply_queue.append(Entry(term=g.applied_term, index=g.applied + len(g.apply_queue) + 1))
    before = g.applied
    host.applier.dispatch([g], inline=False)
    assert g.applied == before and g in host.applier.ready


async def test_proposals_and_reads_from_every_node_with_direct_turns(cluster: Cluster) -> None:
    lead = await cluster.leader(2)
    expect: dict[str, str] = {}
    for i in range(30):
        via = (i % 3) + 1
        await cluster.put(via, 2, f"k{i % 7}", f"v{i}")
        expect[f"k{i % 7}"] = f"v{i}"
        await cluster.nodes[via].host.read_barrier(2, timeout=3.0)
        assert cluster.nodes[via].sms[2].data == expect
    turns_before = cluster.nodes[lead].host.turns
    await asyncio.gather(*(cluster.put((i % 3) + 1, 2, f"c{i}", "x") for i in range(40)))
    assert cluster.nodes[lead].host.turns > turns_before
    for n in cluster.nodes.values():
        await n.host.read_barrier(2, timeout=3.0)
        assert all(n.sms[2].data[f"c{i}"] == "x" for i in range(40))

