"""In-process server fixtures for the API tests: a LocalBackend behind the real gRPC server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from accord.node.grpc_server import AccordGrpcServer, ServerOptions, build_server
from accord.services.kv.local import LocalBackend


@dataclass
class Running:
    """A started in-process server, its backend and a client channel to it."""

    server: AccordGrpcServer
    backend: LocalBackend
    channel: grpc.aio.Channel
    endpoint: str


async def start(
    backend: LocalBackend, options: ServerOptions | None = None, channel_options: list | None = None
) -> Running:
    srv = build_server(backend, options)
    port = srv.add_port("127.0.0.1:0")
    await srv.start()
    endpoint = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(endpoint, options=channel_options or [])
    return Running(srv, backend, channel, endpoint)


async def stop(r: Running) -> None:
    await r.channel.close()
    await r.server.stop(0)
    await r.backend.close()


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    backend = await LocalBackend.open()
    r = await start(backend)
    try:
        yield r
    finally:
        await stop(r)
