"""etcd-compatible errors raised by the KV store.

Go clientv3 turns gRPC errors back into typed errors by the *exact* message
string (``rpctypes.errStringToError``), so every error a client may parse carries
etcd's code and message verbatim. Errors that etcd does not have (accord's own
limits) use accord's prefix and say what was wrong and what to do.
"""

from __future__ import annotations

import grpc


class EtcdError(Exception):
    """An error for the client: a gRPC status code and the exact message."""

    def __init__(self, code: grpc.StatusCode, message: str, detail: str = "") -> None:
        super().__init__(f"{message} ({detail})" if detail else message)
        self.code = code
        self.message = message
        self.detail = detail
        """What exactly was wrong, for logs; not sent where clients match the message."""

    def __repr__(self) -> str:
        return f"EtcdError({self.code.name}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EtcdError):
            return NotImplemented
        return self.code == other.code and self.message == other.message

    def __hash__(self) -> int:
        return hash((self.code, self.message))


_C = grpc.StatusCode

# --- messages, exactly as etcd 3.4 sends them -------------------------------------------
MSG_EMPTY_KEY = "etcdserver: key is not provided"
MSG_KEY_NOT_FOUND = "etcdserver: key not found"
MSG_VALUE_PROVIDED = "etcdserver: value is provided"
MSG_LEASE_PROVIDED = "etcdserver: lease is provided"
MSG_TOO_MANY_OPS = "etcdserver: too many operations in txn request"
MSG_DUPLICATE_KEY = "etcdserver: duplicate key given in txn request"
MSG_INVALID_SORT_OPTION = "etcdserver: invalid sort option"
MSG_REQUEST_TOO_LARGE = "etcdserver: request is too large"
MSG_COMPACTED = "etcdserver: mvcc: required revision has been compacted"
MSG_FUTURE_REV = "etcdserver: mvcc: required revision is a future revision"
MSG_NO_SPACE = "etcdserver: mvcc: database space exceeded"
MSG_LEASE_NOT_FOUND = "etcdserver: requested lease not found"
MSG_LEASE_EXISTS = "etcdserver: lease already exists"
MSG_LEASE_TTL_TOO_LARGE = "etcdserver: too large lease TTL"
MSG_NO_LEADER = "etcdserver: no leader"
MSG_LEADER_CHANGED = "etcdserver: leader changed"
MSG_TIMEOUT = "etcdserver: request timed out"
MSG_NOT_LEADER = "etcdserver: not leader"
MSG_TOO_MANY_REQUESTS = "etcdserver: too many requests"
MSG_AUTH_FAILED = "etcdserver: authentication failed, invalid user ID or password"
MSG_PERMISSION_DENIED = "etcdserver: permission denied"
MSG_INVALID_AUTH_TOKEN = "etcdserver: invalid auth token"
MSG_AUTH_NOT_ENABLED = "etcdserver: authentication is not enabled"
MSG_MEMBER_EXIST = "etcdserver: member ID already exist"
MSG_PEER_URL_EXIST = "etcdserver: Peer URLs already exists"
MSG_MEMBER_NOT_FOUND = "etcdserver: member not found"
MSG_BAD_LEADER_TRANSFEREE = "etcdserver: bad leader transferee"
MSG_CORRUPT = "etcdserver: corrupt cluster"
MSG_DUPLICATE_WATCH_ID = "mvcc: duplicate watch ID provided on the WatchStream"

