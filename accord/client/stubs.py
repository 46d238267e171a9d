"""Typed access to the generated (untyped) gRPC stubs."""

from __future__ import annotations

from typing import Any

import grpc

from accord.proto import rpc_pb2_grpc

_rpc: Any = rpc_pb2_grpc


def kv(channel: grpc.aio.Channel) -> Any:
    """An ``etcdserverpb.KV`` stub."""
    return _rpc.KVStub(channel)


def lease(channel: grpc.aio.Channel) -> Any:
    """An ``etcdserverpb.Lease`` stub."""
    return _rpc.LeaseStub(channel)


def watch(channel: grpc.aio.Channel) -> Any:
    """An ``etcdserverpb.Watch`` stub."""
    return _rpc.WatchStub(channel)
