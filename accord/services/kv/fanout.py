"""Merging the answers of several shards into the one answer etcd would give.

A range over many shards asks each shard for the same range at the same revision R
(each shard holds only its own keys), then merges here: counts add up, key-value pairs
are sorted as the request asks and cut to its limit, ``more`` says whether any were
left out. A DeleteRange over many shards adds up what each shard deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import crc32c

from accord.proto import kv_pb2, rpc_pb2
from accord.services.kv import errors
from accord.services.kv.limits import Limits

RR = rpc_pb2.RangeRequest

_KV_OVERHEAD = 32
"""Bytes counted per pair besides key and value, as the single-shard size check does."""


def _sort_key(target: int) -> Callable[[kv_pb2.KeyValue], Any]:
    if target == RR.VERSION:
        return lambda kv: kv.version
    if target == RR.CREATE:
        return lambda kv: kv.create_revision
    if target == RR.MOD:
        return lambda kv: kv.mod_revision
    if target == RR.VALUE:
        return lambda kv: kv.value
    return lambda kv: kv.key


def per_shard_request(req: rpc_pb2.RangeRequest, revision: int) -> rpc_pb2.RangeRequest:
    """The request each shard answers: the same range, pinned at ``revision``."""
    sub = rpc_pb2.RangeRequest()
    sub.CopyFrom(req)
    sub.revision = revision
    return sub


def serializable_revision(rev: int, reserved: Iterable[int]) -> int:
    """The revision a serializable read over several shards answers at, from the one it
    would (``rev``) and, per shard, the lowest revision an open intent over its keys
    reserved there (``reserved``; 0: none). Such a Txn commits at or above its
    reservation and may already be visible on a shard whose replica applied its
    decision while this one still holds the intent: read at ``rev`` it would show part
    of the Txn. Below the lowest such reservation at or below ``rev``, the Txn is on no
    shard (``docs/txn.md``, "Who meets an intent")."""
    low = min((r for r in reserved if 0 < r <= rev), default=0)
    return low - 1 if low else rev


def merge_ranges(
    req: rpc_pb2.RangeRequest,
    parts: Sequence[rpc_pb2.RangeResponse],
    revision: int,
    limits: Limits,
) -> rpc_pb2.RangeResponse:
    """One RangeResponse from the shards' answers to :func:`per_shard_request`."""
    resp = rpc_pb2.RangeResponse(count=sum(p.count for p in parts))
    resp.header.revision = revision
    if req.count_only:
        return resp
    kvs: list[kv_pb2.KeyValue] = [kv for p in parts for kv in p.kvs]
    kvs.sort(key=lambda kv: kv.key)
    order = req.sort_order
    if req.sort_target != RR.KEY and order == RR.NONE:
        order = RR.ASCEND
    if order in (RR.ASCEND, RR.DESCEND) and not (
        req.sort_target == RR.KEY and order == RR.ASCEND
    ):
        kvs.sort(key=_sort_key(req.sort_target), reverse=order == RR.DESCEND)
    more = any(p.more for p in parts)
    if req.limit > 0 and len(kvs) > req.limit:
        del kvs[req.limit :]
        more = True
    size = 0
    cap = limits.max_range_result_bytes
    for kv in kvs:
        size += len(kv.key) + _KV_OVERHEAD + len(kv.value)
        if size > cap:
            raise errors.range_too_large(size, cap)
    resp.kvs.extend(kvs)
    resp.more = more
    return resp


def merge_deletes(
    parts: Sequence[rpc_pb2.DeleteRangeResponse],
) -> rpc_pb2.DeleteRangeResponse:
    """One DeleteRangeResponse from each shard's part (header: the highest revision)."""
    resp = rpc_pb2.DeleteRangeResponse(deleted=sum(p.deleted for p in parts))
    prev = [kv for p in parts for kv in p.prev_kvs]
    prev.sort(key=lambda kv: kv.key)
    resp.prev_kvs.extend(prev)
    resp.header.revision = max(p.header.revision for p in parts)
    return resp


def combine_hashes(hashes: Sequence[int]) -> int:
    """A 32-bit hash of the shards' hashes, in shard order (one shard: its own hash)."""
    if len(hashes) == 1:
        return int(hashes[0])
    return int(crc32c.crc32c(b"".join(int(h).to_bytes(4, "big") for h in hashes)))
