"""Node-to-node links: asyncio TCP carrying batched Raft messages and snapshot streams.

Usage (the Multi-Raft host owns one ``PeerTransport`` per node)::

    t = PeerTransport(node_id, "127.0.0.1", 2380, cluster_id=cid,
                      on_messages=host.deliver, on_heartbeats=host.deliver_heartbeats,
                      on_snapshot_chunk=receiver.chunk)
    await t.start()
    t.set_peer(2, "10.0.0.2", 2380)
    t.send(2, group_id, msg)           # enqueue only: O(1), never blocks
    t.send_heartbeat(2, group_id, term, commit)
    t.flush()                          # once per event-loop turn: one write per peer
    t.start_snapshot(2, group_id, meta, BytesSnapshotSource(data), on_done)
    await t.stop()

Wire protocol (see ``codec.py`` for the payloads). Every connection starts with a
handshake: the dialer sends ``Hello(protocol_version, node_id, cluster_id, kind,
to_node, worker)`` as one frame; the acceptor checks magic, version, cluster and that it
is the node (and, in a node of several workers, the worker) meant, then answers with its own ``Hello`` or with a reject frame
naming the reason, and closes. A frame is a 4-byte big-endian length followed by
that many bytes of msgpack; a length above ``max_frame_bytes``, bytes that do not
decode, or a handshake that fails all close that one connection, log the reason
and bump a counter in ``stats``; no exception reaches the event loop.

Connections are one-way for Raft traffic: each node dials every peer and writes
frames on that connection; what it receives arrives on connections its peers
dialed. An outbound connection is kept by one task per peer that reconnects with
exponential backoff and jitter, and writes an empty keepalive frame when idle so
that the acceptor's idle timeout detects dead links.

Lost peers: when an outbound link that was up closes (the peer's process died:
its kernel sent FIN or RST) and the first redial fails too, the transport calls
every ``add_peer_lost_listener`` callback with the peer's id, once per loss. The
host uses it to elect a new leader without waiting out an election timeout. A
redial that succeeds (a blip, a quick restart) reports nothing. The peer's own
link to this node closing counts too when the outbound link is down at that
moment (still in its reconnect backoff, e.g. after the peer restarted): the
outbound link redials at once, and reports the peer lost if that fails.

Back-pressure: ``send`` drops (and counts in ``stats.msgs_dropped``) rather than
queue without bound: when the peer is not connected, when ``max_queue_msgs``
messages are already waiting for the next ``flush``, or when the socket's unsent
buffer would exceed ``max_queue_bytes`` (a stalled peer). Raft retransmits.

Snapshots travel on connections of their own (``kind="snapshot"``) so a large
transfer never delays heartbeats; ``snapstream.py`` holds that protocol (resumable
CRC-checked pieces, acked by offset). ``send_snapshot`` redials and resumes after
a dropped connection, up to ``max_attempts`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from accord.raft.core.types import Message, SnapshotMeta
from accord.raft.transport import codec, snapstream
from accord.raft.transport import tls as peertls
from accord.raft.transport.codec import (
    PROTOCOL_VERSION,
    CodecError,
    Heartbeat,
    HeartbeatResp,
    Hello,
)
from accord.raft.transport.framing import (
    FrameError,
    FrameReceiver,
    close_writer,
    frame,
    read_frame,
    take_buffered,
    within,
)
from accord.raft.transport.snapstream import (
    BytesSnapshotSource,
    OnSnapshotChunk,
    SnapshotSendError,
    SnapshotSource,
)
from accord.raft.transport.tls import PeerTLS, TLSRefused

__all__ = [
    "BytesSnapshotSource",
    "OnHeartbeats",
    "OnMessages",
    "OnSnapshotChunk",
    "PeerTLS",
    "PeerTransport",
    "SnapshotSendError",
    "SnapshotSource",
    "TransportStats",
]

log = logging.getLogger("accord.raft.transport.links")

OnMessages = Callable[[int, list[tuple[int, Message]]], None]
"""``(from_node, [(group_id, message), ...])`` for each received frame."""
OnHeartbeats = Callable[[int, list[Heartbeat], list[HeartbeatResp]], None]
"""``(from_node, heartbeats, heartbeat_resps)`` for a frame that carried a bundle."""
_HELLO_MAX = 4096


@dataclass(slots=True)
class TransportStats:
    """Counters for tests and metrics (monotonic since the transport was made)."""

    frames_sent: int = 0
    frames_received: int = 0
    msgs_sent: int = 0
    msgs_received: int = 0
    msgs_dropped: int = 0
    """Messages (and heartbeat bundle entries) dropped: no connection, queue full, peer stalled."""
    msgs_too_large: int = 0
    malformed_frames: int = 0
    """Inbound connections closed for a bad length, undecodable or truncated frame."""
    handshake_failures: int = 0
    connects: int = 0
    """Outbound Raft connections established."""
    accepts: int = 0
    """Inbound connections that passed the handshake."""
    snapshot_pieces_sent: int = 0
    snapshot_pieces_received: int = 0
    snapshot_retries: int = 0
    peers_lost: int = 0
    """Links that closed and could not be redialed (reported to peer-lost listeners)."""
    tls_refused: int = 0
    """Inbound connections refused in the TLS handshake (no or an untrusted certificate)."""


@dataclass(slots=True)
class _Peer:
    node_id: int
    host: str
    port: int
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    pending: list[bytes] = field(default_factory=list)
    pending_bytes: int = 0
    heartbeats: list[Heartbeat] = field(default_factory=list)
    heartbeat_resps: list[HeartbeatResp] = field(default_factory=list)
    last_write: float = 0.0
    armed: bool = False
    """A failed dial reports the peer lost (set while the link is up, and when the
    peer's inbound link closes while this one is down)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Cuts the reconnect backoff short."""


class PeerTransport:
    """Batched, bounded, reconnecting TCP links to the other nodes of a cluster."""

    def __init__(
        self,
        node_id: int,
        listen_host: str,
        listen_port: int,
        *,
        on_messages: OnMessages,
        on_heartbeats: OnHeartbeats | None = None,
        on_snapshot_chunk: OnSnapshotChunk | None = None,
        cluster_id: int = 0,
        max_queue_msgs: int = 4096,
        max_queue_bytes: int = 64 << 20,
        max_frame_bytes: int = 64 << 20,
        connect_timeout: float = 2.0,
        io_timeout: float = 10.0,
        keepalive_interval: float = 2.0,
        idle_timeout: float = 10.0,
        backoff_min: float = 0.05,
        backoff_max: float = 2.0,
        tls: PeerTLS | None = None,
        worker: int = 0,
    ) -> None:
        """Make a transport; nothing happens on the network until ``start``.

        ``max_queue_msgs`` bounds messages waiting for the next ``flush`` per peer;
        ``max_queue_bytes`` bounds a peer's unsent socket buffer; ``max_frame_bytes``
        bounds one frame both ways (batches are split below it; larger inbound
        frames close the connection). ``idle_timeout`` closes an inbound connection
        that sent nothing (not even a keepalive) for that long. ``tls`` puts every
        connection, both ways, under mutual TLS (see ``tls.py``); without it the
        links are plaintext. ``worker`` is this transport's worker index in a node of
        several workers: handshakes from or to another index are refused.
        """
        if node_id <= 0:
            raise ValueError(f"node_id must be > 0, got {node_id}")
        if idle_timeout <= keepalive_interval:
            raise ValueError(f"idle_timeout ({idle_timeout}s) must exceed keepalive_interval "
                             f"({keepalive_interval}s), or idle links would be dropped")
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.worker = worker
        self.stats = TransportStats()
        self._host = listen_host
        self._port = listen_port
        self._on_messages = on_messages
        self._on_heartbeats = on_heartbeats
        self._on_snapshot_chunk = on_snapshot_chunk
        self._max_queue_msgs = max_queue_msgs
        self._max_queue_bytes = max_queue_bytes
        self._max_frame = max_frame_bytes
        self._connect_timeout = connect_timeout
        self._io_timeout = io_timeout
        self._keepalive = keepalive_interval
        self._idle_timeout = idle_timeout
        self._backoff_min = backoff_min
        self._backoff_max = backoff_max
        self._tls = tls
        self._rng = random.Random()
        self._peers: dict[int, _Peer] = {}
        self._dirty: set[int] = set()
        self._server: asyncio.Server | peertls.TLSListener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._peer_lost_listeners: list[Callable[[int], None]] = []

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Listen for peers and start dialing every peer known so far."""
        if self._tls is None:
            self._server = await asyncio.start_server(self._accept, self._host, self._port)
        else:
            self._server = peertls.TLSListener(self._host, self._port, self._tls,
                                               self._accept, self._tls_refused)
        for peer in self._peers.values():
            self._spawn_peer(peer)

    @property
    def listen_port(self) -> int:
        """The port actually listened on (useful when constructed with port 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, close every connection, cancel and await every task."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        tasks = set(self._tasks)
        for peer in self._peers.values():
            if peer.task is not None:
                tasks.add(peer.task)
            close_writer(peer.writer)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await within(self._server.wait_closed(), 2.0)
            self._server = None

    # -- peers ---------------------------------------------------------------

    def set_peer(self, node_id: int, host: str, port: int) -> None:
        """Add a peer or change its address (the link reconnects).

        ``port`` is the peer's advertised peer port ``P``; a transport of worker ``k``
        dials ``P + k``, worker ``k`` of that node (``docs/workers.md``)."""
        if node_id == self.node_id or node_id <= 0:
            raise ValueError(f"invalid peer id {node_id} (self is {self.node_id})")
        port += self.worker
        old = self._peers.get(node_id)
        if old is not None:
            if (old.host, old.port) == (host, port):
                return
            self.remove_peer(node_id)
        peer = _Peer(node_id, host, port)
        self._peers[node_id] = peer
        if self._server is not None and not self._stopping:
            self._spawn_peer(peer)

    def remove_peer(self, node_id: int) -> None:
        """Forget a peer: close its link and drop what was queued for it."""
        peer = self._peers.pop(node_id, None)
        self._dirty.discard(node_id)
        if peer is None:
            return
        close_writer(peer.writer)
        if peer.task is not None:
            peer.task.cancel()
            self._tasks.add(peer.task)  # still awaited by stop()
            peer.task.add_done_callback(self._tasks.discard)

    def add_peer_lost_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(node_id)`` when the link to a peer closed and a redial failed."""
        self._peer_lost_listeners.append(listener)

    def _report_lost(self, node_id: int) -> None:
        if self._stopping or node_id not in self._peers:
            return
        self.stats.peers_lost += 1
        log.info("link to node %d closed and a redial failed: reporting it lost", node_id)
        for listener in self._peer_lost_listeners:
            try:
                listener(node_id)
            except Exception:
                log.exception("peer-lost listener failed for node %d", node_id)

    def connected(self, node_id: int) -> bool:
        """Whether the outbound link to ``node_id`` is up."""
        peer = self._peers.get(node_id)
        return peer is not None and peer.writer is not None and not peer.writer.is_closing()

    def has_room(self, node_id: int) -> bool:
        """Whether a message for ``node_id`` queued now would go out: the link is up, its
        queue is not full and its socket's unsent buffer is below ``max_queue_bytes``
        (else ``send`` or the next ``flush`` drops the message, counted)."""
        peer = self._peers.get(node_id)
        return (self.connected(node_id) and not self._stopping
                and peer is not None and peer.writer is not None and not self._full(peer)
                and peer.writer.transport.get_write_buffer_size() < self._max_queue_bytes)

    # -- sending -------------------------------------------------------------

    def _full(self, peer: _Peer) -> bool:
        return (len(peer.pending) + len(peer.heartbeats) + len(peer.heartbeat_resps)
                >= self._max_queue_msgs)

    def _queue(self, to_node: int) -> _Peer | None:
        peer = self._peers.get(to_node)
        if peer is None or peer.writer is None or self._stopping or self._full(peer):
            self.stats.msgs_dropped += 1
            return None
        self._dirty.add(to_node)
        return peer

    def send(self, to_node: int, group_id: int, msg: Message) -> None:
        """Queue ``msg`` of ``group_id`` for ``to_node`` until the next ``flush``.

        Never blocks; drops (counted) when the link is down or its queue is full.
        On the wire ``msg.to``/``msg.frm`` are implied by the link: the receiver
        sees ``to`` = itself and ``frm`` = this node.
        """
        peer = self._queue(to_node)
        if peer is None:
            return
        packed = codec.pack_routed(group_id, msg)
        if len(packed) + 64 > self._max_frame:
            self.stats.msgs_too_large += 1
            log.warning("dropping a %s message of %d bytes for node %d: above max_frame_bytes=%d",
                        msg.type.name, len(packed), to_node, self._max_frame)
            return
        peer.pending.append(packed)
        peer.pending_bytes += len(packed)

    def send_heartbeat(self, to_node: int, group_id: int, term: int, commit: int) -> None:
        """Queue one entry of the coalesced heartbeat bundle for ``to_node``."""
        peer = self._queue(to_node)
        if peer is not None:
            peer.heartbeats.append((group_id, term, commit))

    def send_heartbeat_resp(self, to_node: int, group_id: int, term: int) -> None:
        """Queue one entry of the coalesced heartbeat-response bundle for ``to_node``."""
        peer = self._queue(to_node)
        if peer is not None:
            peer.heartbeat_resps.append((group_id, term))

    def flush(self) -> None:
        """Write everything queued: one write (of one or more frames) per peer."""
        dirty, self._dirty = self._dirty, set()
        for node_id in dirty:
            peer = self._peers.get(node_id)
            if peer is not None:
                self._flush_peer(peer)

    def _flush_peer(self, peer: _Peer) -> None:
        msgs, hbs, hbrs = peer.pending, peer.heartbeats, peer.heartbeat_resps
        count = len(msgs) + len(hbs) + len(hbrs)
        peer.pending, peer.heartbeats, peer.heartbeat_resps = [], [], []
        peer.pending_bytes = 0
        writer = peer.writer
        if writer is None or writer.is_closing():
            self.stats.msgs_dropped += count
            return
        frames: list[bytes] = []
        batch: list[bytes] = []
        size = 0
        # A bundle entry packs to at most 28 bytes (an array of three u64).
        budget = self._max_frame - 64 - 28 * (len(hbs) + len(hbrs))
        for packed in msgs:
            if batch and size + len(packed) > budget:
                frames.append(frame(codec.assemble_frame(batch)))
                batch, size = [], 0
            batch.append(packed)
            size += len(packed)
        frames.append(frame(codec.assemble_frame(batch, hbs, hbrs)))
        data = b"".join(frames)
        if writer.transport.get_write_buffer_size() + len(data) > self._max_queue_bytes:
            self.stats.msgs_dropped += count
            return
        writer.write(data)
        peer.last_write = time.monotonic()
        self.stats.frames_sent += len(frames)
        self.stats.msgs_sent += count

    # -- outbound links ------------------------------------------------------

    def _spawn_peer(self, peer: _Peer) -> None:
        peer.task = asyncio.create_task(self._run_peer(peer), name=f"raft-link-{peer.node_id}")

    async def _backoff(self, delay: float, peer: _Peer | None = None) -> float:
        pause = delay * self._rng.uniform(0.5, 1.0)
        if peer is None:
            await asyncio.sleep(pause)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(peer.wake.wait(), pause)
            peer.wake.clear()
        return min(delay * 2, self._backoff_max)

    async def _dial(self, peer: _Peer, kind: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to ``peer`` and complete the handshake; raises OSError/TimeoutError/FrameError."""
        if self._tls is None:
            reader, writer = await within(
                asyncio.open_connection(peer.host, peer.port), self._connect_timeout)
        else:
            reader, writer = await peertls.dial(peer.host, peer.port, self._tls,
                                                self._connect_timeout)
        try:
            hello = Hello(PROTOCOL_VERSION, self.node_id, self.cluster_id, kind, peer.node_id,
                          self.worker)
            writer.write(frame(codec.encode_hello(hello)))
            try:
                payload = await read_frame(reader, _HELLO_MAX, self._io_timeout)
            except EOFError as exc:
                raise FrameError("peer closed the connection during the handshake") from exc
            except ssl.SSLError as exc:  # TLS 1.3: the acceptor refused our certificate
                raise TLSRefused(f"the peer refused the TLS session: "
                                 f"{peertls.describe(exc)}") from exc
            reason = codec.decode_reject(payload)
            if reason is not None:
                raise FrameError(f"peer refused the handshake: {reason}")
            try:
                theirs = codec.decode_hello(payload)
            except CodecError as exc:
                raise FrameError(str(exc)) from exc
            problem = self._check_hello(theirs, expect_node=peer.node_id, expect_kind=kind)
            if problem:
                raise FrameError(problem)
        except BaseException:
            close_writer(writer)
            raise
        return reader, writer

    async def _run_peer(self, peer: _Peer) -> None:
        delay = self._backoff_min
        while not self._stopping and self._peers.get(peer.node_id) is peer:
            try:
                reader, writer = await self._dial(peer, "raft")
            except FrameError as exc:
                self.stats.handshake_failures += 1
                log.warning("link to node %d (%s:%d): %s", peer.node_id, peer.host, peer.port, exc)
                delay = await self._backoff(delay, peer)
                continue
            except (OSError, TimeoutError) as exc:
                log.debug("link to node %d (%s:%d) failed: %r", peer.node_id, peer.host, peer.port, exc)
                if peer.armed:
                    peer.armed = False
                    self._report_lost(peer.node_id)
                delay = await self._backoff(delay, peer)
                continue
            except Exception:
                log.exception("link to node %d: unexpected error while connecting", peer.node_id)
                delay = await self._backoff(delay, peer)
                continue
            self.stats.connects += 1
            if self._tls is None:
                log.info("link to node %d (%s:%d) up", peer.node_id, peer.host, peer.port)
            else:
                log.info("link to node %d (%s:%d) up (TLS, peer certificate CN=%s)", peer.node_id,
                         peer.host, peer.port, peertls.peer_name(writer))
            peer.writer, peer.last_write = writer, time.monotonic()
            delay = self._backoff_min
            peer.armed = True  # from now on, a close followed by a failed redial is a loss
            try:
                await self._hold(peer, reader, writer)
            except (OSError, TimeoutError) as exc:
                log.info("link to node %d lost: %r", peer.node_id, exc)
            except Exception:
                log.exception("link to node %d failed unexpectedly", peer.node_id)
            finally:
                peer.writer = None
                close_writer(writer)
            delay = await self._backoff(delay, peer)

    async def _hold(self, peer: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Keep an outbound link alive until the peer closes it."""
        keepalive = frame(codec.assemble_frame([]))
        while not writer.is_closing():
            try:
                data = await within(reader.read(1), self._keepalive / 2)
            except TimeoutError:
                if time.monotonic() - peer.last_write >= self._keepalive:
                    writer.write(keepalive)
                    peer.last_write = time.monotonic()
                continue
            if not data:
                log.info("link to node %d closed by the peer", peer.node_id)
            else:
                log.warning("link to node %d: peer sent data on a one-way link; closing", peer.node_id)
            return

    # -- inbound links -------------------------------------------------------

    def _check_hello(self, h: Hello, *, expect_node: int, expect_kind: str | None) -> str:
        """Why a handshake is unacceptable, or "" if it is fine."""
        if h.protocol_version != PROTOCOL_VERSION:
            return f"protocol version mismatch: peer speaks {h.protocol_version}, this node {PROTOCOL_VERSION}"
        if h.cluster_id != self.cluster_id:
            return f"wrong cluster: peer is in cluster {h.cluster_id:x}, this node in {self.cluster_id:x}"
        if h.node_id == 0 or h.node_id == self.node_id:
            return f"invalid peer node id {h.node_id}"
        if expect_node and h.node_id != expect_node:
            return f"reached node {h.node_id}, expected node {expect_node}"
        if h.to_node not in (0, self.node_id):
            return f"connection meant for node {h.to_node}, this is node {self.node_id}"
        if h.worker != self.worker:
            return (f"worker mismatch: peer is worker {h.worker}, this is worker {self.worker} "
                    f"(a node's worker k only links to worker k of the others)")
        if expect_kind is not None and h.kind != expect_kind:
            return f"unexpected connection kind {h.kind!r}"
        if h.kind not in ("raft", "snapshot"):
            return f"unknown connection kind {h.kind!r}"
        return ""

    def _tls_refused(self, addr: object, reason: str) -> None:
        self.stats.tls_refused += 1
        log.warning("refused a peer connection from %s: %s", addr, reason)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback that spawns a task this transport owns (and awaits in stop()).
        if self._stopping:
            close_writer(writer)
            return
        task = asyncio.create_task(self._serve(reader, writer), name="raft-inbound")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        addr = writer.get_extra_info("peername")
        stage = "handshake"
        try:
            if self._tls is not None:
                log.info("TLS peer connection from %s (certificate CN=%s)", addr,
                         peertls.peer_name(writer))
            payload = await read_frame(reader, _HELLO_MAX, self._io_timeout)
            try:
                hello = codec.decode_hello(payload)
            except CodecError as exc:
                raise FrameError(str(exc)) from exc
            problem = self._check_hello(hello, expect_node=0, expect_kind=None)
            if not problem and hello.kind == "snapshot" and self._on_snapshot_chunk is None:
                problem = "this node does not accept snapshot streams"
            if problem:
                writer.write(frame(codec.encode_reject(problem)))
                raise FrameError(problem)
            reply = Hello(PROTOCOL_VERSION, self.node_id, self.cluster_id, hello.kind, hello.node_id,
                          self.worker)
            writer.write(frame(codec.encode_hello(reply)))
            self.stats.accepts += 1
            stage = "frames"
            if hello.kind == "raft":
                await self._serve_raft(hello.node_id, reader, writer)
            else:
                await self._serve_snapshot(hello.node_id, reader, writer)
        except FrameError as exc:
            if stage == "handshake":
                self.stats.handshake_failures += 1
            else:
                self.stats.malformed_frames += 1
            log.warning("closing connection from %s: %s", addr, exc)
        except EOFError:
            log.debug("connection from %s closed", addr)
        except TimeoutError:
            log.info("closing connection from %s: idle for %.1fs during %s", addr, self._idle_timeout, stage)
        except OSError as exc:
            log.info("connection from %s failed: %r", addr, exc)
        except Exception:
            log.exception("closing connection from %s after an unexpected error", addr)
        finally:
            close_writer(writer)

    async def _serve_raft(self, frm: int, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        # After the handshake the connection leaves the stream: a FrameReceiver hands
        # each frame to the host from data_received, so a message reaches the core in
        # the loop iteration that read it (no reader task to wake, no stream buffer).
        def on_frame(payload: bytes) -> None:
            self._on_raft_frame(frm, payload)

        receiver = FrameReceiver(on_frame, self._max_frame, self._idle_timeout)
        receiver.attach(writer.transport, take_buffered(reader), eof=reader.at_eof())
        try:
            await receiver.closed()
        except TimeoutError:
            raise  # silent, not closed: the idle timeout is the keepalive's business
        except (EOFError, OSError):
            self._inbound_closed(frm)
            raise
        finally:
            receiver.detach()

    def _inbound_closed(self, node_id: int) -> None:
        """``node_id``'s link to us closed: if ours to it is down, redial now (and report
        the peer lost if that fails); if ours is up, it notices a dead peer by itself."""
        peer = self._peers.get(node_id)
        if peer is None or self._stopping or self.connected(node_id):
            return
        peer.armed = True
        peer.wake.set()

    def _on_raft_frame(self, frm: int, payload: bytes) -> None:
        """Decode one inbound frame and hand it to the host; ``FrameError`` if malformed."""
        try:
            got = codec.decode_frame(payload, to=self.node_id, frm=frm, max_len=self._max_frame)
        except CodecError as exc:
            raise FrameError(f"malformed frame from node {frm}: {exc}") from exc
        stats = self.stats
        stats.frames_received += 1
        stats.msgs_received += len(got.messages) + len(got.heartbeats) + len(got.heartbeat_resps)
        try:
            if got.messages:
                self._on_messages(frm, got.messages)
            if (got.heartbeats or got.heartbeat_resps) and self._on_heartbeats is not None:
                self._on_heartbeats(frm, got.heartbeats, got.heartbeat_resps)
        except Exception:
            log.exception("message handler failed on a frame from node %d", frm)

    # -- snapshot streams ----------------------------------------------------

    async def _serve_snapshot(self, frm: int, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        assert self._on_snapshot_chunk is not None  # checked by the handshake

        def count() -> None:
            self.stats.snapshot_pieces_received += 1

        await snapstream.receive(frm, reader, writer, self._on_snapshot_chunk,
                                 max_frame=self._max_frame, idle_timeout=self._idle_timeout,
                                 io_timeout=self._io_timeout, on_piece=count)

    def start_snapshot(self, to_node: int, group_id: int, meta: SnapshotMeta,
                       source: SnapshotSource, on_done: Callable[[bool], None], *,
                       chunk_size: int = 1 << 20, max_attempts: int = 5) -> None:
        """Send a snapshot in the background; ``on_done(ok)`` is called when it ends.

        The task is owned by the transport (``stop`` cancels it; ``on_done`` is not
        called then). Suits ``RaftCore.report_snapshot``. Does nothing once ``stop``
        has begun.
        """
        if self._stopping:
            return

        async def run() -> None:
            try:
                await self.send_snapshot(to_node, group_id, meta, source,
                                         chunk_size=chunk_size, max_attempts=max_attempts)
            except SnapshotSendError as exc:
                log.warning("snapshot of group %d for node %d failed: %s", group_id, to_node, exc)
                ok = False
            except Exception:
                log.exception("snapshot of group %d for node %d failed", group_id, to_node)
                ok = False
            else:
                ok = True
            try:
                on_done(ok)
            except Exception:
                log.exception("snapshot completion callback failed (group %d)", group_id)

        task = asyncio.create_task(run(), name=f"snapshot-{group_id}-to-{to_node}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def send_snapshot(self, to_node: int, group_id: int, meta: SnapshotMeta,
                            source: SnapshotSource, *, chunk_size: int = 1 << 20,
                            max_attempts: int = 5) -> None:
        """Stream a snapshot to ``to_node``, resuming after dropped connections.

        Returns once the receiver reported it complete; raises ``SnapshotSendError``
        after ``max_attempts`` connections failed.
        """
        if chunk_size <= 0 or chunk_size + 1024 > self._max_frame:
            raise ValueError(f"chunk_size must be in 1..{self._max_frame - 1024}, got {chunk_size}")
        peer = self._peers.get(to_node)
        if peer is None:
            raise SnapshotSendError(f"node {to_node} is not a known peer")
        delay = self._backoff_min
        for attempt in range(1, max_attempts + 1):
            try:
                await self._stream_snapshot(peer, group_id, meta, source, chunk_size)
                return
            except (OSError, TimeoutError, EOFError, FrameError, CodecError) as exc:
                self.stats.snapshot_retries += 1
                log.info("snapshot of group %d to node %d, attempt %d: %r",
                         group_id, to_node, attempt, exc)
                if attempt == max_attempts:
                    raise SnapshotSendError(
                        f"gave up after {max_attempts} attempts; last error: {exc!r}") from exc
                delay = await self._backoff(delay)

    async def _stream_snapshot(self, peer: _Peer, group_id: int, meta: SnapshotMeta,
                               source: SnapshotSource, chunk_size: int) -> None:
        def count() -> None:
            self.stats.snapshot_pieces_sent += 1

        reader, writer = await self._dial(peer, "snapshot")
        try:
            await snapstream.push(reader, writer, group_id, meta, source, chunk_size=chunk_size,
                                  io_timeout=self._io_timeout, on_piece=count)
        finally:
            close_writer(writer)
