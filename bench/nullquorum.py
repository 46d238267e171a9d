"""The do-nothing quorum server: the floor of a replicated, durable write and of a
linearizable read for accord's front-end design on this machine.

Three of these run side by side. Each serves ``etcdserverpb.KV/Put`` and ``KV/Range``
with the front end of ``bench/nullserver.py`` (accord's server options, an interceptor
of the same shape, uvloop), and does for each request only what any replicated store
that keeps fsync off its event loop must do at the least, with no consensus, no log
format and no store:

* **Put**: hands the value to its own writer thread (``pwrite`` + ``fdatasync`` into a
  preallocated file, then a wake-up of the loop, as ``bench/wal.py``'s handoff floor)
  and sends it in one UDP datagram to each peer, whose writer thread does the same
  and whose loop answers with one datagram; the Put is answered once its own write
  and one peer's are durable (a majority of three).
* **Range** (a ReadIndex-style read): one UDP ping to each peer, answered as soon as
  one pong is back (a quorum confirms); nothing is read.

UDP is cheaper than the TCP links a real store needs (``--links tcp`` measures those
instead), and the writer does no group commit, so the figures are a floor for
1-concurrent load (``put:1``, ``get:1``), not a ceiling for concurrent load.

Usage: ``python bench/nullquorum.py --listen 127.0.0.1:PORT --peer-port PORT --peers
127.0.0.1:PORT,... --data-dir DIR [--links tcp]`` (stops on SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.proto import rpc_pb2  # noqa: E402
from bench.nullserver import front_end, parse_peers, rpc_pb2_grpc, serve_until_signal  # noqa: E402

FILE_BYTES = 64 << 20
"""Preallocated (written) log file; wraps around when full."""
_WRITE, _ACK, _PING, _PONG = b"W", b"A", b"P", b"Q"


class Writer:
    """A thread doing ``pwrite`` + ``fdatasync`` per job and waking the loop after each."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        chunk = bytes(1 << 20)
        for off in range(0, FILE_BYTES, len(chunk)):  # written zeros: in-place overwrites
            os.pwrite(self.fd, chunk, off)
        os.fsync(self.fd)
        self.offset = 0
        self.jobs: queue.SimpleQueue[tuple[bytes, int, Callable[[], None]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self.thread.start()

    def write(self, data: bytes, done: Callable[[], None]) -> None:
        """Make ``data`` durable, then call ``done`` on the loop."""
        if self.offset + len(data) > FILE_BYTES:
            self.offset = 0
        self.jobs.put((data, self.offset, done))
        self.offset += len(data)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            data, off, done = job
            os.pwrite(self.fd, data, off)
            os.fdatasync(self.fd)
            self.loop.call_soon_threadsafe(done)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        os.close(self.fd)


class Quorum(asyncio.DatagramProtocol):
    """The peer side of the messages, and the waits of this member's requests.

    Messages travel as UDP datagrams, or with ``--links tcp`` as length-prefixed frames
    on one TCP connection per peer (what a real store's ordered, reliable links cost).
    """

    def __init__(self, writer: Writer, peers: tuple[tuple[str, int], ...]) -> None:
        self.writer = writer
        self.peers = peers
        self.udp: asyncio.DatagramTransport | None = None
        self.links: list[_Link] = []
        """Outbound TCP links (``--links tcp``)."""
        self.waits: dict[bytes, asyncio.Future[None]] = {}
        self.ids = itertools.count()

    def connection_made(self, transport: Any) -> None:
        self.udp = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.handle(data, lambda msg: self.udp.sendto(msg, addr))  # type: ignore[union-attr]

    def handle(self, data: bytes, reply: Callable[[bytes], None]) -> None:
        """One message from a peer; ``reply`` answers on the way it came."""
        kind, rid = data[:1], data[1:9]
        if kind == _WRITE:
            self.writer.write(data[9:], lambda: reply(_ACK + rid))
        elif kind == _PING:
            reply(_PONG + rid)
        else:  # an ack or a pong: the first one completes the request's quorum
            fut = self.waits.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _ask(self, kind: bytes, payload: bytes = b"") -> asyncio.Future[None]:
        rid = next(self.ids).to_bytes(8, "big")
        fut = asyncio.get_running_loop().create_future()
        self.waits[rid] = fut
        msg = kind + rid + payload
        if self.links:
            for link in self.links:
                link.send(msg)
        else:
            assert self.udp is not None
            for peer in self.peers:
                self.udp.sendto(msg, peer)
        return fut

    async def connect(self) -> None:
        """Dial every peer over TCP (retrying while they start)."""
        loop = asyncio.get_running_loop()
        for host, port in self.peers:
            while True:
                try:
                    _, link = await loop.create_connection(lambda: _Link(self), host, port)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            self.links.append(link)


    async def replicate(self, data: bytes) -> None:
        """Durable here and on one peer."""
        loop = asyncio.get_running_loop()
        own: asyncio.Future[None] = loop.create_future()
        peer = self._ask(_WRITE, data)
        self.writer.write(data, lambda: own.set_result(None))
        await asyncio.wait_for(asyncio.gather(own, peer), 5.0)

    async def confirm(self) -> None:
        """One round trip to a quorum."""
        await asyncio.wait_for(self._ask(_PING), 5.0)


class _Link(asyncio.Protocol):
    """A TCP connection carrying ``len (4 bytes) | message`` frames either way."""

    def __init__(self, quorum: Quorum) -> None:
        self.quorum = quorum
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, msg: bytes) -> None:
        assert self.transport is not None
        self.transport.write(len(msg).to_bytes(4, "big") + msg)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        while len(buf) - pos >= 4:
            n = int.from_bytes(buf[pos:pos + 4], "big")
            if len(buf) - pos - 4 < n:
                break
            self.quorum.handle(buf[pos + 4:pos + 4 + n], self.send)
            pos += 4 + n
        self.buf = buf[pos:]


class QuorumKV(rpc_pb2_grpc.KVServicer):  # type: ignore[misc]
    """Put: replicated and durable on a majority, then answered. Range: a quorum round."""

    def __init__(self, quorum: Quorum) -> None:
        self.quorum = quorum
        self.count = 0

    async def Put(self, request: rpc_pb2.PutRequest, context: Any) -> rpc_pb2.PutResponse:
        await self.quorum.replicate(request.key + request.value)
        self.count += 1
        return rpc_pb2.PutResponse(header=rpc_pb2.ResponseHeader(revision=self.count))

    async def Range(self, request: rpc_pb2.RangeRequest, context: Any) -> rpc_pb2.RangeResponse:
        await self.quorum.confirm()
        return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=self.count))


