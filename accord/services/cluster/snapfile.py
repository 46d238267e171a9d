"""accord's backup file: a bbolt database in etcd's layout plus every group's state.

``accord snapshot save`` and ``etcdctl snapshot save`` against accord both receive this
file (``Maintenance.Snapshot`` streams it). It is what ``etcdctl snapshot save`` gets
from etcd, a bbolt file followed by the SHA-256 of that file, so etcd's tools read it:

* buckets ``key``, ``meta`` and ``lease`` hold the KV shards in etcd's layout
  (``accord/services/kv/etcdformat.py``): ``etcdctl snapshot status`` reports on them and
  ``etcdctl snapshot restore`` builds an etcd member from them;
* bucket ``accord`` holds ``format`` (this file format's version, ASCII), ``revision``
  (u64, the store's revision when saved), ``kv_groups`` (msgpack list of the KV shards'
  Raft group ids, in shard order) and ``version`` (the accord that wrote it);
* bucket ``accord_groups`` holds, for every replicated state machine of the member
  (group id as u64 big-endian -> the machine's own snapshot image), the state of each:
  the member table and shard map, each KV shard, the scheduler, and any service added
  later. A service joins the backup by being a Raft group of the node, with no change
  here: the saving side walks the host's groups and the restoring side writes each image
  back as that group's Raft snapshot.

The KV state is thus stored twice (etcd's layout, and each shard's own image, which also
keeps lease clocks and id seeds exactly): the file is about twice the KV image in size,
the price of etcd's tools reading it.

A file without the ``accord`` bucket is an etcd backup: :func:`decode` returns its
buckets and the restore builds the KV shards from them (``etcdformat.from_etcd``).

Checks, in order, each refusing with a message that names what is wrong: the size
(32 more than a multiple of 512: data plus SHA-256 trailer; a bbolt file copied from a
data directory has no trailer and needs ``skip_hash_check``), the SHA-256, the bbolt
pages (``bbolt.py``), the format version, and every group image's presence.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import crc32c
import msgpack

from accord import __version__
from accord.services.cluster import bbolt
from accord.services.kv import etcdformat
from accord.services.kv.etcdformat import Buckets

FORMAT = 1
"""The version of this file format (bucket ``accord``, key ``format``)."""
KV_SHARD0_GROUP = 2
"""The Raft group id a node keeps KV shard 0 in (``accord.node.backend.KV_GROUP``); a
single-store backend's backup names its store so, and restores as that shard."""
ACCORD_BUCKET = b"accord"
GROUPS_BUCKET = b"accord_groups"
_U64 = struct.Struct(">Q")
_HASH = hashlib.sha256().digest_size


class SnapshotFileError(ValueError):
    """A snapshot file that cannot be used; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """A decoded backup: accord's own (``origin == "accord"``) or etcd's."""

    origin: str
    format: int
    """This file format's version (0 for an etcd file)."""
    revision: int
    groups: dict[int, bytes] = field(default_factory=dict)
    """Group id -> state machine image (empty for an etcd file)."""
    kv_groups: tuple[int, ...] = ()
    buckets: Buckets = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SnapshotStatus:
    """What ``accord snapshot status`` reports; hash, revision, total_key and total_size
    are computed as ``etcdctl snapshot status`` computes them, so both tools agree."""

    hash: int
    revision: int
    total_key: int
    total_size: int
    keys: int
    """Live KV keys at the snapshot's revision."""
    origin: str
    format: int
    groups: int

    def as_dict(self) -> dict[str, object]:
        return {"hash": self.hash, "revision": self.revision, "totalKey": self.total_key,
                "totalSize": self.total_size, "keys": self.keys, "origin": self.origin,
                "format": self.format, "groups": self.groups}


def encode(revision: int, groups: Mapping[int, bytes], kv_groups: Sequence[int]) -> bytes:
    """The backup file of ``groups`` (id -> image); ``kv_groups`` lists the KV shards'."""
    missing = [g for g in kv_groups if g not in groups]
    if missing:
        raise ValueError(f"KV groups {missing} have no image")
    buckets = etcdformat.to_etcd([groups[g] for g in kv_groups])
    buckets[ACCORD_BUCKET] = {
        b"format": str(FORMAT).encode(),
        b"revision": _U64.pack(revision),
        b"kv_groups": bytes(msgpack.packb(list(kv_groups))),
        b"version": __version__.encode(),
    }
    buckets[GROUPS_BUCKET] = {_U64.pack(g): bytes(img) for g, img in groups.items()}
    db = bbolt.write_db(buckets)
    return db + hashlib.sha256(db).digest()


