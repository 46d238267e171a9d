"""On-disk format of the shared write-ahead log: records, segments, scanning, replay.

This module is the asyncio-free, thread-free core of ``wal.py``: ``WriteBatch``
collects per-group operations, which become records (bytes); segment files turn
back into records, which replay into each group's ``PersistentState``. ``wal.py`` adds the
writer thread and group commit on top; ``walcheck.py`` reuses the scanner to
report damage without changing anything.

Segment file ``<seq as 16 hex digits>.wal``::

    header (20 bytes): magic b"ACWL", version u8, 3 pad bytes, seq u64, crc32c u32
                       (the CRC covers the 16 bytes before it)
    records...

Record (20-byte header, then a msgpack payload)::

    magic u8 (0xAC), version u8 (1), type u8, pad u8, group u64, length u32, crc32c u32

The CRC covers the segment's sequence number and the record's byte offset in the
file (16 bytes that are not stored), then the first 16 header bytes, then the
payload. Binding the CRC to the record's position means a record that happens
to be embedded in another record's payload (a user value, say) never validates
where it does not belong, so a torn tail cannot be mistaken for corruption by a
crafted value.

Record types and payloads (all msgpack):

* ``ENTRIES``: ``[first_index, [term, type, data, term, type, data, ...]]``. The
  first entry truncates any existing entries of the group at index >= first_index
  (the conflicting-suffix rule of Raft); indexes are implicit and contiguous.
* ``HARD_STATE``: ``[term, vote, commit]``; the latest record wins.
* ``SNAPSHOT``: a snapshot was installed: ``[index, term, conf_state]``; the group's
  log is reset to start after ``index``.
* ``COMPACT``: a durable snapshot exists at ``[index, term, conf_state]``; entries up
  to ``index`` are dropped, later ones are kept.
* ``CONF_STATE``: ``[index, conf_state]``: the membership in force as of applied
  ``index``; the record with the highest index (or the snapshot, if newer) wins.
* ``REMOVE_GROUP``: ``[]``: the group is gone from this node; everything it had
  before this record is dead.

Preallocation: a segment file is created at its full size (its "room"), the header
followed by written zeros, and made durable before any record goes into it (see
``wal.py`` for why written zeros rather than ``posix_fallocate``). Records then
overwrite the zeros from the front; the file's size never changes while it is in use.
A segment being prepared lives under ``<seq as 16 hex digits>.wal.prep`` and is
renamed to its final name when the log starts using it; a leftover ``.prep`` file
is a crash's half-prepared segment: never part of the log, removed by recovery.

The end of a segment's records: the first offset where no valid record starts,
*if every byte from there to the end of the file is zero* (the untouched
preallocated tail; or simply the end of the file). This holds in any segment: a
rotated segment keeps its zero tail (cutting it off would put an ``ftruncate`` and
an fsync on the writer's path for no gain). The check is a chunked ``memcmp``
against a zero block, not a Python loop over bytes.

Torn tail versus corruption: a bad record (short, bad magic, bad length or bad
CRC) in the *last* segment that is followed by non-zero bytes (or is non-zero
itself) but by no valid record is a torn write from a crash: recovery zeroes it
(back to the preallocated state, durably). Any other bad spot is corruption and
recovery refuses to start with an error that names the file, the offset and the
group: a bad record followed by a valid one (a bit flip, or a zeroed sector: zeros
where a record header should be are the end of the log only when *nothing* but
zeros follows), and any bad spot in a segment other than the last. A last segment
shorter than its header is a crash while creating it (written by a version without
preallocation) and is removed; a full-size segment with a bad header, even one of
all zeros, is damage (a prepared segment gets its name only once its header is
durable).

Known limit (as before preallocation): damage confined to the very end of the last
segment, after which no valid record follows, cannot be told from a torn write and
is wiped as one.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import crc32c
import msgpack

from accord.raft.core.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    PersistentState,
    SnapshotMeta,
)

FORMAT_VERSION = 1
SEGMENT_MAGIC = b"ACWL"
SEGMENT_SUFFIX = ".wal"
RECORD_MAGIC = 0xAC
SEGMENT_HEADER = struct.Struct("<4sB3xQI")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 20
RECORD_HEADER = struct.Struct("<BBBxQII")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 20
_RECORD_PREFIX = struct.Struct("<BBBxQI")  # the 16 header bytes the CRC covers
_POSITION = struct.Struct("<QQ")
_CRC_INPUT = struct.Struct("<QQBBBxQI")  # position, then the 16 covered header bytes
MAX_PAYLOAD = 1 << 30
_RECORD_START = bytes([RECORD_MAGIC, FORMAT_VERSION])
PREP_SUFFIX = ".prep"
ZERO_CHUNK_SIZE = 1 << 20
_ZEROS = bytes(ZERO_CHUNK_SIZE)
_FINE_BLOCK = 4096
"""One block of zeros, shared by zero-filling and by zero-tail detection (memory stays
bounded: a 64 MiB segment is written and checked a block at a time)."""


class RecordType(IntEnum):
    """What a WAL record holds (numbers are part of the on-disk format)."""

    ENTRIES = 1
    HARD_STATE = 2
    SNAPSHOT = 3
    COMPACT = 4
    CONF_STATE = 5
    REMOVE_GROUP = 6


class WALCorruptError(Exception):
    """The log is damaged somewhere other than a torn final record; refusing to start."""

    def __init__(self, path: str, offset: int, group: int | None, reason: str) -> None:
        where = f"{path} at offset {offset}"
        who = f" (group {group})" if group is not None else ""
        super().__init__(
            f"write-ahead log corrupt: {where}{who}: {reason}. The node refuses to start; "
            f"inspect it with `accord wal check {os.path.dirname(path) or '.'}` and restore "
            f"this node from its peers (or a backup)."
        )
        self.path = path
        self.offset = offset
        self.group = group
        self.reason = reason


# ---------------------------------------------------------------------------- payloads


def _conf_to_list(cs: ConfState) -> list[Any]:
    return [
        list(cs.voters),
        list(cs.learners),
        list(cs.voters_outgoing),
        list(cs.learners_next),
        cs.auto_leave,
    ]


def _conf_from_list(v: Sequence[Any]) -> ConfState:
    return ConfState(
        voters=tuple(int(x) for x in v[0]),
        learners=tuple(int(x) for x in v[1]),
        voters_outgoing=tuple(int(x) for x in v[2]),
        learners_next=tuple(int(x) for x in v[3]),
        auto_leave=bool(v[4]),
    )


_packers = threading.local()


def _pack(obj: Any) -> bytes:
    """msgpack with a per-thread reusable Packer (4x cheaper than ``packb``)."""
    try:
        packer = _packers.p
    except AttributeError:
        packer = _packers.p = msgpack.Packer(use_bin_type=True)
    out: bytes = packer.pack(obj)
    return out


def encode_entries(entries: Sequence[Entry]) -> bytes:
    """Payload of an ENTRIES record (``entries`` are contiguous, non-empty)."""
    flat: list[Any] = []
    for e in entries:
        flat.append(e.term)
        flat.append(int(e.type))
        flat.append(e.data)
    return _pack([entries[0].index, flat])


def encode_hard_state(hs: HardState) -> bytes:
    """Payload of a HARD_STATE record."""
    return _pack([hs.term, hs.vote, hs.commit])


def encode_snapshot_meta(meta: SnapshotMeta) -> bytes:
    """Payload of a SNAPSHOT or COMPACT record."""
    return _pack([meta.index, meta.term, _conf_to_list(meta.conf_state)])


def encode_conf_state(index: int, cs: ConfState) -> bytes:
    """Payload of a CONF_STATE record."""
    return _pack([index, _conf_to_list(cs)])


EMPTY_PAYLOAD = _pack([])


def decode_entries(payload: bytes) -> tuple[int, list[Entry]]:
    """Inverse of ``encode_entries``: (first index, entries)."""
    first, flat = msgpack.unpackb(payload, raw=False)
    out: list[Entry] = []
    idx = int(first)
    for i in range(0, len(flat), 3):
        out.append(Entry(int(flat[i]), idx, EntryType(flat[i + 1]), bytes(flat[i + 2])))
        idx += 1
    return int(first), out


def decode_hard_state(payload: bytes) -> HardState:
    """Inverse of ``encode_hard_state``."""
    t, v, c = msgpack.unpackb(payload)
    return HardState(int(t), int(v), int(c))


def decode_snapshot_meta(payload: bytes) -> SnapshotMeta:
    """Inverse of ``encode_snapshot_meta``."""
    i, t, cs = msgpack.unpackb(payload)
    return SnapshotMeta(int(i), int(t), _conf_from_list(cs))


def decode_conf_state(payload: bytes) -> tuple[int, ConfState]:
    """Inverse of ``encode_conf_state``."""
    i, cs = msgpack.unpackb(payload)
    return int(i), _conf_from_list(cs)


# ---------------------------------------------------------------------------- batches


@dataclass(slots=True)
class GroupWrite:
    """What one batch does to one group (see the module docstring for the order)."""

    install: SnapshotMeta | None = None
    compact: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)
    conf: tuple[int, ConfState] | None = None
    hard_state: HardState | None = None
    remove: bool = False


class WriteBatch:
    """Per-group writes to make durable together; sealed once handed to the log."""

    __slots__ = ("_sealed", "groups")

    def __init__(self) -> None:
        self.groups: dict[int, GroupWrite] = {}
        self._sealed = False

    def __len__(self) -> int:
        return len(self.groups)

    def _group(self, group: int) -> GroupWrite:
        if self._sealed:
            raise ValueError("this WriteBatch was already appended; build a new one")
        if not isinstance(group, int) or group <= 0 or group >= 1 << 64:
            raise ValueError(f"group id must be an integer in 1..2**64-1, got {group!r}")
        gw = self.groups.get(group)
        if gw is None:
            gw = self.groups[group] = GroupWrite()
        elif gw.remove:
            raise ValueError(
                f"group {group} is removed in this batch; re-create it in a later batch"
            )
        return gw

    def add(
        self,
        group: int,
        *,
        hard_state: HardState | None = None,
        entries: Sequence[Entry] = (),
        snapshot: SnapshotMeta | None = None,
    ) -> WriteBatch:
        """Add what a Ready asks to persist: snapshot install, entries, hard state."""
        if snapshot is not None:
            self.install_snapshot(group, snapshot)
        if entries:
            self.append_entries(group, entries)
        if hard_state is not None:
            self.set_hard_state(group, hard_state)
        if not (snapshot or entries or hard_state):
            self._group(group)
        return self

    def append_entries(self, group: int, entries: Sequence[Entry]) -> WriteBatch:
        """Append contiguous entries; the first truncates the group's suffix at its index."""
        if not entries:
            return self
        first = entries[0].index
        if first <= 0:
            raise ValueError(f"group {group}: entry index must be >= 1, got {first}")
        for i, e in enumerate(entries):
            if e.index != first + i:
                raise ValueError(
                    f"group {group}: entries must be contiguous; got index {e.index} "
                    f"after {first + i - 1}"
                )
            if i and e.term < entries[i - 1].term:
                raise ValueError(
                    f"group {group}: entry {e.index} has term {e.term} below the "
                    f"previous entry's term {entries[i - 1].term}"
                )
            if e.term < 0:
                raise ValueError(f"group {group}: entry {e.index} has negative term")
            if type(e.data) is not bytes:
                raise ValueError(
                    f"group {group}: entry {e.index} data must be bytes, got {type(e.data).__name__}"
                )
        gw = self._group(group)
        cur = gw.entries
        if not cur or first < cur[0].index:
            gw.entries = list(entries)
        elif first <= cur[-1].index + 1:
            del cur[first - cur[0].index :]
            cur.extend(entries)
        else:
            raise ValueError(
                f"group {group}: entries start at {first} but this batch's entries "
                f"end at {cur[-1].index}; a gap is not allowed"
            )
        return self

    def set_hard_state(self, group: int, hs: HardState) -> WriteBatch:
        """Persist term, vote and commit."""
        if hs.term < 0 or hs.vote < 0 or hs.commit < 0:
            raise ValueError(f"group {group}: hard state fields must be >= 0: {hs}")
        self._group(group).hard_state = hs
        return self

    def install_snapshot(self, group: int, meta: SnapshotMeta) -> WriteBatch:
        """Record an installed snapshot: the group's log restarts after ``meta.index``."""
        gw = self._group(group)
        gw.install = meta
        gw.compact = None
        gw.entries = []
        return self

    def compact(self, group: int, meta: SnapshotMeta) -> WriteBatch:
        """Record a durable snapshot at ``meta.index``; entries up to it may be dropped."""
        gw = self._group(group)
        if gw.compact is None or meta.index >= gw.compact.index:
            gw.compact = meta
        return self

    def set_conf_state(self, group: int, index: int, conf_state: ConfState) -> WriteBatch:
        """Record the membership in force as of applied ``index``."""
        gw = self._group(group)
        if gw.conf is None or index >= gw.conf[0]:
            gw.conf = (index, conf_state)
        return self

    def remove_group(self, group: int) -> WriteBatch:
        """Forget the group (it left this node): its log and state become dead."""
        self._group(group)
        self.groups[group] = GroupWrite(remove=True)
        return self


