"""Errors the client library raises.

Server answers become :class:`ClientError` (with the gRPC code and the server's message);
lock and election errors come from the recipes in :mod:`accord.locks` and are re-exported
here so callers import everything from :mod:`accord.client`.
"""

from __future__ import annotations

import grpc

from accord.locks.errors import (
    FencedWriteRejected,
    InvalidLockName,
    LockError,
    NoLeader,
    NotHeld,
    NotLeader,
    SessionExpired,
)

__all__ = [
    "ClientError",
    "FencedWriteRejected",
    "InvalidLockName",
    "LeaseNotFound",
    "LockError",
    "NoLeader",
    "NotHeld",
    "NotLeader",
    "SessionExpired",
    "Unavailable",
]


class ClientError(Exception):
    """A request the cluster refused, or could not answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{message} ({code.name})")
        self.code = code
        self.message = message


class Unavailable(ClientError):
    """No endpoint answered within the retry budget."""


class LeaseNotFound(ClientError):
    """The lease is unknown to the cluster: never granted, expired or revoked."""


def from_rpc_error(e: grpc.aio.AioRpcError) -> ClientError:
    """The library's exception for a failed call."""
    code = e.code()
    message = e.details() or ""
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in message:
        return LeaseNotFound(code, message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(code, message)
    return ClientError(code, message)
