"""The do-nothing server: the ceiling of accord's gRPC front end on this machine.

A ``grpc.aio`` server built like accord's (``accord/node/grpc_server.py``: same server
options, an interceptor of the same shape, uvloop) whose ``etcdserverpb.KV/Put`` and
``KV/Range`` only bump a counter and answer an empty response with a header. Whatever
rate it reaches under a load is what any server of this front-end design could reach
under the same load on the same CPU, so benchmarks report accord as a fraction of it.

It also serves ``etcdserverpb.Watch`` the way accord's watch streams send (one sender
per stream, responses as pre-serialized bytes, ``accord/services/kv/watchstream.py``):
a Put is serialized once as a watch response and queued on every stream watching its
key, here and, as one UDP datagram each, on the ``--peers`` (other do-nothing servers,
each fanning out to its own streams). No consensus, no store: three of them are the
floor of watch delivery for any server of this front-end design.

Usage: ``python bench/nullserver.py --listen 127.0.0.1:PORT [--udp PORT --peers
127.0.0.1:PORT,...]`` (stops on SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.node.grpc_server import ServerOptions  # noqa: E402
from accord.proto import kv_pb2, rpc_pb2  # noqa: E402
from accord.proto import rpc_pb2_grpc as _rpc_grpc  # noqa: E402
from accord.services.kv.watchstream import serialize_response  # noqa: E402

rpc_pb2_grpc: Any = _rpc_grpc  # generated stubs are untyped


class _PassInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Reads the metadata as accord's ``MetadataInterceptor`` does, and passes the call on."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        for _key, _value in details.invocation_metadata or ():
            pass
        return handler


class NullWatch:
    """Watch streams that only pass on what ``publish`` hands them (key -> response bytes)."""

    def __init__(self) -> None:
        self.streams: dict[bytes, set[_Stream]] = {}

    def publish(self, key: bytes, data: bytes) -> None:
        """Queue ``data`` on every stream watching ``key``."""
        for s in self.streams.get(key, ()):
            s.queue.append(data)
            s.wake.set()

    async def Watch(self, requests: AsyncIterator[rpc_pb2.WatchRequest], context: Any) -> AsyncIterator[bytes]:
        """Answer the first create with ``created``, then send what is published."""
        first = await anext(aiter(requests))
        key = first.create_request.key
        yield rpc_pb2.WatchResponse(header=rpc_pb2.ResponseHeader(), created=True).SerializeToString()
        stream = _Stream()
        self.streams.setdefault(key, set()).add(stream)
        try:
            while True:
                while stream.queue:
                    yield stream.queue.popleft()
                stream.wake.clear()
                await stream.wake.wait()
        finally:
            self.streams[key].discard(stream)


class _Stream:
    __slots__ = ("queue", "wake")

    def __init__(self) -> None:
        self.queue: deque[bytes] = deque()
        self.wake = asyncio.Event()


class _Datagrams(asyncio.DatagramProtocol):
    """Events from the peers: ``key length (2 bytes) | key | response bytes``."""

    def __init__(self, watch: NullWatch) -> None:
        self.watch = watch

    def datagram_received(self, data: bytes, addr: Any) -> None:
        n = int.from_bytes(data[:2], "big")
        self.watch.publish(data[2:2 + n], data[2 + n:])


class NullKV(rpc_pb2_grpc.KVServicer):  # type: ignore[misc]
    """Put and Range that do nothing but count (and tell the watchers of a Put)."""

    def __init__(self, watch: NullWatch | None = None,
                 peers: tuple[tuple[str, int], ...] = ()) -> None:
        self.count = 0
        self.watch = watch
        self.peers = peers
        self.udp: asyncio.DatagramTransport | None = None

    async def Put(self, request: rpc_pb2.PutRequest, context: Any) -> rpc_pb2.PutResponse:
        self.count += 1
        header = rpc_pb2.ResponseHeader(revision=self.count)
        # Only a Put someone watches costs an event: the ceiling of the KV cells (one
        # server, no watchers, no peers) stays a Put that does nothing.
        if self.watch is not None and (self.peers or request.key in self.watch.streams):
            data = rpc_pb2.WatchResponse(header=header, events=[kv_pb2.Event(
                type=kv_pb2.Event.PUT, kv=kv_pb2.KeyValue(
                    key=request.key, value=request.value, mod_revision=self.count,
                    create_revision=self.count, version=1))]).SerializeToString()
            self.watch.publish(request.key, data)
            if self.udp is not None:
                msg = len(request.key).to_bytes(2, "big") + request.key + data
                for peer in self.peers:
                    self.udp.sendto(msg, peer)
        return rpc_pb2.PutResponse(header=header)

    async def Range(self, request: rpc_pb2.RangeRequest, context: Any) -> rpc_pb2.RangeResponse:
        self.count += 1
        return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=self.count))


def front_end() -> grpc.aio.Server:
    """A ``grpc.aio`` server built as accord's: its options and an interceptor of its shape."""
    return grpc.aio.server(options=ServerOptions().channel_args(), interceptors=[_PassInterceptor()])


async def serve_until_signal(server: grpc.aio.Server, listen: str) -> None:
    """Listen on ``listen``, start, and serve until SIGINT/SIGTERM."""
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    print(f"listening on {listen}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.2)


def parse_peers(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,...`` as (host, port) pairs."""
    return tuple((h, int(port)) for h, _, port in (x.rpartition(":") for x in text.split(",") if x))


async def serve(listen: str, udp_port: int = 0, peers: tuple[tuple[str, int], ...] = ()) -> None:
    """Serve until SIGINT/SIGTERM."""
    server = front_end()
    watch = NullWatch()
    kv = NullKV(watch, peers)
    rpc_pb2_grpc.add_KVServicer_to_server(kv, server)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("etcdserverpb.Watch", {
        "Watch": grpc.stream_stream_rpc_method_handler(
            watch.Watch, request_deserializer=rpc_pb2.WatchRequest.FromString,
            response_serializer=serialize_response)}),))
    if udp_port:
        kv.udp, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Datagrams(watch), local_addr=(listen.rpartition(":")[0], udp_port))
    await serve_until_signal(server, listen)


def main() -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="host:port")
    p.add_argument("--udp", type=int, default=0, help="UDP port for the peers' events (0: none)")
    p.add_argument("--peers", default="", help="host:port,... UDP addresses of the peers")
    args = p.parse_args()
    peers = parse_peers(args.peers)
    try:
        import uvloop

        uvloop.run(serve(args.listen, args.udp, peers))
    except ImportError:
        asyncio.run(serve(args.listen, args.udp, peers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
