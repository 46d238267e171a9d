"""Per-group snapshot files: chunked, CRC-checked, atomically installed, resumable transfer.

A node keeps its groups' state-machine snapshots under one root (the host uses
``<data_dir>/snap``): ``<root>/<group>/<term>-<index>.snap`` (term and index as
16 hex digits). Snapshots never pass through memory whole: the state machine
streams them to a ``SnapshotWriter`` in chunks, and a leader streams the file to a
lagging follower in chunks from a ``SnapshotStore.file_chunks`` iterator, which can
start at any offset (resume after a broken connection). The follower feeds the
pieces to a ``SnapshotReceiver``, which can be resumed at its ``offset`` (also
after a restart: the partial file is kept), verifies the CRC and installs the
file atomically.

File layout::

    header  : magic b"ACSN", version u8, 3 pad bytes, group u64, meta length u32
    meta    : msgpack [index, term, conf_state]
    data    : the state machine's bytes (any length)
    trailer : data length u64, crc32c u32, magic b"ACSE"

The CRC covers every byte before it (header, meta, data and the data length).

Durability: a file is written as ``*.tmp`` (or received as ``*.part``), fsynced,
renamed to ``*.snap`` and the directory fsynced. The WAL learns about a snapshot
(``WriteBatch.compact`` or ``install_snapshot``) only after ``finish()`` returned,
and older snapshots of the group are deleted (``prune``) only once the WAL's record
of the new one is durable: until then the log's marker still names the older file,
and recovery restores exactly the snapshot the log names (``find``), never a newer
file whose record a crash or power cut lost (that one's entries would be applied
twice). Leftover ``*.tmp`` files from a crash are removed when the store opens.

All methods do blocking file I/O: the host calls them off the event loop
(``asyncio.to_thread``).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import crc32c
import msgpack

from accord.raft.core.types import ConfState, SnapshotMeta
from accord.raft.storage.files import fsync_dir

__all__ = [
    "SnapshotCorruptError",
    "SnapshotInfo",
    "SnapshotReceiver",
    "SnapshotStore",
    "SnapshotWriter",
    "verify_file",
]

_HEADER = struct.Struct("<4sB3xQI")
_TRAILER = struct.Struct("<QI4s")
_MAGIC = b"ACSN"
_END_MAGIC = b"ACSE"
_VERSION = 1
_MAX_META = 1 << 20
DEFAULT_CHUNK = 1 << 20


class SnapshotCorruptError(Exception):
    """A snapshot file (or a received one) fails its format or CRC check."""


@dataclass(slots=True, frozen=True)
class SnapshotInfo:
    """A durable snapshot file."""

    group: int
    meta: SnapshotMeta
    path: Path
    size: int


def _file_name(meta: SnapshotMeta) -> str:
    return f"{meta.term:016x}-{meta.index:016x}"


def _parse_name(name: str, suffix: str) -> tuple[int, int] | None:
    """(term, index) from ``<term>-<index><suffix>``."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    parts = stem.split("-")
    if len(parts) != 2 or len(parts[0]) != 16 or len(parts[1]) != 16:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None


def _encode_head(group: int, meta: SnapshotMeta) -> bytes:
    cs = meta.conf_state
    body: bytes = msgpack.packb(
        [
            meta.index,
            meta.term,
            [
                list(cs.voters),
                list(cs.learners),
                list(cs.voters_outgoing),
                list(cs.learners_next),
                cs.auto_leave,
            ],
        ]
    )
    return _HEADER.pack(_MAGIC, _VERSION, group, len(body)) + body


def _read_head(f: BinaryIO, path: Path) -> tuple[int, SnapshotMeta, int]:
    """(group, meta, header length) of an open snapshot file."""
    read = f.read
    raw = read(_HEADER.size)
    if len(raw) < _HEADER.size:
        raise SnapshotCorruptError(f"{path}: file too short for a snapshot header")
    magic, version, group, mlen = _HEADER.unpack(raw)
    if magic != _MAGIC:
        raise SnapshotCorruptError(f"{path}: not a snapshot file (bad magic)")
    if version != _VERSION:
        raise SnapshotCorruptError(f"{path}: unsupported snapshot format version {version}")
    if mlen > _MAX_META:
        raise SnapshotCorruptError(f"{path}: implausible metadata length {mlen}")
    body = read(mlen)
    if len(body) < mlen:
        raise SnapshotCorruptError(f"{path}: metadata cut short")
    try:
        index, term, cs = msgpack.unpackb(body)
        meta = SnapshotMeta(
            int(index),
            int(term),
            ConfState(
                tuple(int(x) for x in cs[0]),
                tuple(int(x) for x in cs[1]),
                tuple(int(x) for x in cs[2]),
                tuple(int(x) for x in cs[3]),
                bool(cs[4]),
            ),
        )
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        raise SnapshotCorruptError(f"{path}: undecodable metadata ({exc})") from exc
    return int(group), meta, _HEADER.size + mlen