# --- ready-made errors (immutable in practice: raise them, do not mutate them) ----------
EMPTY_KEY = EtcdError(_C.INVALID_ARGUMENT, MSG_EMPTY_KEY)
KEY_NOT_FOUND = EtcdError(_C.INVALID_ARGUMENT, MSG_KEY_NOT_FOUND)
VALUE_PROVIDED = EtcdError(_C.INVALID_ARGUMENT, MSG_VALUE_PROVIDED)
LEASE_PROVIDED = EtcdError(_C.INVALID_ARGUMENT, MSG_LEASE_PROVIDED)
TOO_MANY_OPS = EtcdError(_C.INVALID_ARGUMENT, MSG_TOO_MANY_OPS)
DUPLICATE_KEY = EtcdError(_C.INVALID_ARGUMENT, MSG_DUPLICATE_KEY)
INVALID_SORT_OPTION = EtcdError(_C.INVALID_ARGUMENT, MSG_INVALID_SORT_OPTION)
REQUEST_TOO_LARGE = EtcdError(_C.INVALID_ARGUMENT, MSG_REQUEST_TOO_LARGE)
COMPACTED = EtcdError(_C.OUT_OF_RANGE, MSG_COMPACTED)
FUTURE_REV = EtcdError(_C.OUT_OF_RANGE, MSG_FUTURE_REV)
NO_SPACE = EtcdError(_C.RESOURCE_EXHAUSTED, MSG_NO_SPACE)
LEASE_NOT_FOUND = EtcdError(_C.NOT_FOUND, MSG_LEASE_NOT_FOUND)
LEASE_EXISTS = EtcdError(_C.FAILED_PRECONDITION, MSG_LEASE_EXISTS)
LEASE_TTL_TOO_LARGE = EtcdError(_C.OUT_OF_RANGE, MSG_LEASE_TTL_TOO_LARGE)
NO_LEADER = EtcdError(_C.UNAVAILABLE, MSG_NO_LEADER)
LEADER_CHANGED = EtcdError(_C.UNAVAILABLE, MSG_LEADER_CHANGED)
TIMEOUT = EtcdError(_C.UNAVAILABLE, MSG_TIMEOUT)
NOT_LEADER = EtcdError(_C.FAILED_PRECONDITION, MSG_NOT_LEADER)
TOO_MANY_REQUESTS = EtcdError(_C.RESOURCE_EXHAUSTED, MSG_TOO_MANY_REQUESTS)
AUTH_FAILED = EtcdError(_C.INVALID_ARGUMENT, MSG_AUTH_FAILED)
PERMISSION_DENIED = EtcdError(_C.PERMISSION_DENIED, MSG_PERMISSION_DENIED)
INVALID_AUTH_TOKEN = EtcdError(_C.UNAUTHENTICATED, MSG_INVALID_AUTH_TOKEN)
AUTH_NOT_ENABLED = EtcdError(_C.FAILED_PRECONDITION, MSG_AUTH_NOT_ENABLED)
MEMBER_EXIST = EtcdError(_C.FAILED_PRECONDITION, MSG_MEMBER_EXIST)
PEER_URL_EXIST = EtcdError(_C.FAILED_PRECONDITION, MSG_PEER_URL_EXIST)
MEMBER_NOT_FOUND = EtcdError(_C.NOT_FOUND, MSG_MEMBER_NOT_FOUND)
BAD_LEADER_TRANSFEREE = EtcdError(_C.FAILED_PRECONDITION, MSG_BAD_LEADER_TRANSFEREE)
CORRUPT = EtcdError(_C.DATA_LOSS, MSG_CORRUPT)


# --- accord's own limits (etcd has no equivalent message) --------------------------------
def key_too_large(size: int, limit: int) -> EtcdError:
    """A key over ``Limits.max_key_bytes``.

    etcd has no key limit of its own (only the request limit), so the message is etcd's
    ``request is too large``, which Go clients map to ``ErrRequestTooLarge``; the detail
    goes into the exception's ``detail`` for logs.
    """
    return EtcdError(_C.INVALID_ARGUMENT, MSG_REQUEST_TOO_LARGE, f"key of {size} bytes exceeds the {limit}-byte key limit")


def value_too_large(size: int, limit: int) -> EtcdError:
    """A value over ``Limits.max_value_bytes`` (etcd's ``request is too large``)."""
    return EtcdError(_C.INVALID_ARGUMENT, MSG_REQUEST_TOO_LARGE, f"value of {size} bytes exceeds the {limit}-byte value limit")


def request_too_large(size: int, limit: int) -> EtcdError:
    """A request over ``Limits.max_request_bytes`` (etcd's ``request is too large``)."""
    return EtcdError(_C.INVALID_ARGUMENT, MSG_REQUEST_TOO_LARGE, f"request of {size} bytes exceeds the {limit}-byte request limit")


def range_too_large(size: int, limit: int) -> EtcdError:
    """A Range whose result would exceed ``Limits.max_range_result_bytes``."""
    return EtcdError(
        _C.RESOURCE_EXHAUSTED,
        f"accord: range result too large ({size} bytes > limit {limit}); "
        "narrow the range, set a limit and page with the last key, or use keys_only/count_only",
    )


def too_many_leases(limit: int) -> EtcdError:
    """A LeaseGrant beyond ``Limits.max_leases`` live leases."""
    return EtcdError(
        _C.RESOURCE_EXHAUSTED,
        f"accord: too many leases (limit {limit}); revoke unused leases or reuse one lease "
        "for many keys",
    )


def too_many_watchers(limit: int) -> EtcdError:
    """A watch beyond ``Limits.max_watchers`` on one node."""
    return EtcdError(
        _C.RESOURCE_EXHAUSTED,
        f"accord: too many watchers on this node (limit {limit}); share watches over a "
        "prefix or connect to another node",
    )


def bad_request(what: str) -> EtcdError:
    """A malformed request or command accord cannot interpret."""
    return EtcdError(_C.INVALID_ARGUMENT, f"accord: {what}")


class Locked(EtcdError):
    """A write met the intent of a multi-shard Txn in progress (``docs/txn.md``).

    Raised in apply, so every replica refuses the same command and nothing changes; the
    member that proposed it waits for the intent to be resolved (or resolves it past its
    deadline) and proposes again, so a client sees it only when that takes too long."""

    def __init__(self, txn_id: int) -> None:
        super().__init__(
            _C.UNAVAILABLE,
            "accord: a key of this request is held by a cross-shard transaction in "
            "progress; retry",
        )
        self.txn_id = txn_id
