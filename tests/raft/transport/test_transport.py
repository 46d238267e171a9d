"""PeerTransport over real 127.0.0.1 sockets: batching, reconnects, bounds, bad input, snapshots."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgpack
import pytest

from accord.raft.core.types import ConfState, Entry, Message, MessageType, SnapshotMeta
from accord.raft.transport import codec
from accord.raft.transport.codec import Hello, SnapshotPiece
from accord.raft.transport.links import BytesSnapshotSource, PeerTransport, SnapshotSendError

CLUSTER = 0xACC0


@dataclass
class Inbox:
    messages: list[tuple[int, int, Message]] = field(default_factory=list)
    heartbeats: list[tuple[int, list[tuple[int, int, int]], list[tuple[int, int]]]] = field(default_factory=list)

    def on_messages(self, frm: int, batch: list[tuple[int, Message]]) -> None:
        self.messages.extend((frm, g, m) for g, m in batch)

    def on_heartbeats(self, frm: int, hbs: list[tuple[int, int, int]], resps: list[tuple[int, int]]) -> None:
        self.heartbeats.append((frm, hbs, resps))


async def until(pred: Callable[[], bool], what: str, limit: float = 5.0) -> None:
    """Poll ``pred`` until true; fail with ``what`` after ``limit`` seconds."""
    for _ in range(int(limit / 0.01)):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def make(node_id: int, inbox: Inbox, port: int = 0, **kw: object) -> PeerTransport:
    opts: dict[object, object] = dict(cluster_id=CLUSTER, backoff_min=0.01, backoff_max=0.1,
                                      keepalive_interval=5.0, io_timeout=2.0)
    opts.update(kw)
    return PeerTransport(node_id, "127.0.0.1", port, on_messages=inbox.on_messages,
                         on_heartbeats=inbox.on_heartbeats, **opts)  # type: ignore[arg-type]


@pytest.fixture
async def trio() -> AsyncIterator[tuple[list[PeerTransport], list[Inbox]]]:
    inboxes = [Inbox() for _ in range(3)]
    ts = [make(i + 1, inboxes[i]) for i in range(3)]
    try:
        for t in ts:
            await t.start()
        for t in ts:
            for u in ts:
                if u is not t:
                    t.set_peer(u.node_id, "127.0.0.1", u.listen_port)
        await until(lambda: all(t.connected(u.node_id) for t in ts for u in ts if u is not t), "links up")
        yield ts, inboxes
    finally:
        for t in ts:
            await t.stop()


def app(to: int, frm: int, i: int) -> Message:
    return Message(MessageType.APP, to=to, frm=frm, term=3, log_term=2, index=i, commit=i - 1,
                   entries=[Entry(3, i + 1, data=b"x" * (i % 7))])


async def test_batches_for_many_groups_share_one_frame(trio: tuple[list[PeerTransport], list[Inbox]]) -> None:
    ts, inboxes = trio
    sent: dict[int, list[tuple[int, int, Message]]] = {1: [], 2: [], 3: []}
    for t in ts:
        for u in ts:
            if u is t:
                continue
            for g in range(50):
                m = app(u.node_id, t.node_id, g + 10)
                t.send(u.node_id, g, m)
                sent[u.node_id].append((t.node_id, g, m))
        t.send_heartbeat(1 if t.node_id != 1 else 2, 7, 4, 9)
    for t in ts:
        t.flush()
        assert t.stats.frames_sent == 2  # one frame per destination for 100 messages
    await until(lambda: all(len(b.messages) == 100 for b in inboxes), "all messages")
    for i, box in enumerate(inboxes):
        assert sorted(box.messages, key=lambda x: (x[0], x[1])) == sorted(sent[i + 1], key=lambda x: (x[0], x[1]))
        assert ts[i].stats.frames_received == 2
    await until(lambda: len(inboxes[0].heartbeats) == 2, "heartbeats")
    assert sorted(inboxes[0].heartbeats) == [(2, [(7, 4, 9)], []), (3, [(7, 4, 9)], [])]
    ts[1].send_heartbeat_resp(3, 7, 4)
    ts[1].flush()
    await until(lambda: len(inboxes[2].heartbeats) == 1, "heartbeat response")
    assert inboxes[2].heartbeats == [(2, [], [(7, 4)])]


async def test_large_batch_is_split_below_max_frame() -> None:
    a_box, b_box = Inbox(), Inbox()
    b = make(2, b_box, max_frame_bytes=64 * 1024)
    await b.start()
    a = make(1, a_box, max_frame_bytes=64 * 1024)
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.connected(2), "link")
        big = Message(MessageType.APP, 2, 1, entries=[Entry(1, 1, data=b"y" * 20_000)])
        for g in range(10):
            a.send(2, g, big)
        a.send(2, 99, Message(MessageType.APP, 2, 1, entries=[Entry(1, 1, data=b"z" * 70_000)]))
        a.flush()
        assert a.stats.msgs_too_large == 1
        await until(lambda: len(b_box.messages) == 10, "split batch")
        assert a.stats.frames_sent >= 4
        assert b.stats.malformed_frames == 0
    finally:
        await a.stop()
        await b.stop()


async def test_reconnects_after_peer_restart() -> None:
    a_box, b_box = Inbox(), Inbox()
    a, b = make(1, a_box), make(2, b_box)
    await a.start()
    await b.start()
    port = b.listen_port
    b2: PeerTransport | None = None
    try:
        a.set_peer(2, "127.0.0.1", port)
        await until(lambda: a.connected(2), "first link")
        a.send(2, 1, app(2, 1, 1))
        a.flush()
        await until(lambda: len(b_box.messages) == 1, "first message")
        await b.stop()
        await until(lambda: not a.connected(2), "link noticed down")
        a.send(2, 1, app(2, 1, 2))  # no link: dropped and counted, not queued
        assert a.stats.msgs_dropped == 1
        b2_box = Inbox()
        b2 = make(2, b2_box, port=port)
        await b2.start()
        await until(lambda: a.connected(2), "link back", limit=8.0)
        a.send(2, 1, app(2, 1, 3))
        a.flush()
        await until(lambda: len(b2_box.messages) == 1, "message after restart")
        assert b2_box.messages[0][2].index == 3
        assert a.stats.connects == 2
    finally:
        await a.stop()
        await b.stop()
        if b2 is not None:
            await b2.stop()


async def _stalled_peer(node_id: int) -> tuple[asyncio.Server, list[asyncio.StreamWriter]]:
    """A fake peer that completes the handshake and then never reads."""
    conns: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = int.from_bytes(await reader.readexactly(4), "big")
        hello = codec.decode_hello(await reader.readexactly(n))
        reply = codec.encode_hello(Hello(codec.PROTOCOL_VERSION, node_id, CLUSTER, "raft", hello.node_id))
        writer.write(len(reply).to_bytes(4, "big") + reply)
        conns.append(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, conns


async def test_queue_bounds_drop_and_count_under_stalled_peer() -> None:
    server, conns = await _stalled_peer(2)
    a = make(1, Inbox(), max_queue_msgs=20, max_queue_bytes=256 * 1024)
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", server.sockets[0].getsockname()[1])
        await until(lambda: a.connected(2), "link to stalled peer")
        # message-count bound between flushes
        for i in range(30):
            a.send(2, i, app(2, 1, i))
        assert a.stats.msgs_dropped == 10
        a.flush()
        # byte bound: keep writing 32 KiB messages; the kernel buffers fill, then we drop
        payload = Message(MessageType.APP, 2, 1, entries=[Entry(1, 1, data=os.urandom(32 * 1024))])
        for _ in range(400):
            for g in range(10):
                a.send(2, g, payload)
            a.flush()
            await asyncio.sleep(0)
            assert a._peers[2].writer is not None
            assert a._peers[2].writer.transport.get_write_buffer_size() <= 256 * 1024
        assert a.stats.msgs_dropped > 1000
        assert a.connected(2)
    finally:
        await a.stop()
        for w in conns:
            w.close()
        server.close()
        await server.wait_closed()


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _hello(**kw: object) -> bytes:
    args: dict[str, object] = dict(protocol_version=codec.PROTOCOL_VERSION, node_id=9,
                                   cluster_id=CLUSTER, kind="raft", to_node=2)
    args.update(kw)
    return _frame(codec.encode_hello(Hello(**args)))  # type: ignore[arg-type]


BAD_INPUTS = {
    "random bytes": b"\xde\xad\xbe\xef" + os.urandom(60),
    "truncated header": b"\x00\x00",
    "truncated frame": b"\x00\x00\x01\x00" + b"\x93" * 10,
    "oversized length": b"\xff\xff\xff\xff" + b"\x00" * 16,
    "bad magic": _frame(msgpack.packb(["etcd", 1, 9, CLUSTER, "raft", 2])),
    "wrong cluster": _hello(cluster_id=CLUSTER + 1),
    "version mismatch": _hello(protocol_version=codec.PROTOCOL_VERSION + 1),
    "wrong target": _hello(to_node=3),
    "unknown kind": _hello(kind="gossip"),
    "wrong worker": _hello(worker=1),
    "malformed frame after handshake": _hello() + _frame(b"\xc1\xc1\xc1"),
    "bad message after handshake": _hello() + _frame(msgpack.packb([1, [[1, [200]]], [], []])),
}


async def test_bad_input_closes_that_connection_only() -> None:
    a_box, b_box = Inbox(), Inbox()
    b = make(2, b_box, max_frame_bytes=1 << 20)
    a = make(1, a_box)
    await b.start()
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.connected(2), "good link")
        for name, data in BAD_INPUTS.items():
            reader, writer = await asyncio.open_connection("127.0.0.1", b.listen_port)
            writer.write(data)
            if name.startswith("truncated"):
                writer.write_eof()
            rest = await asyncio.wait_for(reader.read(), 5.0)  # b closes: read() reaches EOF
            writer.close()
            if name in ("wrong cluster", "version mismatch", "wrong target", "unknown kind",
                        "wrong worker"):
                assert codec.decode_reject(rest[4:]) is not None, name
            # the node keeps serving its real peer
            a.send(2, 1, Message(MessageType.HEARTBEAT, 2, 1, term=1))
            a.flush()
            want = len(b_box.messages) + 1
            await until(lambda w=want: len(b_box.messages) == w, f"traffic after {name}")  # type: ignore[misc]
        assert b.stats.handshake_failures == 10  # every bad input before a completed handshake
        assert b.stats.malformed_frames == 2
        assert a.connected(2)
    finally:
        await a.stop()
        await b.stop()


async def test_dialer_logs_and_counts_rejected_handshake() -> None:
    b = make(2, Inbox())
    a = make(1, Inbox(), cluster_id=CLUSTER + 5)
    await b.start()
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.stats.handshake_failures >= 2, "rejections")
        assert not a.connected(2)
        assert b.stats.accepts == 0
    finally:
        await a.stop()
        await b.stop()


class IgnoresWorker(PeerTransport):
    """Broken variant: accepts a handshake from any worker index."""

    def _check_hello(self, h: Hello, *, expect_node: int, expect_kind: str | None) -> str:
        return super()._check_hello(Hello(h.protocol_version, h.node_id, h.cluster_id, h.kind,
                                          h.to_node, self.worker),
                                    expect_node=expect_node, expect_kind=expect_kind)


@pytest.mark.parametrize("broken", [False, True])
async def test_workers_link_only_to_the_same_worker_of_other_nodes(broken: bool) -> None:
    cls = IgnoresWorker if broken else PeerTransport
    boxes = [Inbox() for _ in range(3)]
    # node 2's worker 1 and worker 0 (other ports); node 1's worker 1 dials both.
    b1 = cls(2, "127.0.0.1", 0, on_messages=boxes[0].on_messages, cluster_id=CLUSTER, worker=1)
    b0 = cls(2, "127.0.0.1", 0, on_messages=boxes[1].on_messages, cluster_id=CLUSTER, worker=0)
    a1 = make(1, boxes[2], worker=1)
    wrong = cls(3, "127.0.0.1", 0, on_messages=Inbox().on_messages, cluster_id=CLUSTER, worker=1,
                backoff_min=0.01, backoff_max=0.1)
    for t in (b1, b0, a1, wrong):
        await t.start()
    try:
        a1.set_peer(2, "127.0.0.1", b1.listen_port - 1)  # node 2's peer port P; worker 1 is P+1
        await until(lambda: a1.connected(2), "worker 1 to worker 1")
        a1.send(2, 1, Message(MessageType.HEARTBEAT, 2, 1, term=1))
        a1.flush()
        await until(lambda: len(boxes[0].messages) == 1, "a message between workers 1")
        wrong.set_peer(2, "127.0.0.1", b0.listen_port - 1)  # dials b0's port: the wrong worker
        if broken:
            await until(lambda: wrong.connected(2), "the broken variant links across workers")
        else:
            await until(lambda: b0.stats.handshake_failures >= 2, "worker 1 refused by worker 0")
            assert not wrong.connected(2) and b0.stats.accepts == 0
    finally:
        for t in (b1, b0, a1, wrong):
            await t.stop()


class NoPortOffset(PeerTransport):
    """Broken variant: dials a peer's advertised port whatever this transport's worker."""

    def set_peer(self, node_id: int, host: str, port: int) -> None:
        super().set_peer(node_id, host, port - self.worker)


@pytest.mark.parametrize("broken", [False, True])
async def test_worker_k_dials_port_p_plus_k_of_its_peers(broken: bool) -> None:
    """A peer's advertised port P is its worker 0's; worker 2 of this node dials P + 2,
    where worker 2 of the peer listens (the broken variant dials P: worker 0, refused)."""
    cls = NoPortOffset if broken else PeerTransport
    boxes = [Inbox() for _ in range(3)]
    peer0 = PeerTransport(2, "127.0.0.1", 0, on_messages=boxes[0].on_messages, cluster_id=CLUSTER)
    await peer0.start()
    base = peer0.listen_port
    peer2 = PeerTransport(2, "127.0.0.1", base + 2, on_messages=boxes[1].on_messages,
                          cluster_id=CLUSTER, worker=2)
    me = cls(1, "127.0.0.1", 0, on_messages=boxes[2].on_messages, cluster_id=CLUSTER, worker=2,
             backoff_min=0.01, backoff_max=0.1)
    try:
        await peer2.start()
        await me.start()
        me.set_peer(2, "127.0.0.1", base)
        if broken:
            await until(lambda: peer0.stats.handshake_failures >= 1, "worker 0 refuses worker 2")
            assert not me.connected(2)
        else:
            await until(lambda: me.connected(2), "worker 2 links to the peer's worker 2")
            me.send(2, 1, Message(MessageType.HEARTBEAT, 2, 1, term=1))
            me.flush()
            await until(lambda: len(boxes[1].messages) == 1, "a message reaches worker 2")
            assert peer0.stats.accepts == 0
    finally:
        for t in (me, peer2, peer0):
            await t.stop()


class FlakySink:
    """A snapshot receiver in memory that fails once, mid-stream, like a dropped link."""

    def __init__(self, fail_at_piece: int) -> None:
        self.buf = bytearray()
        self.installed: bytes | None = None
        self.calls = 0
        self.fail_at = fail_at_piece
        self.probes: list[int] = []

    async def chunk(self, frm: int, p: SnapshotPiece) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionResetError("simulated failure")
        if not p.data and not p.done:
            self.probes.append(len(self.buf))
            return len(self.buf)
        if p.offset != len(self.buf):
            return len(self.buf)
        self.buf += p.data
        if p.done:
            self.installed = bytes(self.buf)
        return len(self.buf)


async def test_snapshot_stream_resumes_after_dropped_connection() -> None:
    sink = FlakySink(fail_at_piece=5)
    b = PeerTransport(2, "127.0.0.1", 0, on_messages=Inbox().on_messages, on_snapshot_chunk=sink.chunk,
                      cluster_id=CLUSTER, backoff_min=0.01, backoff_max=0.05)
    a = make(1, Inbox())
    await b.start()
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        data = os.urandom(10_000)
        meta = SnapshotMeta(100, 4, ConfState(voters=(1, 2)))
        done: list[bool] = []
        a.start_snapshot(2, 3, meta, BytesSnapshotSource(data), done.append, chunk_size=1000)
        # meanwhile the Raft link is unaffected
        await until(lambda: a.connected(2), "raft link")
        await until(lambda: done == [True], "snapshot delivered")
        assert sink.installed == data
        assert sink.probes == [0, 3000]  # the second connection resumed after 3 pieces
        assert a.stats.snapshot_retries == 1
        assert a.stats.snapshot_pieces_sent == 1 + 4 + 1 + 7  # probe, 3 ok + failed, probe, 7 more
    finally:
        await a.stop()
        await b.stop()


async def test_snapshot_to_node_without_receiver_fails_cleanly() -> None:
    b = make(2, Inbox())  # no on_snapshot_chunk
    a = make(1, Inbox())
    await b.start()
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        with pytest.raises(SnapshotSendError, match="does not accept snapshot"):
            await a.send_snapshot(2, 1, SnapshotMeta(1, 1), BytesSnapshotSource(b"abc"), max_attempts=2)
        with pytest.raises(SnapshotSendError, match="not a known peer"):
            await a.send_snapshot(7, 1, SnapshotMeta(1, 1), BytesSnapshotSource(b"abc"))
    finally:
        await a.stop()
        await b.stop()


async def test_stop_leaves_no_tasks_behind() -> None:
    before = asyncio.all_tasks()
    a, b = make(1, Inbox()), make(2, Inbox())
    await a.start()
    await b.start()
    a.set_peer(2, "127.0.0.1", b.listen_port)
    b.set_peer(1, "127.0.0.1", a.listen_port)
    a.set_peer(3, "127.0.0.1", 1)  # unreachable peer: its task keeps retrying
    await until(lambda: a.connected(2) and b.connected(1), "links")
    await a.stop()
    await b.stop()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()


async def test_keepalive_holds_idle_link_and_idle_timeout_drops_silent_ones() -> None:
    b_box = Inbox()
    b = make(2, b_box, idle_timeout=0.4, keepalive_interval=0.1)
    a = make(1, Inbox(), keepalive_interval=0.1)
    await b.start()
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.connected(2), "link")
        await asyncio.sleep(1.0)  # idle for longer than b's idle timeout
        assert a.connected(2) and a.stats.connects == 1  # keepalives kept it open
        assert b_box.messages == []  # keepalives are empty frames, not messages
        # a client that handshakes and then stays silent is dropped
        reader, writer = await asyncio.open_connection("127.0.0.1", b.listen_port)
        writer.write(_hello())
        assert await asyncio.wait_for(reader.read(), 5.0) != b""  # the reply, then EOF
        writer.close()
    finally:
        await a.stop()
        await b.stop()


async def test_handler_errors_do_not_break_the_link() -> None:
    calls: list[int] = []

    def bad_handler(frm: int, batch: list[tuple[int, Message]]) -> None:
        calls.append(len(batch))
        raise RuntimeError("host bug")

    b = PeerTransport(2, "127.0.0.1", 0, on_messages=bad_handler, cluster_id=CLUSTER)
    a = make(1, Inbox())
    await b.start()
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.connected(2), "link")
        for i in range(3):
            a.send(2, 1, app(2, 1, i + 1))
            a.flush()
            await until(lambda n=i + 1: len(calls) == n, "delivery")  # type: ignore[misc]
        assert a.stats.connects == 1 and b.stats.malformed_frames == 0
    finally:
        await a.stop()
        await b.stop()


async def test_peer_address_change_and_removal() -> None:
    b_box, c_box = Inbox(), Inbox()
    b, c = make(2, b_box), make(2, c_box)  # the same node id at two addresses (node 2 moved)
    a = make(1, Inbox())
    for t in (a, b, c):
        await t.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.connected(2), "link to old address")
        a.set_peer(2, "127.0.0.1", c.listen_port)
        await until(lambda: a.connected(2), "link to new address")
        a.send(2, 1, app(2, 1, 5))
        a.flush()
        await until(lambda: len(c_box.messages) == 1, "delivery at the new address")
        assert b_box.messages == []
        a.remove_peer(2)
        assert not a.connected(2)
        a.send(2, 1, app(2, 1, 6))
        assert a.stats.msgs_dropped == 1
    finally:
        for t in (a, b, c):
            await t.stop()


async def test_snapshot_resumes_after_receiver_restart() -> None:
    sink = FlakySink(fail_at_piece=0)
    gate = asyncio.Event()
    hold_at = 4  # the receiver stalls on its 4th call; then its transport is stopped

    async def stalling_chunk(frm: int, p: SnapshotPiece) -> int:
        if sink.calls + 1 == hold_at and not gate.is_set():
            gate.set()
            await asyncio.sleep(30)  # cancelled by b.stop()
        return await sink.chunk(frm, p)

    def receiver(port: int) -> PeerTransport:
        return PeerTransport(2, "127.0.0.1", port, on_messages=Inbox().on_messages,
                             on_snapshot_chunk=stalling_chunk, cluster_id=CLUSTER,
                             backoff_min=0.01, backoff_max=0.05)

    b = receiver(0)
    await b.start()
    port = b.listen_port
    a = make(1, Inbox(), backoff_min=0.05, backoff_max=0.2)
    await a.start()
    b2: PeerTransport | None = None
    try:
        a.set_peer(2, "127.0.0.1", port)
        data = os.urandom(6_000)
        done: list[bool] = []
        a.start_snapshot(2, 1, SnapshotMeta(7, 2), BytesSnapshotSource(data), done.append,
                         chunk_size=1000, max_attempts=20)
        await until(gate.is_set, "receiver stalled mid-stream")
        await b.stop()
        b2 = receiver(port)
        await b2.start()
        await until(lambda: done == [True], "snapshot delivered after restart", limit=10.0)
        assert sink.installed == data
        assert sink.probes[0] == 0 and sink.probes[-1] == 2000  # resumed, not restarted
    finally:
        await a.stop()
        await b.stop()
        if b2 is not None:
            await b2.stop()
