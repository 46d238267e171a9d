"""The do-nothing server: the ceiling of accord's gRPC front end on this machine.

A ``grpc.aio`` server built like accord's (``accord/grpc_server.py``: same server
options, an interceptor of the same shape, uvloop) whose ``etcdserverpb.KV/Put`` and
``KV/Range`` only bump a counter and answer an empty response with a header. Whatever
rate it reaches under a load is what any server of this front-end design could reach
under the same load on the same CPU, so benchmarks report accord as a fraction of it.

Usage: ``python bench/nullserver.py --listen 127.0.0.1:PORT`` (stops on SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.grpc_server import ServerOptions  # noqa: E402
from accord.proto import rpc_pb2  # noqa: E402
from accord.proto import rpc_pb2_grpc as _rpc_grpc  # noqa: E402

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


class NullKV(rpc_pb2_grpc.KVServicer):  # type: ignore[misc]
    """Put and Range that do nothing but count."""

    def __init__(self) -> None:
        self.count = 0

    async def Put(self, request: rpc_pb2.PutRequest, context: Any) -> rpc_pb2.PutResponse:
        self.count += 1
        return rpc_pb2.PutResponse(header=rpc_pb2.ResponseHeader(revision=self.count))

    async def Range(self, request: rpc_pb2.RangeRequest, context: Any) -> rpc_pb2.RangeResponse:
        self.count += 1
        return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=self.count))


async def serve(listen: str) -> None:
    """Serve until SIGINT/SIGTERM."""
    server = grpc.aio.server(options=ServerOptions().channel_args(),
                             interceptors=[_PassInterceptor()])
    rpc_pb2_grpc.add_KVServicer_to_server(NullKV(), server)
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    print(f"listening on {listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.2)


def main() -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="host:port")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args.listen))
    except ImportError:
        asyncio.run(serve(args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
