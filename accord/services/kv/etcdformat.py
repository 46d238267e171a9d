"""The KV shards' state in etcd's backend layout, and back.

etcd keeps its MVCC store in a bbolt file (``bbolt.py`` reads and writes the pages); this
module maps the *contents* of its buckets to and from the images
:meth:`KVStateMachine.prepare_snapshot` makes, so a snapshot can move either way:

* ``key``: one entry per version of a key. The bucket key is the revision, 8-byte
  big-endian main revision, ``_``, 8-byte big-endian sub-revision, and ``t`` appended
  for a deletion; the value is the ``mvccpb.KeyValue`` of that version (a tombstone's
  holds only the key), as etcd writes them.
* ``meta``: ``consistent_index`` (u64) and, once compacted, ``scheduledCompactRev`` and
  ``finishedCompactRev`` (a 17-byte revision).
* ``lease``: 8-byte big-endian lease id -> ``leasepb.Lease`` (id, granted TTL and, as
  etcd's checkpoints leave it, the remaining TTL).

accord with several shards keeps one history per shard over one revision space; in etcd's
layout they become one history. The changes of one revision from several shards (a
multi-shard Txn, or a revision two shards both wrote before revisions were striped) are
numbered by their sub-revisions, then key: a multi-shard Txn's in its operation order, as
etcd numbers them. Going back, each key goes to the shard ``sharding.shard_of``
names, every shard starts at the snapshot's revision, leases live on shard 0 (their home)
and on every shard holding a key attached to them.

Lease clocks: etcd keeps no deadlines in its file, only TTLs. An imported lease gets its
remaining TTL (or, never checkpointed, its full TTL) from the restore on, which is what
etcd itself does for leases when a member restarts.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from accord.proto import kv_pb2, lease_pb2
from accord.services.kv import sharding
from accord.services.kv.mvcc import CREATE, LEASE, MOD, SUB, VALUE, VERSION
from accord.services.kv.statemachine import SNAPSHOT_FORMAT as KV_IMAGE_FORMAT

KEY_BUCKET = b"key"
META_BUCKET = b"meta"
LEASE_BUCKET = b"lease"
CONSISTENT_INDEX = b"consistent_index"
SCHEDULED_COMPACT = b"scheduledCompactRev"
FINISHED_COMPACT = b"finishedCompactRev"

_REV = struct.Struct(">Q")
_TOMBSTONE = b"t"

Buckets = dict[bytes, dict[bytes, bytes]]


class EtcdFormatError(ValueError):
    """etcd bucket contents that cannot be read; the message names the entry."""


def rev_key(main: int, sub: int, tombstone: bool = False) -> bytes:
    """etcd's bucket key for revision ``(main, sub)``."""
    return _REV.pack(main) + b"_" + _REV.pack(sub) + (_TOMBSTONE if tombstone else b"")


def parse_rev_key(k: bytes) -> tuple[int, int, bool]:
    """``(main, sub, tombstone)`` of an etcd revision key."""
    if len(k) not in (17, 18) or k[8:9] != b"_" or (len(k) == 18 and k[17:] != _TOMBSTONE):
        raise EtcdFormatError(f"bucket 'key': {k.hex()} is not an etcd revision key")
    return _REV.unpack_from(k, 0)[0], _REV.unpack_from(k, 9)[0], len(k) == 18


def record_key(value: bytes) -> bytes:
    """The key of a ``key``-bucket value (its ``mvccpb.KeyValue``)."""
    kv = kv_pb2.KeyValue()
    try:
        kv.ParseFromString(value)
    except Exception as e:  # protobuf's DecodeError
        raise EtcdFormatError(f"bucket 'key': bad KeyValue: {e}") from e
    return kv.key


def _unpack_image(image: bytes) -> tuple[list[Any], list[Any]]:
    """The store and lease parts of a shard's image. Its multi-shard transaction tables
    (the optional last part: open intents, records of decided Txns) have no place in
    etcd's layout and are left out: a backup's cut waits out every intent at or below its
    revision (``StateMachineBackend.cut_revision``), so no write of a Txn is missing."""
    fmt, store, leases, *_transactions = msgpack.unpackb(image, raw=False)
    if fmt != KV_IMAGE_FORMAT:
        raise EtcdFormatError(f"KV snapshot format {fmt} cannot be written in etcd's layout")
    return store, leases


