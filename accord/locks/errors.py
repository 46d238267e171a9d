"""Errors of the lock and election recipes; each carries the gRPC status it maps to.

Every error is raised before anything changes, or by a transaction whose guard failed
(so it changed nothing): the message says what was wrong and what to do.
"""

from __future__ import annotations

import grpc


class LockError(Exception):
    """Base of lock and election errors."""

    code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION

    @property
    def message(self) -> str:
        """The text sent to gRPC clients."""
        return str(self)


class InvalidLockName(LockError, ValueError):
    """A lock/election name or key that cannot be one."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class SessionExpired(LockError):
    """The contender's key vanished while it waited: its lease expired or was revoked."""


class NotHeld(LockError):
    """Release of a lock (or resign of an election) the caller does not hold."""


class NotLeader(LockError):
    """Proclaim/resign by a campaigner that is not the leader (etcd's message and code)."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str = "election: not leader") -> None:
        super().__init__(message)


class NoLeader(LockError):
    """The election has no leader (etcd's message and code)."""

    code = grpc.StatusCode.UNKNOWN
    """etcd's election server returns the bare Go error, which gRPC sends as UNKNOWN."""

    def __init__(self, message: str = "election: no leader") -> None:
        super().__init__(message)


class FencedWriteRejected(LockError):
    """A write guarded by a fencing token that is not the lock's current holder's."""

    def __init__(self, name: bytes, token: int, current: int | None) -> None:
        self.name = name
        self.token = token
        self.current = current
        shown = name.decode(errors="backslashreplace")
        if current is None:
            msg = f"fencing token {token} is stale: lock '{shown}' is not held by anyone"
        elif token > current:
            msg = (
                f"fencing token {token} is not a token of lock '{shown}' (held with token "
                f"{current}): it was never issued for this lock; use the token of the lock "
                "you hold"
            )
        else:
            msg = f"fencing token {token} is stale: lock '{shown}' is held with token {current}"
        super().__init__(msg + "; nothing was written")