def _database(data: bytes, skip_hash_check: bool) -> bytes:
    if len(data) % 512 == _HASH:
        db, digest = data[:-_HASH], data[-_HASH:]
        if not skip_hash_check and hashlib.sha256(db).digest() != digest:
            raise SnapshotFileError(
                "snapshot file is corrupt: its SHA-256 trailer does not match its contents")
        return db
    if skip_hash_check:
        return data
    raise SnapshotFileError(
        f"snapshot file is truncated or has no SHA-256 trailer: its size ({len(data)} "
        "bytes) is not 32 more than a multiple of 512 (a db file copied from a data "
        "directory has no trailer: pass --skip-hash-check to use it)")


def _read(data: bytes, skip_hash_check: bool) -> tuple[bbolt.BoltDB, Buckets]:
    db = _database(data, skip_hash_check)
    try:
        parsed = bbolt.read_db(db)
    except bbolt.BoltError as e:
        raise SnapshotFileError(f"snapshot file is corrupt: {e}") from None
    return parsed, parsed.buckets


def decode(data: bytes, *, skip_hash_check: bool = False) -> SnapshotFile:
    """Check and decode a backup file (accord's or etcd's)."""
    return _decode(_read(data, skip_hash_check)[1])


def _decode(buckets: Buckets) -> SnapshotFile:
    meta = buckets.get(ACCORD_BUCKET)
    if meta is None:
        if etcdformat.KEY_BUCKET not in buckets:
            raise SnapshotFileError(
                "not a snapshot: the bbolt file has neither accord's nor etcd's buckets")
        try:
            rev = etcdformat.etcd_revision(buckets)
        except etcdformat.EtcdFormatError as e:
            raise SnapshotFileError(f"etcd snapshot is corrupt: {e}") from None
        return SnapshotFile("etcd", 0, rev, buckets=buckets)
    try:
        fmt = int(meta[b"format"])
        revision = _U64.unpack(meta[b"revision"])[0]
        kv_groups = tuple(int(g) for g in msgpack.unpackb(meta[b"kv_groups"]))
    except (KeyError, ValueError, TypeError, struct.error, msgpack.UnpackException) as e:
        raise SnapshotFileError(f"snapshot file is corrupt: bucket 'accord' is malformed ({e!r})"
                                ) from None
    if fmt != FORMAT:
        raise SnapshotFileError(
            f"snapshot file format {fmt} is not supported by this accord (it reads format "
            f"{FORMAT}); restore it with the accord version that wrote it "
            f"({meta.get(b'version', b'?').decode(errors='replace')}) or newer")
    images = buckets.get(GROUPS_BUCKET, {})
    groups: dict[int, bytes] = {}
    for k, v in images.items():
        if len(k) != _U64.size:
            raise SnapshotFileError(f"snapshot file is corrupt: bad group key {k.hex()}")
        groups[_U64.unpack(k)[0]] = v
    lost = [g for g in kv_groups if g not in groups]
    if lost:
        raise SnapshotFileError(f"snapshot file is corrupt: KV groups {lost} have no state")
    return SnapshotFile("accord", fmt, revision, groups, kv_groups, buckets)


def status(data: bytes, *, skip_hash_check: bool = False) -> SnapshotStatus:
    """Check a backup file and report on it (see :class:`SnapshotStatus`)."""
    db, buckets = _read(data, skip_hash_check)
    snap = _decode(buckets)
    crc = 0
    total = 0
    for name in sorted(buckets):  # etcdctl walks the root bucket in key order
        crc = crc32c.crc32c(name, crc)
        for k, v in buckets[name].items():
            crc = crc32c.crc32c(v, crc32c.crc32c(k, crc))
            total += 1
    return SnapshotStatus(
        hash=int(crc), revision=etcdformat.etcd_revision(buckets), total_key=total,
        total_size=db.size, keys=_live_keys(buckets), origin=snap.origin, format=snap.format,
        groups=len(snap.groups))


def _live_keys(buckets: Mapping[bytes, Mapping[bytes, bytes]]) -> int:
    """Keys whose latest version in the ``key`` bucket is not a deletion."""
    latest: dict[bytes, bool] = {}
    for k, v in (buckets.get(etcdformat.KEY_BUCKET) or {}).items():
        _main, _sub, tomb = etcdformat.parse_rev_key(k)
        latest[etcdformat.record_key(v)] = not tomb
    return sum(latest.values())
