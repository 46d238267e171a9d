"""The Raft command envelope of the KV state machine.

A command is a msgpack array ``[FORMAT, kind, payload, min_revision, now_ms, term, extra]``:
``payload`` is the serialized etcd request, ``min_revision`` the optional revision floor
(a write gets revision ``max(current + 1, min_revision)``, so that a multi-shard
deployment can keep revisions comparable across shards; 0 = none; a negative value is an
ordered stamp, ``revorder.py``), ``now_ms`` and
``term`` the proposing leader's clock and Raft term for lease commands, ``extra`` the
lease ids of an expire command. The format number lets a future version read old logs.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

import msgpack

from accord.services.kv import errors

FORMAT = 1


class Kind(IntEnum):
    """What a command does."""

    PUT = 1
    DELETE_RANGE = 2
    TXN = 3
    COMPACT = 4
    LEASE_GRANT = 5
    LEASE_REVOKE = 6
    LEASE_CHECKPOINT = 7
    LEASE_EXPIRE = 8
    LEASE_KEEPALIVE = 9
    FLOOR = 10
    """Raise the revision to ``min_revision`` without a change (a cross-shard read's floor)."""


class Command(NamedTuple):
    """A decoded command (a named tuple: built once per applied entry, so cheap)."""

    kind: Kind
    payload: bytes
    min_revision: int = 0
    now_ms: int = 0
    term: int = 0
    ids: tuple[int, ...] = ()


def encode(
    kind: Kind,
    payload: bytes = b"",
    *,
    min_revision: int = 0,
    now_ms: int = 0,
    term: int = 0,
    ids: tuple[int, ...] | list[int] = (),
) -> bytes:
    """Serialize one command."""
    if now_ms < 0 or term < 0:
        raise ValueError("now_ms and term must be >= 0")
    body: list[Any] = [FORMAT, int(kind), payload, min_revision, now_ms, term, list(ids)]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


_KINDS = {int(k): k for k in Kind}


def decode(data: bytes) -> Command:
    """Parse a command; raises ``EtcdError`` (InvalidArgument) on anything malformed."""
    try:
        body = msgpack.unpackb(data, raw=False, use_list=False)
        fmt, kind, payload, min_revision, now_ms, term, ids = body
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise errors.bad_request(f"malformed KV command: {exc}") from exc
    if fmt != FORMAT:
        raise errors.bad_request(f"malformed KV command: unknown format {fmt!r}")
    k = _KINDS.get(kind) if type(kind) is int else None
    if k is None:
        raise errors.bad_request(f"malformed KV command: unknown kind {kind!r}")
    if type(payload) is not bytes:
        raise errors.bad_request("malformed KV command: payload is not bytes")
    if not (type(min_revision) is int and type(now_ms) is int and type(term) is int) or any(
        type(i) is not int for i in ids
    ):
        raise errors.bad_request("malformed KV command: numeric field is not an integer")
    return Command(k, payload, min_revision, now_ms, term, ids)


def spreads_to_every_shard(data: bytes) -> bool:
    """Whether ``data`` is a lease grant or revoke: the lease commands applied on every
    shard (a node of several workers commits them on the other workers' shards)."""
    try:
        return decode(data).kind in (Kind.LEASE_GRANT, Kind.LEASE_REVOKE)
    except errors.EtcdError:
        return False
