"""Errors the client library raises: which endpoint failed, and what to try.

Every error of a call is a :class:`ClientError`: the gRPC ``code``, the server's
``message``, the ``endpoint`` that answered (or failed to), and a ``hint`` saying what
to try. The hierarchy is small on purpose::

    ClientError                 the cluster refused the request (its code and message)
    +-- Unavailable             no endpoint answered within the retry budget
    +-- OutcomeUnknown          a write was sent and no answer came: it may have been applied
    +-- LeaseNotFound           the lease was never granted, expired or was revoked
    +-- NotFound                a job, node or member the call named does not exist
    +-- WatchError              a watch ended for a reason other than the caller's
        +-- WatchCompacted      the revision the watch needs was compacted away

Lock and election errors come from the recipes in :mod:`accord.locks` and are
re-exported here so callers import everything from :mod:`accord.client`.
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
    "NotFound",
    "NotHeld",
    "NotLeader",
    "OutcomeUnknown",
    "SessionExpired",
    "Unavailable",
    "WatchCompacted",
    "WatchError",
]

_HINTS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "fix the request: the message says which field is wrong",
    grpc.StatusCode.OUT_OF_RANGE: "the revision is compacted or in the future: read the "
                                  "current revision and start from there",
    grpc.StatusCode.FAILED_PRECONDITION: "the cluster's state does not allow this now "
                                         "(the message says why)",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "a limit was reached: send less at once or raise "
                                        "the server's limit",
    grpc.StatusCode.UNIMPLEMENTED: "this server does not offer the call (an etcd endpoint "
                                   "has no accord services)",
    grpc.StatusCode.PERMISSION_DENIED: "authenticate, or ask for the permission",
}


class ClientError(Exception):
    """A request the cluster refused, or could not answer."""

    def __init__(self, code: grpc.StatusCode, message: str, *, endpoint: str = "",
                 hint: str = "") -> None:
        self.code = code
        self.message = message
        self.endpoint = endpoint
        """``host:port`` of the member that answered or failed ("" if none was reached)."""
        self.hint = hint or _HINTS.get(code, "")
        """What to try next."""
        where = f" at {endpoint}" if endpoint else ""
        tail = f"; {self.hint}" if self.hint else ""
        super().__init__(f"{message} ({code.name}{where}){tail}")


class Unavailable(ClientError):
    """No endpoint answered within the retry budget."""


class OutcomeUnknown(ClientError):
    """A non-idempotent write was sent but its answer was lost: it may have been applied.

    The client does not send it again (that could apply it twice); read the state back
    (e.g. the key's ``mod_revision``) to learn whether it took effect."""


class LeaseNotFound(ClientError):
    """The lease is unknown to the cluster: never granted, expired or revoked."""


class NotFound(ClientError):
    """The job, node or member named does not exist."""


class WatchError(ClientError):
    """A watch was ended by the server (not by the caller)."""


class WatchCompacted(WatchError):
    """The watch's start (or resume) revision was compacted: its events are gone.

    ``compact_revision`` is the oldest revision still available; re-read the current
    state with a range and watch again from the range's revision + 1."""

    def __init__(self, requested: int, compact_revision: int, *, endpoint: str = "") -> None:
        super().__init__(
            grpc.StatusCode.OUT_OF_RANGE,
            f"watch from revision {requested}: revisions up to {compact_revision} were "
            f"compacted",
            endpoint=endpoint,
            hint=f"range the keys again and watch from that range's revision + 1 "
                 f"(at least {compact_revision})",
        )
        self.requested = requested
        self.compact_revision = compact_revision


def from_rpc_error(e: grpc.aio.AioRpcError, endpoint: str = "") -> ClientError:
    """The library's exception for a failed call to ``endpoint``."""
    code = e.code()
    message = e.details() or ""
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in message:
        return LeaseNotFound(code, message, endpoint=endpoint,
                             hint="grant a new lease (the old one expired or was revoked)")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(code, message, endpoint=endpoint)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(code, message, endpoint=endpoint,
                           hint="check that the member runs and is reachable; other "
                                "endpoints may answer")
    return ClientError(code, message, endpoint=endpoint)
