"""Which shard a key lives on, and which shards a range or a Txn touches.

A key belongs to the shard ``crc32c(partition key) % shards``. The partition key is

* for an absolute key (``/a/b/...``): its first two path segments, ``/a/b``
  (``/ckpt/job-17/rank-3`` -> ``/ckpt/job-17``; ``/registry/pods/ns/x`` -> ``/registry/pods``);
* for a relative key with a slash (``name/...``): its first segment, ``name``; etcd's
  own lock and election recipes keep their queue under ``<name>/`` and read that whole
  prefix inside a Txn, so the queue must sit on one shard;
* for any other key: the whole key;
* except the grant record of an accord lock ``N`` (``\\x00accord-lock/N``, see
  ``accord/locks/README.md``), which goes with the lock's queue ``N/``: the recipe
  compares both in one Txn.

The rule is *prefix-closed*: every key under ``/a/b/`` (or under ``name/``) has the same
partition key, so a range over such a prefix is served by one shard, and a Txn that
stays inside it is atomic. A range that is not inside one partition goes to every shard
(the keys of one partition are spread by hash, not kept in key order). A Txn whose keys
span shards runs as a multi-shard Txn (``xcoord.py``, ``docs/txn.md``); only while some
member cannot apply those yet is it refused with :func:`txn_spans_shards`'s error, which
names the shards.

The hash is CRC32C (stable across processes and versions, unlike Python's ``hash``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import crc32c
import grpc

from accord.proto import rpc_pb2
from accord.services.kv.errors import EtcdError

LOCK_GRANT_PREFIX = b"\x00accord-lock/"
"""Where accord's lock recipe keeps a lock's grant record (``accord.locks.keys``)."""


def partition_key(key: bytes) -> bytes:
    """The part of ``key`` that decides its shard (see the module docstring)."""
    if key.startswith(LOCK_GRANT_PREFIX) and len(key) > len(LOCK_GRANT_PREFIX):
        key = key[len(LOCK_GRANT_PREFIX):] + b"/"
    if key.startswith(b"/"):
        parts = key[1:].split(b"/", 2)
        return b"/" + b"/".join(parts[:2])
    head, sep, _ = key.partition(b"/")
    return head if sep else key


SHARD_CACHE_KEYS = 8192
"""Keys whose shard :func:`shard_of` remembers: a multi-shard Txn asks for the same few
keys dozens of times on each member (its compares, puts, intent ranges, put checks and
share, in every command of it), and the answer never changes."""


@functools.lru_cache(maxsize=SHARD_CACHE_KEYS)
def shard_of(key: bytes, shards: int) -> int:
    """The index (``0 .. shards-1``) of the shard holding ``key``."""
    if shards == 1:
        return 0
    return int(crc32c.crc32c(partition_key(key))) % shards


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's rule)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\x00"


def closed_prefix(key: bytes) -> bytes | None:
    """The longest prefix ``C`` such that every key starting with ``C`` shares ``key``'s
    partition, when ``key`` lies under one (``/a/b/x`` -> ``/a/b/``; ``name/x`` -> ``name/``)."""
    if key.startswith(LOCK_GRANT_PREFIX):
        # Grant records go with their lock's queue: ``\x00accord-lock/name/...`` shares
        # the partition of ``name/``; the bare prefix spans every lock (so every shard).
        inner = closed_prefix(key[len(LOCK_GRANT_PREFIX):])
        return None if inner is None else LOCK_GRANT_PREFIX + inner
    if b"/" not in key:
        return None  # a plain key: only itself
    p = partition_key(key)
    c = p + b"/"
    if key.startswith(b"/") and p.count(b"/") < 2:
        return None  # /a: the keys under /a/ have partitions /a/x, /a/y, ...
    return c if key.startswith(c) else None


def shards_of_range(key: bytes, range_end: bytes, shards: int) -> list[int]:
    """The shards that may hold keys of the etcd range ``[key, range_end)``.

    A single key (empty ``range_end``) is on one shard; so is a range inside one closed
    prefix (see :func:`closed_prefix`); any other range may touch every shard.
    """
    if shards == 1 or not range_end:
        return [shard_of(key, shards)]
    c = closed_prefix(key)
    if c is not None and range_end != b"\x00" and range_end <= _prefix_end(c):
        return [shard_of(key, shards)]
    return list(range(shards))


def op_range(op: rpc_pb2.RequestOp, kind: str | None) -> tuple[bytes, bytes] | None:
    """``(key, range_end)`` of a Txn's op holding request ``kind`` (a put: its key alone);
    None for a nested Txn or an empty op."""
    if kind == "request_put":
        return op.request_put.key, b""
    if kind == "request_range":
        return op.request_range.key, op.request_range.range_end
    if kind == "request_delete_range":
        return op.request_delete_range.key, op.request_delete_range.range_end
    return None


def _op_ranges(req: rpc_pb2.TxnRequest) -> Iterable[tuple[bytes, bytes]]:
    for cmp in req.compare:
        yield cmp.key, cmp.range_end
    for op in list(req.success) + list(req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_txn":
            yield from _op_ranges(op.request_txn)
        else:
            pair = op_range(op, kind)
            if pair is not None:
                yield pair


def shards_of_txn(req: rpc_pb2.TxnRequest, shards: int) -> dict[int, bytes]:
    """Every shard a Txn touches, each with one of its keys (to name in an error)."""
    out: dict[int, bytes] = {}
    for key, end in _op_ranges(req):
        for s in shards_of_range(key, end, shards):
            out.setdefault(s, key)
    return out


def txn_spans_shards(touched: dict[int, bytes]) -> EtcdError:
    """The error for a Txn whose keys lie on more than one shard."""
    names = ", ".join(
        f"{s} (key {k.decode('utf-8', 'backslashreplace')!r})" for s, k in sorted(touched.items())
    )
    return EtcdError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"accord: a Txn must stay within one shard, but its keys are on shards {names}; keys "
        "share a shard when they share a partition key (the first two segments of /a/b/..., "
        "the first segment of name/...), and a range inside a Txn must stay inside one",
    )
