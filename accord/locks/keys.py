"""Key layout of accord's locks and elections, and the small values stored in them.

A lock (or election) named ``N`` keeps its queue under the prefix ``N/``: each contender
writes ``N/<lease id in lowercase hex>`` attached to its session lease, exactly as etcd's
``concurrency`` package and ``etcdctl lock``/``etcdctl elect`` do, so accord clients, the
v3lock/v3election servicers and etcd's own tools share one queue. Queue order is the
key's create revision; the holder is the key with the lowest create revision, and that
revision is the holder's fencing token.

accord keeps one extra key per lock, the *grant record* ``\\x00accord-lock/N`` (outside
every ``X/`` queue prefix, so etcd tools never take it for a contender):

* ``{"token": T, "lock_delay_ms": D}`` with no lease: written by the Raft-committed grant
  of token ``T``; deleted, in the same transaction, by ``T``'s clean release. If it is
  still there when the queue's head is someone else, holder ``T`` lost its key without
  releasing (lease expired or revoked).
* ``{"delay_after": T, "lock_delay_ms": D}`` attached to a short lease: the lock-delay in
  progress after such a loss; the cluster deletes it when that lease expires, and no
  accord contender is granted the lock while it exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from accord.locks.errors import InvalidLockName

GRANT_PREFIX = b"\x00accord-lock/"
MAX_NAME_BYTES = 4096


def check_name(name: bytes | str) -> bytes:
    """The lock name as bytes; refuses empty, over-long and ``/``-terminated names."""
    raw = name.encode() if isinstance(name, str) else bytes(name)
    if not raw:
        raise InvalidLockName("lock name is empty: give the name of the lock, e.g. 'jobs/7'")
    if len(raw) > MAX_NAME_BYTES:
        raise InvalidLockName(f"lock name is {len(raw)} bytes; at most {MAX_NAME_BYTES} allowed")
    if raw.startswith(GRANT_PREFIX[:1]):
        raise InvalidLockName("lock names may not start with a NUL byte (reserved by accord)")
    return raw


def prefix(name: bytes) -> bytes:
    """The queue prefix of lock ``name``: ``name/``."""
    return name + b"/"


def prefix_end(p: bytes) -> bytes:
    """The range end that covers every key starting with ``p`` (etcd's rule)."""
    b = bytearray(p)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\x00"


def contender_key(name: bytes, lease_id: int) -> bytes:
    """The queue key of the contender holding ``lease_id``: ``name/<lease hex>``."""
    return prefix(name) + format(lease_id, "x").encode()


def grant_key(name: bytes) -> bytes:
    """The grant record of lock ``name``."""
    return GRANT_PREFIX + name


def split_contender_key(key: bytes) -> tuple[bytes, int]:
    """``(name, lease_id)`` of a queue key; :class:`InvalidLockName` if it is not one."""
    name, sep, tail = bytes(key).rpartition(b"/")
    try:
        lease = int(tail.decode(), 16) if tail else -1
    except (UnicodeDecodeError, ValueError):
        lease = -1
    if not sep or not name or lease <= 0:
        raise InvalidLockName(
            f"{key!r} is not a lock key: lock keys look like '<name>/<lease id in hex>' "
            "(the key Lock returned)"
        )
    return name, lease


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """A decoded grant record: a live grant (``delaying=False``) or a lock-delay."""

    token: int
    lock_delay_ms: int
    delaying: bool
    mod_revision: int


def encode_grant(token: int, lock_delay_ms: int) -> bytes:
    """The value the grant of ``token`` writes."""
    return json.dumps({"token": token, "lock_delay_ms": lock_delay_ms}, separators=(",", ":")).encode()


def encode_delay(token: int, lock_delay_ms: int) -> bytes:
    """The value of the lock-delay record after holder ``token`` was lost."""
    return json.dumps(
        {"delay_after": token, "lock_delay_ms": lock_delay_ms}, separators=(",", ":")
    ).encode()


def decode_grant(value: bytes, mod_revision: int) -> GrantRecord | None:
    """Decode a grant record; ``None`` for a value accord did not write (ignored)."""
    try:
        doc = json.loads(value)
        if "delay_after" in doc:
            return GrantRecord(int(doc["delay_after"]), int(doc["lock_delay_ms"]), True, mod_revision)
        return GrantRecord(int(doc["token"]), int(doc["lock_delay_ms"]), False, mod_revision)
    except (ValueError, TypeError, KeyError):
        return None
