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

UDP is cheaper than the TCP links a real store needs, and the writer does no group
commit, so the figures are a floor for 1-concurrent load (``put:1``, ``get:1``), not a
ceiling for concurrent load.

Usage: ``python bench/nullquorum.py --listen 127.0.0.1:PORT --udp PORT --peers
127.0.0.1:PORT,... --data-dir DIR`` (stops on SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.grpc_server import ServerOptions  # noqa: E402
from accord.proto import rpc_pb2  # noqa: E402
from bench.nullserver import _PassInterceptor, rpc_pb2_grpc  # noqa: E402

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
    """The peer side of the datagrams, and the waits of this member's requests."""

    def __init__(self, writer: Writer, peers: tuple[tuple[str, int], ...]) -> None:
        self.writer = writer
        self.peers = peers
        self.udp: asyncio.DatagramTransport | None = None
        self.waits: dict[bytes, asyncio.Future[None]] = {}
        self.ids = itertools.count()

    def connection_made(self, transport: Any) -> None:
        self.udp = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        kind, rid = data[:1], data[1:9]
        assert self.udp is not None
        if kind == _WRITE:
            self.writer.write(data[9:], lambda: self.udp.sendto(_ACK + rid, addr))  # type: ignore[union-attr]
        elif kind == _PING:
            self.udp.sendto(_PONG + rid, addr)
        else:  # an ack or a pong: the first one completes the request's quorum
            fut = self.waits.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _ask(self, kind: bytes, payload: bytes = b"") -> asyncio.Future[None]:
        rid = next(self.ids).to_bytes(8, "big")
        fut = asyncio.get_running_loop().create_future()
        self.waits[rid] = fut
        assert self.udp is not None
        for peer in self.peers:
            self.udp.sendto(kind + rid + payload, peer)
        return fut

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


async def serve(listen: str, udp_port: int, peers: tuple[tuple[str, int], ...], data_dir: Path) -> None:
    """Serve until SIGINT/SIGTERM."""
    loop = asyncio.get_running_loop()
    writer = Writer(data_dir / "log", loop)
    quorum = Quorum(writer, peers)
    await loop.create_datagram_endpoint(lambda: quorum, local_addr=(listen.rpartition(":")[0], udp_port))
    server = grpc.aio.server(options=ServerOptions().channel_args(),
                             interceptors=[_PassInterceptor()])
    rpc_pb2_grpc.add_KVServicer_to_server(QuorumKV(quorum), server)
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    print(f"listening on {listen}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.2)
    writer.close()


def main() -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="host:port (gRPC)")
    p.add_argument("--udp", type=int, required=True, help="UDP port for the peers")
    p.add_argument("--peers", required=True, help="host:port,... UDP addresses of the peers")
    p.add_argument("--data-dir", required=True, type=Path)
    args = p.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    peers = tuple((h, int(port)) for h, _, port in (x.rpartition(":") for x in args.peers.split(",") if x))
    import uvloop

    uvloop.run(serve(args.listen, args.udp, peers, args.data_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
