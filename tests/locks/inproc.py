"""An in-process etcd API server for lock tests: LocalBackend, KV/Lease/Watch and the lock services."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from accord.locks.servicer import add_lock_services
from accord.proto import rpc_pb2_grpc
from accord.services.kv.local import LocalBackend
from accord.services.kv.servicer import KVServicer, LeaseServicer
from accord.services.kv.watchstream import WatchServicer, add_watch_servicer

_rpc: Any = rpc_pb2_grpc


@contextlib.asynccontextmanager
async def local_backend() -> AsyncIterator[LocalBackend]:
    """An in-memory backend that expires leases every 50 ms."""
    backend = await LocalBackend.open(None, lease_check_interval_s=0.05)
    try:
        yield backend
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def serve_local() -> AsyncIterator[tuple[str, LocalBackend]]:
    """``(endpoint, backend)`` of a server on a free 127.0.0.1 port, stopped on exit."""
    async with local_backend() as backend:
        server = grpc.aio.server()
        watch = WatchServicer(backend, max_response_bytes=1 << 20)
        _rpc.add_KVServicer_to_server(KVServicer(backend), server)
        _rpc.add_LeaseServicer_to_server(LeaseServicer(backend), server)
        add_watch_servicer(watch, server)
        add_lock_services(server, backend)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            yield f"127.0.0.1:{port}", backend
        finally:
            await watch.close()
            await server.stop(0.1)
