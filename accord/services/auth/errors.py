"""The errors of etcd's auth store, with etcd 3.4's codes and messages.

clientv3 maps them back to typed errors by message (``rpctypes``), and re-authenticates
on ``invalid auth token`` and ``revision of auth store is old``, so they are exact.
"""

from __future__ import annotations

import grpc

from accord.services.kv.errors import (
    AUTH_FAILED,
    AUTH_NOT_ENABLED,
    INVALID_AUTH_TOKEN,
    PERMISSION_DENIED,
    EtcdError,
)

_C = grpc.StatusCode

USER_EMPTY = EtcdError(_C.INVALID_ARGUMENT, "etcdserver: user name is empty")
USER_EXISTS = EtcdError(_C.FAILED_PRECONDITION, "etcdserver: user name already exists")
USER_NOT_FOUND = EtcdError(_C.FAILED_PRECONDITION, "etcdserver: user name not found")
ROLE_EMPTY = EtcdError(_C.INVALID_ARGUMENT, "etcdserver: role name is empty")
ROLE_EXISTS = EtcdError(_C.FAILED_PRECONDITION, "etcdserver: role name already exists")
ROLE_NOT_FOUND = EtcdError(_C.FAILED_PRECONDITION, "etcdserver: role name not found")
ROLE_NOT_GRANTED = EtcdError(_C.FAILED_PRECONDITION, "etcdserver: role is not granted to the user")
PERMISSION_NOT_GRANTED = EtcdError(
    _C.FAILED_PRECONDITION, "etcdserver: permission is not granted to the role"
)
PERMISSION_NOT_GIVEN = EtcdError(_C.INVALID_ARGUMENT, "etcdserver: permission not given")
ROOT_USER_MISSING = EtcdError(_C.FAILED_PRECONDITION, "etcdserver: root user does not exist")
ROOT_ROLE_MISSING = EtcdError(
    _C.FAILED_PRECONDITION, "etcdserver: root user does not have root role"
)
INVALID_AUTH_MGMT = EtcdError(_C.INVALID_ARGUMENT, "etcdserver: invalid auth management")
AUTH_OLD_REVISION = EtcdError(_C.INVALID_ARGUMENT, "etcdserver: revision of auth store is old")

# etcd 3.4's Maintenance server returns the auth store's own errors, which gRPC sends as
# code Unknown with the auth package's text (measured against etcd 3.4.23).
MAINTENANCE_ERRORS = {
    USER_EMPTY: EtcdError(_C.UNKNOWN, "auth: user name is empty"),
    USER_NOT_FOUND: EtcdError(_C.UNKNOWN, "auth: user name not found"),
    PERMISSION_DENIED: EtcdError(_C.UNKNOWN, "auth: permission denied"),
    INVALID_AUTH_TOKEN: EtcdError(_C.UNKNOWN, "auth: invalid auth token"),
}

__all__ = [
    "AUTH_FAILED",
    "AUTH_NOT_ENABLED",
    "AUTH_OLD_REVISION",
    "CLIENT_WRAPPED_CODES",
    "INVALID_AUTH_MGMT",
    "INVALID_AUTH_TOKEN",
    "MAINTENANCE_ERRORS",
    "PERMISSION_DENIED",
    "PERMISSION_NOT_GIVEN",
    "PERMISSION_NOT_GRANTED",
    "ROLE_EMPTY",
    "ROLE_EXISTS",
    "ROLE_NOT_FOUND",
    "ROLE_NOT_GRANTED",
    "ROOT_ROLE_MISSING",
    "ROOT_USER_MISSING",
    "USER_EMPTY",
    "USER_EXISTS",
    "USER_NOT_FOUND",
]

# etcd 3.4's Lock and Election servers answer with the errors of the client they use
# inside, which gRPC sends as code Unknown with etcd's message (measured).
CLIENT_WRAPPED_CODES = frozenset({_C.INVALID_ARGUMENT, _C.PERMISSION_DENIED,
                                  _C.UNAUTHENTICATED, _C.FAILED_PRECONDITION})