# ---------------------------------------------------------------------------- framing


def record_size(payload_len: int) -> int:
    """Bytes a record with a payload of ``payload_len`` bytes takes on disk."""
    return RECORD_HEADER_SIZE + payload_len


def frame_record(seq: int, offset: int, rtype: int, group: int, payload: bytes) -> bytes:
    """Header + payload of one record written at ``offset`` of segment ``seq``."""
    head = _CRC_INPUT.pack(seq, offset, RECORD_MAGIC, FORMAT_VERSION, rtype, group, len(payload))
    crc = crc32c.crc32c(payload, crc32c.crc32c(head))
    return b"".join((head[16:], crc.to_bytes(4, "little"), payload))


def segment_header(seq: int) -> bytes:
    """The first bytes of segment ``seq``."""
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, seq, 0)[:16]
    return head + crc32c.crc32c(head).to_bytes(4, "little")


def segment_name(seq: int) -> str:
    """File name of segment ``seq``."""
    return f"{seq:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The sequence number in a segment file name, or None if it is not one."""
    if not name.endswith(SEGMENT_SUFFIX) or len(name) != 16 + len(SEGMENT_SUFFIX):
        return None
    try:
        return int(name[:16], 16)
    except ValueError:
        return None


def prep_name(seq: int) -> str:
    """File name of segment ``seq`` while it is being prepared (not yet part of the log)."""
    return segment_name(seq) + PREP_SUFFIX