def to_etcd(images: Sequence[bytes]) -> Buckets:
    """etcd's ``key``, ``meta`` and ``lease`` buckets holding the shards' ``images``."""
    changes: dict[int, list[tuple[int, int, bytes, list[Any]]]] = {}
    compact = -1
    leases: dict[int, tuple[int, int]] = {}
    for shard, image in enumerate(images):
        (_rev, compact_rev, entries), (clock_ms, _term, _seed, _seq, rows) = _unpack_image(image)
        compact = max(compact, compact_rev)
        for key, recs in entries:
            for rec in recs:
                changes.setdefault(rec[MOD], []).append((shard, rec[SUB], key, rec))
        for lid, ttl, deadline, _keys in rows:
            remaining = max(0, (deadline - clock_ms) // 1000)
            if lid not in leases or shard == 0:
                leases[lid] = (ttl, remaining)
    key_bucket: dict[bytes, bytes] = {}
    for main in sorted(changes):
        # By sub-revision, then key: a multi-shard Txn's changes in its operation order
        # (each shard's share numbers them by their operation's place in the Txn).
        at_main = sorted(changes[main], key=lambda c: (c[1], c[2], c[0]))
        for sub, (_shard, _s, key, rec) in enumerate(at_main):
            if rec[VALUE] is None:
                kv = kv_pb2.KeyValue(key=key)
                key_bucket[rev_key(main, sub, True)] = kv.SerializeToString()
            else:
                kv = kv_pb2.KeyValue(
                    key=key, create_revision=rec[CREATE], mod_revision=main,
                    version=rec[VERSION], value=rec[VALUE], lease=rec[LEASE])
                key_bucket[rev_key(main, sub)] = kv.SerializeToString()
    meta = {CONSISTENT_INDEX: _REV.pack(0)}
    if compact > 0:
        meta[SCHEDULED_COMPACT] = meta[FINISHED_COMPACT] = rev_key(compact, 0)
    lease_bucket = {
        _REV.pack(lid): lease_pb2.Lease(ID=lid, TTL=ttl, RemainingTTL=remaining).SerializeToString()
        for lid, (ttl, remaining) in leases.items()
    }
    return {KEY_BUCKET: key_bucket, META_BUCKET: meta, LEASE_BUCKET: lease_bucket}


def etcd_revision(buckets: Mapping[bytes, Mapping[bytes, bytes]]) -> int:
    """The revision ``etcdctl snapshot status`` reports: the last key version's."""
    keys = buckets.get(KEY_BUCKET) or {}
    return parse_rev_key(max(keys))[0] if keys else 0


def _compact_rev(meta: Mapping[bytes, bytes]) -> int:
    raw = meta.get(FINISHED_COMPACT)
    if raw is None:
        return -1
    return parse_rev_key(raw)[0]


def from_etcd(buckets: Mapping[bytes, Mapping[bytes, bytes]], shards: int,
              lease_seeds: Sequence[int]) -> tuple[int, list[bytes]]:
    """``(revision, one KV image per shard)`` from etcd's buckets.

    ``lease_seeds[i]`` is shard ``i``'s lease id seed (the node's choice)."""
    if shards < 1 or len(lease_seeds) != shards:
        raise ValueError("need one lease seed per shard")
    if KEY_BUCKET not in buckets:
        raise EtcdFormatError("not an etcd backend: it has no 'key' bucket")
    hist: list[dict[bytes, list[tuple[int, int, int, int, bytes | None, int]]]] = [
        {} for _ in range(shards)]
    rev = 1
    for k, v in buckets[KEY_BUCKET].items():  # revision order (bbolt keeps keys sorted)
        main, sub, tomb = parse_rev_key(k)
        kv = kv_pb2.KeyValue()
        try:
            kv.ParseFromString(v)
        except Exception as e:  # protobuf's DecodeError
            raise EtcdFormatError(f"bucket 'key' at revision {main}: bad KeyValue: {e}") from e
        if not kv.key:
            raise EtcdFormatError(f"bucket 'key' at revision {main}: KeyValue without a key")
        rec = ((main, sub, 0, 0, None, 0) if tomb
               else (main, sub, kv.create_revision, kv.version, kv.value, kv.lease))
        hist[sharding.shard_of(kv.key, shards)].setdefault(kv.key, []).append(rec)
        rev = max(rev, main)
    compact = _compact_rev(buckets.get(META_BUCKET) or {})
    rev = max(rev, compact)
    granted: dict[int, tuple[int, int]] = {}
    for k, v in (buckets.get(LEASE_BUCKET) or {}).items():
        lease = lease_pb2.Lease()
        try:
            lease.ParseFromString(v)
        except Exception as e:
            raise EtcdFormatError(f"bucket 'lease' entry {k.hex()}: bad Lease: {e}") from e
        granted[lease.ID] = (lease.TTL, lease.RemainingTTL if lease.RemainingTTL > 0 else lease.TTL)
    images = []
    for shard in range(shards):
        attached: dict[int, list[bytes]] = {}
        entries = []
        for key in sorted(hist[shard]):
            recs = hist[shard][key]
            entries.append([key, recs])
            last = recs[-1]
            if last[VALUE] is not None and last[LEASE] in granted:
                attached.setdefault(last[LEASE], []).append(key)
        rows = [[lid, ttl, remaining * 1000, sorted(attached.get(lid, ()))]
                for lid, (ttl, remaining) in sorted(granted.items())
                if shard == 0 or lid in attached]
        image = [KV_IMAGE_FORMAT, [rev, compact, entries], [0, 0, lease_seeds[shard], 0, rows]]
        images.append(bytes(msgpack.packb(image, use_bin_type=True)))
    return rev, images