def verify_file(path: Path) -> tuple[int, SnapshotMeta]:
    """Check a snapshot file's structure and CRC without touching anything; (group, meta).

    Raises ``SnapshotCorruptError`` saying what is wrong."""
    return _verify(path)


def _verify(path: Path, chunk: int = DEFAULT_CHUNK) -> tuple[int, SnapshotMeta]:
    """Check the whole file's CRC and structure; (group, meta)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        group, meta, hlen = _read_head(f, path)
        if size < hlen + _TRAILER.size:
            raise SnapshotCorruptError(f"{path}: file too short for its trailer ({size} bytes)")
        f.seek(0)
        crc = 0
        remaining = size - 8  # the CRC and the end magic are not covered
        while remaining:
            buf = f.read(min(chunk, remaining))
            if not buf:
                raise SnapshotCorruptError(f"{path}: file shrank while reading")
            crc = crc32c.crc32c(buf, crc)
            remaining -= len(buf)
        f.seek(size - _TRAILER.size)
        dlen, want, end = _TRAILER.unpack(f.read(_TRAILER.size))
    if end != _END_MAGIC:
        raise SnapshotCorruptError(f"{path}: bad trailer (truncated or not a snapshot)")
    if dlen != size - hlen - _TRAILER.size:
        raise SnapshotCorruptError(
            f"{path}: trailer says {dlen} data bytes but the file holds "
            f"{size - hlen - _TRAILER.size}"
        )
    if crc != want:
        raise SnapshotCorruptError(f"{path}: CRC mismatch (file is damaged)")
    return group, meta


class SnapshotWriter:
    """Streams one snapshot to ``<term>-<index>.snap.tmp``; ``finish`` makes it durable."""

    def __init__(self, store: SnapshotStore, group: int, meta: SnapshotMeta) -> None:
        """Use ``SnapshotStore.writer``."""
        self._store = store
        self.group = group
        self.meta = meta
        gdir = store.group_dir(group, create=True)
        self._final = gdir / f"{_file_name(meta)}.snap"
        self._tmp = gdir / f"{_file_name(meta)}.snap.tmp"
        self._f = open(self._tmp, "wb")
        head = _encode_head(group, meta)
        self._f.write(head)
        self._crc = crc32c.crc32c(head)
        self._data_len = 0
        self._done = False

    def write(self, chunk: bytes) -> None:
        """Append a chunk of state-machine data."""
        if self._done:
            raise ValueError("snapshot writer already finished or aborted")
        self._f.write(chunk)
        self._crc = crc32c.crc32c(chunk, self._crc)
        self._data_len += len(chunk)

    def finish(self) -> SnapshotInfo:
        """Write the trailer, fsync, rename into place, fsync the directory, drop older ones."""
        if self._done:
            raise ValueError("snapshot writer already finished or aborted")
        self._done = True
        dlen = self._data_len.to_bytes(8, "little")
        crc = crc32c.crc32c(dlen, self._crc)
        self._f.write(dlen + crc.to_bytes(4, "little") + _END_MAGIC)
        try:
            self._f.flush()
            if self._store.sync:
                os.fsync(self._f.fileno())
        finally:
            self._f.close()
        return self._store._install(self.group, self.meta, self._tmp, self._final)

    def abort(self) -> None:
        """Give up: delete the temporary file."""
        if self._done:
            return
        self._done = True
        self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:
            self.abort()


class SnapshotReceiver:
    """Receives a snapshot file in (offset, chunk) pieces; resumable; verifies before install.

    The partial file ``<term>-<index>.part`` survives restarts, so a new receiver for
    the same snapshot resumes at ``offset``. Pieces must arrive in order: a piece at
    an offset below ``offset`` overwrites from there (a resent piece); one above it
    is refused (a gap).
    """

    def __init__(self, store: SnapshotStore, group: int, meta: SnapshotMeta) -> None:
        """Use ``SnapshotStore.receiver``."""
        self._store = store
        self.group = group
        self.meta = meta
        gdir = store.group_dir(group, create=True)
        self._part = gdir / f"{_file_name(meta)}.part"
        self._final = gdir / f"{_file_name(meta)}.snap"
        for p in gdir.iterdir():
            if p.name.endswith(".part") and p != self._part:
                p.unlink(missing_ok=True)
        self._f = open(self._part, "ab")
        self._f.seek(0, os.SEEK_END)
        self._offset = self._f.tell()
        self._done = False

    @property
    def offset(self) -> int:
        """How many bytes of the file are here: the sender resumes from this offset."""
        return self._offset

    def write(self, offset: int, chunk: bytes) -> None:
        """Store the piece of the file that starts at ``offset``."""
        if self._done:
            raise ValueError("snapshot receiver already finished or aborted")
        if offset < 0 or offset > self._offset:
            raise ValueError(
                f"snapshot piece at offset {offset} does not follow the received "
                f"{self._offset} bytes; resend from offset {self._offset}"
            )
        if offset < self._offset:
            self._f.flush()
            self._f.truncate(offset)
            self._f.seek(offset)
        self._f.write(chunk)
        self._offset = offset + len(chunk)

    def finish(self) -> SnapshotInfo:
        """Verify the whole file (CRC, group, metadata) and install it atomically.

        On a failed check the partial file is deleted and ``SnapshotCorruptError``
        raised: the transfer must restart from offset 0.
        """
        if self._done:
            raise ValueError("snapshot receiver already finished or aborted")
        self._done = True
        try:
            self._f.flush()
            if self._store.sync:
                os.fsync(self._f.fileno())
        finally:
            self._f.close()
        try:
            group, meta = _verify(self._part)
            if group != self.group or meta != self.meta:
                raise SnapshotCorruptError(
                    f"{self._part}: received snapshot is for group {group} at "
                    f"{meta.term}/{meta.index}, expected group {self.group} at "
                    f"{self.meta.term}/{self.meta.index}"
                )
        except (SnapshotCorruptError, OSError):
            self._part.unlink(missing_ok=True)
            raise
        return self._store._install(self.group, self.meta, self._part, self._final)

    def abort(self) -> None:
        """Give up and delete the partial file (no resume)."""
        if self._done:
            return
        self._done = True
        self._f.close()
        self._part.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop receiving but keep the partial file, to resume later."""
        if not self._done:
            self._done = True
            self._f.close()