def list_prepared(directory: Path) -> list[Path]:
    """Every half- or fully-prepared segment file in ``directory`` (none is in use)."""
    return sorted(
        p for p in directory.iterdir()
        if p.name.endswith(PREP_SUFFIX) and parse_segment_name(p.name[: -len(PREP_SUFFIX)]) is not None
    )


def write_zeros(fd: int, start: int, end: int) -> None:
    """Overwrite bytes ``start..end`` of ``fd`` with zeros, a block at a time."""
    off = start
    while off < end:
        n = os.pwrite(fd, memoryview(_ZEROS)[: min(ZERO_CHUNK_SIZE, end - off)], off)
        off += n


def prepare_segment(
    path: Path, seq: int, room: int, *, sync: bool, cancelled: Callable[[], bool] | None = None
) -> bool:
    """Create ``path``: segment ``seq``'s header, then written zeros up to ``room`` bytes.

    The zeros are written, not ``fallocate``d, so that every block is allocated and
    initialised before any record goes in (see ``wal.py``). With ``sync`` the file is
    fsynced (data and size) and so is its directory. ``cancelled`` is polled between
    blocks; if it says so the partial file is removed and False is returned.
    """
    if room < SEGMENT_HEADER_SIZE:
        raise ValueError(f"a segment needs at least {SEGMENT_HEADER_SIZE} bytes, got {room}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        head = segment_header(seq)
        os.pwrite(fd, head, 0)  # 20 bytes into an empty file: never short
        off = SEGMENT_HEADER_SIZE
        while off < room:
            if cancelled is not None and cancelled():
                os.close(fd)
                fd = -1
                path.unlink(missing_ok=True)
                return False
            end = min(room, off + ZERO_CHUNK_SIZE)
            write_zeros(fd, off, end)
            off = end
        if sync:
            os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
    if sync:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return True


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """Every segment file in ``directory``, oldest first."""
    out = []
    for p in directory.iterdir():
        seq = parse_segment_name(p.name)
        if seq is not None and p.is_file():
            out.append((seq, p))
    out.sort()
    return out


# ---------------------------------------------------------------------------- scanning


@dataclass(slots=True)
class Record:
    """One valid record read back from a segment."""

    offset: int
    type: int
    group: int
    payload: bytes


@dataclass(slots=True)
class Damage:
    """A bad spot found while scanning a segment."""

    path: str
    offset: int
    group: int | None
    reason: str
    torn_tail: bool
    """True when nothing valid follows in the last segment: a crash's torn write."""


@dataclass(slots=True)
class SegmentScan:
    """The valid records of one segment and where they end."""

    seq: int
    path: Path
    size: int
    """The file's size: its preallocated room (or, for a file that was not preallocated,
    simply where it ends)."""
    records: list[Record] = field(default_factory=list)
    valid_end: int = 0
    """Where the valid records end: appending continues here."""
    data_end: int = 0
    """Where the last non-zero byte at or after ``valid_end`` ends (``valid_end`` when
    only zeros follow the records): a torn tail is ``valid_end..data_end``."""
    damage: Damage | None = None
    header_torn: bool = False
    """The last segment is shorter than its header (a crash while creating it)."""


def nonzero_end(data: bytes, start: int) -> int:
    """End of the last non-zero byte of ``data[start:]``; ``start`` if there is none.

    Scans whole zero blocks backwards with ``bytes.startswith`` (a ``memcmp``, no
    copy), so 64 MiB of zero tail costs milliseconds, not a Python loop per byte.
    """
    end = len(data)
    step = ZERO_CHUNK_SIZE
    while end > start:
        lo = max(start, end - step)
        n = end - lo
        if data.startswith(_ZEROS if n == ZERO_CHUNK_SIZE else _ZEROS[:n], lo):
            end = lo
        elif step > _FINE_BLOCK:
            step = _FINE_BLOCK  # the last non-zero byte is in this block: narrow down
        else:
            return lo + len(data[lo:end].rstrip(b"\0"))
    return start


def _check_record(data: bytes, seq: int, off: int) -> tuple[Record | None, str, int | None]:
    """Validate the record at ``off``: (record, "", group) or (None, reason, group)."""
    end = len(data)
    if end - off < RECORD_HEADER_SIZE:
        return None, f"incomplete record header ({end - off} of {RECORD_HEADER_SIZE} bytes)", None
    magic, version, rtype, group, length, crc = RECORD_HEADER.unpack_from(data, off)
    if magic != RECORD_MAGIC:
        return None, f"bad record magic 0x{magic:02x}", None
    if version != FORMAT_VERSION:
        return None, f"unsupported record format version {version}", group
    if length > MAX_PAYLOAD:
        return None, f"implausible payload length {length}", group
    pend = off + RECORD_HEADER_SIZE + length
    if pend > end:
        return None, f"record payload cut short ({end - off - RECORD_HEADER_SIZE} of {length} bytes)", group
    want = crc32c.crc32c(_POSITION.pack(seq, off))
    want = crc32c.crc32c(data[off : off + 16], want)
    want = crc32c.crc32c(data[off + RECORD_HEADER_SIZE : pend], want)
    if want != crc:
        return None, "CRC mismatch", group
    try:
        RecordType(rtype)
    except ValueError:
        return None, f"unknown record type {rtype} (written by a newer version?)", group
    return Record(off, rtype, group, data[off + RECORD_HEADER_SIZE : pend]), "", group


def _valid_record_after(data: bytes, seq: int, start: int, end: int) -> int | None:
    """Offset of the first valid record starting in ``start..end``, if any."""
    pos = start
    while True:
        pos = data.find(_RECORD_START, pos, end)
        if pos < 0:
            return None
        rec, _, _ = _check_record(data, seq, pos)
        if rec is not None:
            return pos
        pos += 1


def _check_header(data: bytes, seq: int) -> str:
    """Why the segment header of ``data`` is not valid for segment ``seq`` ("" if it is)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return "segment header incomplete"
    magic, version, hseq, hcrc = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC or crc32c.crc32c(data[:16]) != hcrc:
        return "bad segment header (magic or CRC)"
    if version != FORMAT_VERSION:
        return f"unsupported segment format version {version}"
    if hseq != seq:
        return f"segment header says sequence {hseq}"
    return ""


def scan_segment(seq: int, path: Path, *, last: bool) -> SegmentScan:
    """Read every record of one segment; find where they end; classify the first bad spot.

    Read-only. ``last`` says whether this is the newest segment (only there can a
    bad spot be a torn tail). Zeros from the end of the records to the end of the
    file are the preallocated, unused room: the clean end of the log.
    """
    data = path.read_bytes()
    scan = SegmentScan(seq, path, len(data))
    why = _check_header(data, seq)
    if why:
        # Shorter than its header: a segment whose creation a crash interrupted (only
        # possible without preallocation: a prepared segment gets its name only once
        # its header and zeros are durable). A full-size file with a bad header, even
        # all zeros, is damage: it may have held acknowledged records.
        scan.header_torn = last and len(data) < SEGMENT_HEADER_SIZE
        scan.damage = Damage(str(path), 0, None, why, scan.header_torn)
        scan.data_end = nonzero_end(data, 0)
        return scan
    off = SEGMENT_HEADER_SIZE
    end = len(data)
    data_end = off
    while off < end:
        rec, reason, group = _check_record(data, seq, off)
        if rec is None:
            data_end = nonzero_end(data, off)
            if data_end == off:
                break  # only zeros follow: the end of the log
            torn = last and _valid_record_after(data, seq, off + 1, data_end) is None
            if not torn and data.startswith(_ZEROS[:RECORD_HEADER_SIZE], off):
                reason = (
                    f"zeros where a record header should be, but non-zero data follows "
                    f"(up to offset {data_end}), so this is not the end of the log (a "
                    f"zeroed sector, or damage in the unused tail)"
                )
            scan.damage = Damage(str(path), off, group, reason, torn)
            break
        scan.records.append(rec)
        off += RECORD_HEADER_SIZE + len(rec.payload)
        data_end = off
    scan.valid_end = off
    scan.data_end = data_end
    return scan


# ---------------------------------------------------------------------------- replay


@dataclass(slots=True)
class GroupReplay:
    """A group's state while records are replayed in log order."""

    hard_state: HardState | None = None
    snapshot: SnapshotMeta | None = None
    conf: tuple[int, ConfState] | None = None
    start: int = 1
    """Index of ``entries[0]``; above ``snapshot.index + 1`` only while a hole is open."""
    entries: list[Entry] = field(default_factory=list)

    @property
    def snap_index(self) -> int:
        return self.snapshot.index if self.snapshot is not None else 0

    def apply_entries(self, first: int, es: list[Entry]) -> None:
        """An ENTRIES record: truncate the suffix >= first, then append."""
        si = self.snap_index
        if first <= si:
            es = es[si - first + 1 :]
            first = si + 1
            if not es:
                # Everything after the snapshot is truncated; nothing new survives.
                self.entries = []
                self.start = first
                return
        last = self.start + len(self.entries) - 1
        if self.entries and self.start <= first <= last + 1:
            del self.entries[first - self.start :]
            self.entries.extend(es)
        else:
            # Empty log, or a hole below ``first`` (its entries lived in a deleted
            # segment and a later COMPACT record must cover them).
            self.entries = list(es)
            self.start = first

    def apply_compact(self, meta: SnapshotMeta) -> None:
        """A COMPACT record: entries up to ``meta.index`` are covered by a snapshot."""
        if self.snapshot is not None and meta.index < self.snapshot.index:
            return
        self.snapshot = meta
        if meta.index >= self.start:
            drop = meta.index - self.start + 1
            del self.entries[:drop]
            self.start = meta.index + 1

    def apply_install(self, meta: SnapshotMeta) -> None:
        """A SNAPSHOT record: the log restarts after ``meta.index``."""
        self.snapshot = meta
        self.entries = []
        self.start = meta.index + 1

    def apply_conf(self, index: int, cs: ConfState) -> None:
        if self.conf is None or index >= self.conf[0]:
            self.conf = (index, cs)

    def to_state(self) -> PersistentState:
        conf: ConfState | None = None
        if self.conf is not None and (self.snapshot is None or self.conf[0] >= self.snapshot.index):
            conf = self.conf[1]
        return PersistentState(
            hard_state=self.hard_state or HardState(),
            snapshot=self.snapshot,
            entries=list(self.entries),
            conf_state=conf,
        )


def replay_record(groups: dict[int, GroupReplay], rec: Record) -> int:
    """Apply one valid record to the per-group replay state.

    Returns the last entry index of an ENTRIES record (0 for other types), which
    the WAL uses to track which segments still hold live entries.
    """
    t = rec.type
    if t == RecordType.REMOVE_GROUP:
        groups.pop(rec.group, None)
        return 0
    g = groups.get(rec.group)
    if g is None:
        g = groups[rec.group] = GroupReplay()
    if t == RecordType.ENTRIES:
        first, es = decode_entries(rec.payload)
        g.apply_entries(first, es)
        return first + len(es) - 1
    if t == RecordType.HARD_STATE:
        g.hard_state = decode_hard_state(rec.payload)
    elif t == RecordType.COMPACT:
        g.apply_compact(decode_snapshot_meta(rec.payload))
    elif t == RecordType.SNAPSHOT:
        g.apply_install(decode_snapshot_meta(rec.payload))
    elif t == RecordType.CONF_STATE:
        g.apply_conf(*decode_conf_state(rec.payload))
    return 0


def replay_checked(groups: dict[int, GroupReplay], s: SegmentScan, r: Record) -> int:
    """``replay_record`` with decoding errors reported as ``WALCorruptError``."""
    try:
        return replay_record(groups, r)
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        raise WALCorruptError(str(s.path), r.offset, r.group, f"undecodable payload ({exc})") from exc


def finish_replay(groups: dict[int, GroupReplay], where: str) -> dict[int, PersistentState]:
    """Check every group's log is contiguous and turn the replay into states.

    ``where`` (the newest segment's path) is named in the error for a hole."""
    out: dict[int, PersistentState] = {}
    for gid, g in groups.items():
        if g.entries and g.start != g.snap_index + 1:
            raise WALCorruptError(
                where,
                0,
                gid,
                f"entries {g.snap_index + 1}..{g.start - 1} are missing and no snapshot covers "
                f"them (a segment file was deleted or lost)",
            )
        out[gid] = g.to_state()
    return out