async def serve(listen: str, port: int, peers: tuple[tuple[str, int], ...], data_dir: Path,
                tcp: bool) -> None:
    """Serve until SIGINT/SIGTERM."""
    loop = asyncio.get_running_loop()
    writer = Writer(data_dir / "log", loop)
    quorum = Quorum(writer, peers)
    host = listen.rpartition(":")[0]
    dialing = None
    if tcp:
        await loop.create_server(lambda: _Link(quorum), host, port)
        dialing = asyncio.create_task(quorum.connect())
    else:
        await loop.create_datagram_endpoint(lambda: quorum, local_addr=(host, port))
    server = front_end()
    rpc_pb2_grpc.add_KVServicer_to_server(QuorumKV(quorum), server)
    try:
        await serve_until_signal(server, listen)
    finally:
        if dialing is not None:
            dialing.cancel()
        writer.close()


def main() -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="host:port (gRPC)")
    p.add_argument("--peer-port", type=int, required=True, help="port for the peers' messages")
    p.add_argument("--peers", required=True, help="host:port,... the peers' --peer-port addresses")
    p.add_argument("--links", choices=("udp", "tcp"), default="udp",
                   help="datagrams (the floor), or one TCP connection per peer")
    p.add_argument("--data-dir", required=True, type=Path)
    args = p.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    peers = parse_peers(args.peers)
    import uvloop

    uvloop.run(serve(args.listen, args.peer_port, peers, args.data_dir, args.links == "tcp"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