class SnapshotStore:
    """The snapshot files of every group of a node (see the module docstring)."""

    def __init__(self, root: Path | str, *, sync: bool = True) -> None:
        """Open (creating) the store and remove temporary files left by a crash."""
        self.root = Path(root)
        self.sync = sync
        if not self.root.exists():
            self.root.mkdir(parents=True)
            if sync:
                fsync_dir(self.root.parent)
        for gdir in self.root.iterdir():
            if gdir.is_dir():
                for p in gdir.glob("*.snap.tmp"):
                    p.unlink()

    def group_dir(self, group: int, *, create: bool = False) -> Path:
        """The directory holding ``group``'s snapshots."""
        if not isinstance(group, int) or group <= 0:
            raise ValueError(f"group id must be a positive integer, got {group!r}")
        d = self.root / str(group)
        if create and not d.exists():
            d.mkdir()
            if self.sync:
                fsync_dir(self.root)
        return d

    def writer(self, group: int, meta: SnapshotMeta) -> SnapshotWriter:
        """Start writing a snapshot of ``group`` at ``meta``."""
        return SnapshotWriter(self, group, meta)

    def receiver(self, group: int, meta: SnapshotMeta) -> SnapshotReceiver:
        """Start (or resume) receiving a snapshot of ``group`` at ``meta``."""
        return SnapshotReceiver(self, group, meta)

    def snapshots(self, group: int) -> list[SnapshotInfo]:
        """The group's durable snapshots, oldest first (by index, then term)."""
        d = self.group_dir(group)
        if not d.exists():
            return []
        found: list[tuple[int, int, Path]] = []
        for p in d.iterdir():
            ti = _parse_name(p.name, ".snap")
            if ti is not None:
                found.append((ti[1], ti[0], p))
        found.sort()
        out = []
        for _, _, p in found:
            info = self._info(p)
            if info is not None:
                out.append(info)
        return out

    def _info(self, p: Path) -> SnapshotInfo | None:
        """The snapshot file ``p``, or None if it is gone (pruned meanwhile)."""
        try:
            with open(p, "rb") as f:
                g, meta, _ = _read_head(f, p)
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return None
        return SnapshotInfo(g, meta, p, size)

    def find(self, group: int, meta: SnapshotMeta) -> SnapshotInfo | None:
        """The group's durable snapshot at exactly ``meta``'s index and term, if any."""
        info = self._info(self.group_dir(group) / f"{_file_name(meta)}.snap")
        if info is None or info.meta.index != meta.index or info.meta.term != meta.term:
            return None
        return info

    def prune(self, group: int, keep: SnapshotMeta) -> int:
        """Delete the group's snapshots (and transfers) older than ``keep``; returns how
        many. Call it once the WAL's record of ``keep`` is durable."""
        d = self.group_dir(group)
        if not d.exists():
            return 0
        removed = 0
        for p in d.iterdir():
            ti = _parse_name(p.name, ".snap") or _parse_name(p.name, ".part")
            if ti is not None and (ti[1], ti[0]) < (keep.index, keep.term):
                p.unlink(missing_ok=True)
                removed += 1
        if removed and self.sync:
            fsync_dir(d)
        return removed

    def latest(self, group: int) -> SnapshotInfo | None:
        """The group's newest durable snapshot, if any."""
        snaps = self.snapshots(group)
        return snaps[-1] if snaps else None

    def groups(self) -> list[int]:
        """Every group with a snapshot directory."""
        return sorted(int(p.name) for p in self.root.iterdir() if p.is_dir() and p.name.isdigit())

    def verify(self, info: SnapshotInfo) -> None:
        """Check a snapshot file's structure and CRC; raises ``SnapshotCorruptError``."""
        group, meta = _verify(info.path)
        if group != info.group or meta != info.meta:
            raise SnapshotCorruptError(f"{info.path}: header does not match its name")

    def file_chunks(
        self, info: SnapshotInfo, offset: int = 0, chunk_size: int = DEFAULT_CHUNK
    ) -> Iterator[tuple[int, bytes]]:
        """The raw file as (offset, chunk) pieces from ``offset`` (for sending/resuming)."""
        if offset < 0 or offset > info.size:
            raise ValueError(f"offset {offset} outside the snapshot file of {info.size} bytes")
        with open(info.path, "rb") as f:
            f.seek(offset)
            pos = offset
            while pos < info.size:
                buf = f.read(min(chunk_size, info.size - pos))
                if not buf:
                    raise SnapshotCorruptError(f"{info.path}: file shrank while sending")
                yield pos, buf
                pos += len(buf)

    def data_chunks(self, info: SnapshotInfo, chunk_size: int = DEFAULT_CHUNK) -> Iterator[bytes]:
        """The state machine's data in chunks; raises at the end if the CRC does not match.

        The consumer must not commit what it restored until the iterator is exhausted.
        """
        with open(info.path, "rb") as f:
            _, _, hlen = _read_head(f, info.path)
            dlen = info.size - hlen - _TRAILER.size
            if dlen < 0:
                raise SnapshotCorruptError(f"{info.path}: file too short for its trailer")
            f.seek(0)
            crc = crc32c.crc32c(f.read(hlen))
            remaining = dlen
            while remaining:
                buf = f.read(min(chunk_size, remaining))
                if not buf:
                    raise SnapshotCorruptError(f"{info.path}: file shrank while reading")
                crc = crc32c.crc32c(buf, crc)
                remaining -= len(buf)
                yield buf
            trailer = f.read(_TRAILER.size)
        if len(trailer) != _TRAILER.size:
            raise SnapshotCorruptError(f"{info.path}: trailer cut short")
        got_len, want, end = _TRAILER.unpack(trailer)
        crc = crc32c.crc32c(trailer[:8], crc)
        if end != _END_MAGIC or got_len != dlen or crc != want:
            raise SnapshotCorruptError(f"{info.path}: CRC or trailer mismatch (file is damaged)")

    def remove_group(self, group: int) -> None:
        """Delete every snapshot of a group that left this node."""
        d = self.group_dir(group)
        if d.exists():
            shutil.rmtree(d)
            if self.sync:
                fsync_dir(self.root)

    def _install(self, group: int, meta: SnapshotMeta, src: Path, final: Path) -> SnapshotInfo:
        os.replace(src, final)
        if self.sync:
            fsync_dir(final.parent)
        # Older snapshots stay until the WAL recorded this one (``prune``).
        return SnapshotInfo(group, meta, final, final.stat().st_size)
