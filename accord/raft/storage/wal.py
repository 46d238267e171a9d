"""The shared write-ahead log of a node: every Raft group, one write and one fsync per turn.

A node hosts many Raft groups. Instead of one log (and one fsync) per group, all
groups append to this log; a single writer thread turns everything submitted
while the previous fsync ran into one ``write`` + one ``fdatasync`` (group
commit), so the disk's fsync rate stops being the limit on proposals.

``WriteBatch`` operations per group (applied on recovery in this order, whatever
order they were called in, except that ``install_snapshot`` discards entries added
before it in the same batch):

* ``install_snapshot(group, meta)``: a snapshot received from the leader was made
  durable (``SnapshotStore``); the group's log restarts after ``meta.index``.
* ``compact(group, meta)``: the application's own snapshot at ``meta.index`` is
  durable; entries up to it may go. Later entries stay. A compaction older than
  the group's durable snapshot (a local snapshot that finished after a newer one
  was installed) is dropped as a no-op.
* ``append_entries(group, entries)``: contiguous entries; the first one truncates
  any existing suffix at or after its index (Raft's conflicting-suffix rule).
* ``set_conf_state(group, index, conf_state)``: the membership in force as of
  applied ``index``.
* ``set_hard_state(group, hs)``: term, vote and commit; persisted in the same
  write as the batch's entries, so nothing that depends on them is sent early.
* ``remove_group(group)``: the group left this node; everything it had is dead.

Validation happens in ``append``/``append_sync`` before anything is queued: a gap
in a group's entries, a term going backwards or an installed snapshot older than
the current one raises ``ValueError`` and changes nothing.

Durability: ``append`` returns only after the write and the fsync of every
record of the batch (and of every batch submitted before it). If a write or an
fsync fails the log stops for good: that append and every later one raise
``WALFatalError``; the node must stop (a failed fsync may have dropped dirty
pages, so retrying it could report success for data that is gone). Cancelling an
``append`` does not withdraw the batch: it will still be written.

Threads and wake-ups (what one append costs besides its write and fdatasync): an
``append`` validates and encodes its batch on the event loop, queues it, and
schedules one ``_kick`` per loop turn, which rings the writer's doorbell (a C-level
queue) after the turn's other callbacks, when the loop is about to block and the
GIL is about to be free. The writer frames the records (CRC), writes them in one
``pwrite``, runs one ``fdatasync``, and rings the loop's own completion doorbell: an
eventfd the loop watches with ``add_reader``, rung through ``os.eventfd_write``,
which releases the GIL around the syscall, so the loop thread wakes to a free GIL
(``call_soon_threadsafe`` under uvloop rings with the GIL held, and the woken loop
thread went back to sleep until the writer let go of it).

Preallocated segments: records never extend a file. A segment is created at its full
size, header then *written* zeros, fsynced with its directory, before any record
goes in; records overwrite the zeros, so a batch's ``fdatasync`` has only data
blocks to flush, never the file size or a block allocation. Measured on this
machine's ext4 disk (``bench/wal.py``, 284-byte records, medians of interleaved
rounds): appending write+fdatasync ~150-165 us, overwriting written zeros ~105-110
us. Written zeros, not ``os.posix_fallocate``: a fallocated file has "unwritten"
extents, and the first write into each block must convert one, a metadata change the
fdatasync then commits: an fdatasync after such a write took ~140-150 us (like an
append), against ~80-90 us after a rewrite; with written zeros the first write into
a block costs the same as any other (~90-100 us). With small records that is one
write in ~14, but a group-commit batch of many KiB touches new blocks on every
write. The writer continues at the recovered end *inside* the file (``pwrite`` at an
offset; there is no ``O_APPEND``).

Zero-filling is kept off the writer's path: when the current segment is a quarter
full, a helper thread prepares the next one as ``<seq>.wal.prep`` (chunks of 1 MiB
zeros, so memory stays bounded; fsync of the file and of the directory). At
rotation the writer only writes the state records into it, fdatasyncs, renames it
to ``<seq>.wal`` and fsyncs the directory; it waits for the helper only if the
helper is still zero-filling (``stats.prepare_waits``). A ``.prep`` file left by a
crash is removed by recovery, never read (``close`` removes its own). Room: a fresh log's
first segment gets ``min(segment_bytes, 1 MiB)``; every next segment twice the
room of the one before, up to ``segment_bytes``. So an idle log (and every test
that opens one) zero-fills 1 MiB, not 64, while a busy log reaches full-size
segments after ~127 MiB. A segment that was not preallocated (written by an older
version, or cut short) is continued until its file ends, then rotated.

Segments rotate when a batch no longer fits in their room. The new segment starts
with a copy of every group's hard state, conf state and snapshot marker, so that
older segments only matter for the entries they hold; the oldest segments are
deleted (one by one, oldest first, each deletion made durable before the next) once
every group's entries in them are covered by a durable snapshot/compaction or were
discarded by a snapshot install or a group removal. The on-disk format and recovery
rules are in ``format.py``.

Recovery (``open``) zeroes a torn final record (and removes a half-created last
segment and any ``.prep`` file), then rebuilds every group; a zero-filled tail after
the last valid record is the clean end of any segment (rotated segments keep
theirs); corruption anywhere else raises ``WALCorruptError`` naming the file, the
offset and the group (and changes nothing). ``open`` does blocking I/O: call it
before the event loop serves anything, or through ``asyncio.to_thread``. The log
holds no entries in memory after writing them (only, per segment, the highest index
of each group, and per group its hard state, conf state and snapshot marker);
recovery reads one segment at a time. A directory can be open in one process only
(``LOCK``).

Usage::

    wal, recovered = WriteAheadLog.open(data_dir / "wal")   # {group: PersistentState}
    batch = WriteBatch()
    batch.add(group, hard_state=rd.hard_state, entries=rd.entries,
              snapshot=rd.snapshot.meta if rd.snapshot else None)
    await wal.append(batch)          # durable when this returns; then send persisted_messages
    wal.close()
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from accord.raft.core.types import ConfState, HardState, PersistentState, SnapshotMeta
from accord.raft.storage.files import fsync_dir
from accord.raft.storage.format import (
    EMPTY_PAYLOAD,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    ZERO_CHUNK_SIZE,
    GroupReplay,
    GroupWrite,
    RecordType,
    SegmentScan,
    WALCorruptError,
    WriteBatch,
    encode_conf_state,
    encode_entries,
    encode_hard_state,
    encode_snapshot_meta,
    finish_replay,
    frame_record,
    list_prepared,
    list_segments,
    prep_name,
    prepare_segment,
    replay_checked,
    scan_segment,
    segment_name,
    write_zeros,
)
from accord.raft.storage.threads import LoopLink, PrepJob, SyncWaiter, deliver

__all__ = [
    "GroupWrite",
    "WALCorruptError",
    "WALFatalError",
    "WALStats",
    "WriteAheadLog",
    "WriteBatch",
    "fsync_dir",
]

DEFAULT_SEGMENT_BYTES = 64 << 20
FIRST_SEGMENT_ROOM = ZERO_CHUNK_SIZE
"""Room of a fresh log's first segment (each next one doubles, up to ``segment_bytes``)."""
PREPARE_AT_FILL = 4
"""The next segment is prepared once the current one is 1/PREPARE_AT_FILL full."""


class WALFatalError(Exception):
    """A write or fsync failed: durability can no longer be promised; stop the node."""


# ---------------------------------------------------------------------------- state


@dataclass(slots=True)
class _Logical:
    """A group as of everything queued so far (for validating new batches)."""

    last: int = 0
    snap_index: int = 0
    term: int = 0


@dataclass(slots=True)
class _Durable:
    """A group as of everything written so far (for rotation and segment GC)."""

    hard_state: HardState | None = None
    conf: tuple[int, ConfState] | None = None
    snapshot: SnapshotMeta | None = None
    reset_seq: int = 0
    """Entries of this group in segments older than this are dead (install/removal)."""


@dataclass(slots=True)
class _Segment:
    seq: int
    path: Path
    size: int
    """Where the records end: the next batch is written here."""
    room: int
    """Bytes a batch may fill before the segment rotates (its preallocated size)."""
    max_index: dict[int, int] = field(default_factory=dict)
    """Per group, the highest entry index this segment holds."""


@dataclass(slots=True)
class WALStats:
    """Counters since open (read them from any thread; they are advisory)."""

    batches: int = 0
    records: int = 0
    bytes_written: int = 0
    writes: int = 0
    fsyncs: int = 0
    segments_created: int = 0
    segments_deleted: int = 0
    truncated_bytes: int = 0
    """Bytes of torn tail cut off (zeroed) by recovery at open."""
    segments_prepared: int = 0
    """Segments zero-filled ahead of use (by the helper thread, or at open)."""
    prepare_waits: int = 0
    """Rotations that had to wait for the helper to finish zero-filling."""


@dataclass(slots=True)
class _Item:
    groups: dict[int, GroupWrite]
    records: list[tuple[int, int, bytes]]
    size: int
    waiter: asyncio.Future[None] | SyncWaiter
    link: LoopLink | None


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    n = os.pwrite(fd, data, offset)
    if n < len(data):  # a short write (rare): finish it
        view = memoryview(data)[n:]
        while view:
            k = os.pwrite(fd, view, offset + n)
            n += k
            view = view[k:]


def _encode(group: int, gw: GroupWrite, out: list[tuple[int, int, bytes]]) -> int:
    """Append ``gw``'s records to ``out``; returns their size on disk."""
    n = len(out)
    if gw.remove:
        out.append((RecordType.REMOVE_GROUP, group, EMPTY_PAYLOAD))
        return RECORD_HEADER_SIZE + len(EMPTY_PAYLOAD)
    if gw.install is not None:
        out.append((RecordType.SNAPSHOT, group, encode_snapshot_meta(gw.install)))
    if gw.compact is not None:
        out.append((RecordType.COMPACT, group, encode_snapshot_meta(gw.compact)))
    if gw.entries:
        out.append((RecordType.ENTRIES, group, encode_entries(gw.entries)))
    if gw.conf is not None:
        out.append((RecordType.CONF_STATE, group, encode_conf_state(*gw.conf)))
    if gw.hard_state is not None:
        out.append((RecordType.HARD_STATE, group, encode_hard_state(gw.hard_state)))
    size = 0
    for i in range(n, len(out)):
        size += RECORD_HEADER_SIZE + len(out[i][2])
    return size


def _validate(group: int, gw: GroupWrite, lg: _Logical | None) -> _Logical:
    """The group's logical state after ``gw``, or ValueError if ``gw`` is not allowed."""
    if gw.remove:
        return _Logical()
    st = _Logical() if lg is None else _Logical(lg.last, lg.snap_index, lg.term)
    if gw.install is not None:
        if gw.install.index < st.snap_index:
            raise ValueError(
                f"group {group}: installed snapshot at index {gw.install.index} is older "
                f"than the durable snapshot at {st.snap_index}"
            )
        st.snap_index = st.last = gw.install.index
    if gw.compact is not None:
        if gw.compact.index < st.snap_index:
            # A local snapshot that finished after a newer one was installed: it says
            # nothing new, so it is dropped rather than refused.
            gw.compact = None
        else:
            st.snap_index = gw.compact.index
            st.last = max(st.last, gw.compact.index)
    if gw.entries:
        first, last = gw.entries[0].index, gw.entries[-1].index
        if first > st.last + 1:
            raise ValueError(
                f"group {group}: entries start at {first} but the log ends at {st.last}; "
                f"a gap is not allowed"
            )
        st.last = last if last > st.snap_index else st.snap_index
    if gw.hard_state is not None:
        if gw.hard_state.term < st.term:
            raise ValueError(
                f"group {group}: hard state term {gw.hard_state.term} is below the "
                f"persisted term {st.term}; terms never go backwards"
            )
        st.term = gw.hard_state.term
    return st


# ---------------------------------------------------------------------------- the log


class WriteAheadLog:
    """The node's shared, segmented, group-committed write-ahead log (see module docs)."""

    def __init__(self, directory: Path, *, segment_bytes: int, sync: bool) -> None:
        """Use ``WriteAheadLog.open``; this only sets fields."""
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.sync = sync
        self.stats = WALStats()
        self.on_fsync: Callable[[float], None] | None = None
        """Called in the writer thread with the seconds each batch's fdatasync took
        (the node's fsync-latency histogram); None: not timed."""
        self._sync_file = os.fdatasync
        self._mu = threading.Lock()
        self._pending: list[_Item] = []
        # The writer's doorbell: a C-level queue, rung with the GIL held (see _kick).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._links: dict[asyncio.AbstractEventLoop, LoopLink] = {}
        self._closed = False
        self._failed: WALFatalError | None = None
        self._logical: dict[int, _Logical] = {}
        self._durable: dict[int, _Durable] = {}
        self._segments: list[_Segment] = []
        self._fd = -1
        self._lock_fd = -1
        self._thread: threading.Thread | None = None
        self._prep: PrepJob | None = None

    # -- opening and recovery

    @classmethod
    def open(
        cls,
        directory: Path | str,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        sync: bool = True,
    ) -> tuple[WriteAheadLog, dict[int, PersistentState]]:
        """Open (creating if needed) the log in ``directory`` and recover every group.

        Returns the log, ready for appends, and ``{group: PersistentState}``.
        Raises ``WALCorruptError`` on damage other than a torn final record, and
        ``OSError`` if another process holds the log open.
        """
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, got {segment_bytes}")
        d = Path(directory)
        if not d.exists():
            d.mkdir(parents=True)
            if sync:
                fsync_dir(d.parent)
        wal = cls(d, segment_bytes=segment_bytes, sync=sync)
        wal._lock()
        try:
            recovered = wal._recover()
        except BaseException:
            wal._release()
            raise
        wal._thread = threading.Thread(target=wal._run, name=f"wal-writer:{d}", daemon=True)
        wal._thread.start()
        return wal, recovered

    def _lock(self) -> None:
        fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise OSError(
                f"write-ahead log {self.directory} is in use by another process ({exc})"
            ) from exc
        self._lock_fd = fd

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _recover(self) -> dict[int, PersistentState]:
        """Scan and replay segment by segment (one segment's bytes in memory at a time),
        then repair a torn tail; nothing is changed if anything is corrupt."""
        groups: dict[int, GroupReplay] = {}
        segs = list_segments(self.directory)
        torn: SegmentScan | None = None
        for i, (seq, path) in enumerate(segs):
            s = scan_segment(seq, path, last=(i == len(segs) - 1))
            dmg = s.damage
            if dmg is not None and not dmg.torn_tail:
                raise WALCorruptError(dmg.path, dmg.offset, dmg.group, dmg.reason)
            if dmg is not None:
                torn = s
            if s.header_torn:
                break
            seg = _Segment(s.seq, s.path, s.valid_end, s.size)
            self._segments.append(seg)
            for r in s.records:
                last = replay_checked(groups, s, r)
                if r.type == RecordType.ENTRIES:
                    seg.max_index[r.group] = max(seg.max_index.get(r.group, 0), last)
                elif r.type in (RecordType.SNAPSHOT, RecordType.REMOVE_GROUP):
                    seg.max_index.pop(r.group, None)
                    self._durable.setdefault(r.group, _Durable()).reset_seq = s.seq
        recovered = finish_replay(groups, str(segs[-1][1]) if segs else str(self.directory))
        for gid, g in groups.items():
            d = self._durable.setdefault(gid, _Durable())
            d.hard_state, d.conf, d.snapshot = g.hard_state, g.conf, g.snapshot
            st = recovered[gid]
            last = st.entries[-1].index if st.entries else g.snap_index
            self._logical[gid] = _Logical(last, g.snap_index, st.hard_state.term)
        # Nothing is corrupt: from here on, repairs.
        prepared = list_prepared(self.directory)
        for p in prepared:  # half- (or fully) prepared, never used: not part of the log
            p.unlink()
        if prepared:
            self._fsync_dir()
        if torn is not None:
            self._repair_tail(torn)
        if self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_CLOEXEC)
        else:
            room = min(self.segment_bytes, FIRST_SEGMENT_ROOM)
            path = self.directory / prep_name(1)
            prepare_segment(path, 1, room, sync=self.sync)
            self.stats.segments_prepared += 1
            self._install_segment(1, path, room, [])
        self._gc()
        return recovered

    def _repair_tail(self, torn: SegmentScan) -> None:
        """Remove a half-created last segment, or zero a torn final record (durably).

        Zeroing, rather than truncating, puts the segment back in its preallocated
        state: appends continue at ``valid_end`` over written blocks.
        """
        if torn.header_torn:
            os.unlink(torn.path)
            self._fsync_dir()
            self.stats.truncated_bytes += torn.size
            return
        fd = os.open(torn.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            write_zeros(fd, torn.valid_end, torn.data_end)
            if self.sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        self.stats.truncated_bytes += torn.data_end - torn.valid_end

    # -- appending

    async def append(self, batch: WriteBatch) -> None:
        """Make ``batch`` durable; returns once it (and everything before it) is fsynced.

        The writer thread is woken once per event-loop iteration, after the
        iteration's other callbacks (so every append of a turn shares one wake-up
        and the writer does not fight the busy loop thread for the GIL).
        """
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is None:
            link = self._attach(loop)
        fut: asyncio.Future[None] = loop.create_future()
        if self._submit(batch, fut, link):
            loop.call_soon(self._kick, link)
        await fut

    def append_sync(self, batch: WriteBatch) -> None:
        """Blocking ``append`` for callers outside an event loop (tools, tests)."""
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("append_sync would block the event loop; use `await append()`")
        w = SyncWaiter()
        self._submit(batch, w, None)
        w.event.wait()
        if w.error is not None:
            raise w.error

    def _attach(self, loop: asyncio.AbstractEventLoop) -> LoopLink:
        """First append from ``loop``: give it a completion doorbell."""
        with self._mu:
            if self._closed:
                raise RuntimeError("the write-ahead log is closed")
            link = self._links[loop] = LoopLink(loop)
        return link

    def _submit(
        self,
        batch: WriteBatch,
        waiter: asyncio.Future[None] | SyncWaiter,
        link: LoopLink | None,
    ) -> bool:
        """Validate, encode and queue; True if ``link``'s loop must schedule a ``_kick``."""
        if batch._sealed:
            raise ValueError("this WriteBatch was already appended; build a new one")
        groups = batch.groups
        with self._mu:
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise RuntimeError("the write-ahead log is closed")
            logical = self._logical
            updates = [(g, _validate(g, gw, logical.get(g))) for g, gw in groups.items()]
            records: list[tuple[int, int, bytes]] = []
            size = 0
            for g, gw in groups.items():
                size += _encode(g, gw, records)
            for g, st in updates:
                logical[g] = st
            batch._sealed = True
            self._pending.append(_Item(groups, records, size, waiter, link))
            if link is None:
                self._wake.put(None)
                return False
            if link.kick_pending:
                return False
            link.kick_pending = True
            return True

    def _kick(self, link: LoopLink) -> None:
        """Ring the writer: scheduled once per loop turn, after the turn's appends.

        Rung with the GIL held (unlike the completion doorbell): the loop thread is
        about to block in its poll, and the writer needs a few microseconds to wake,
        so it finds the GIL free. Ringing through a GIL-releasing syscall instead lets
        the writer grab the GIL mid-turn and the loop thread then waits for it.
        """
        link.kick_pending = False
        self._wake.put(None)

    # -- the writer thread

    def _run(self) -> None:
        wake = self._wake
        while True:
            wake.get()
            while not wake.empty():  # several rings since the last batch: one batch serves all
                wake.get_nowait()
            with self._mu:
                work, self._pending = self._pending, []
                stop = self._closed
            exc: BaseException | None = self._failed
            if exc is None and work:
                try:
                    self._write(work)
                    self._track(work)
                except Exception as e:
                    exc = self._fail(e)
            self._notify(work, exc)
            if exc is None and not stop and self._prep is None:
                # Once the waiters are on their way: starting the helper thread is not
                # on the path of the batch just written.
                seg = self._segments[-1]
                if seg.size * PREPARE_AT_FILL >= seg.room:
                    try:
                        self._prepare_next(seg)
                    except Exception as e:  # no helper thread to be had: stop, as on a failed write
                        self._fail(e)
            if stop:
                return

    def _fail(self, e: BaseException) -> WALFatalError:
        err = WALFatalError(
            f"write-ahead log {self.directory}: write or fsync failed ({e!r}); the data may "
            f"not be durable, so nothing more is acknowledged. Stop this node and restart it "
            f"to recover from what is on disk."
        )
        err.__cause__ = e
        with self._mu:
            self._failed = err
        return err

    def _notify(self, work: list[_Item], exc: BaseException | None) -> None:
        """Settle every waiter of ``work``: one ring per event loop, sync waiters directly."""
        if len(work) == 1 and work[0].link is not None:  # a lone proposer: no grouping
            it = work[0]
            assert not isinstance(it.waiter, SyncWaiter)
            deliver(work[0].link, [it.waiter], exc)
            return
        by_link: dict[LoopLink, list[asyncio.Future[None]]] = {}
        for it in work:
            w = it.waiter
            link = it.link
            if link is None:
                assert isinstance(w, SyncWaiter)
                w.error = exc
                w.event.set()
            else:
                assert not isinstance(w, SyncWaiter)
                futs = by_link.get(link)
                if futs is None:
                    by_link[link] = [w]
                else:
                    futs.append(w)
        for link, futs in by_link.items():
            deliver(link, futs, exc)

    def _write(self, work: list[_Item]) -> None:
        total = 0
        for it in work:
            total += it.size
        if total:
            seg = self._segments[-1]
            if seg.size > SEGMENT_HEADER_SIZE and seg.size + total > seg.room:
                self._rotate()
                seg = self._segments[-1]
            seq, start = seg.seq, seg.size
            off = start
            frames: list[bytes] = []
            for it in work:
                for rtype, group, payload in it.records:
                    frames.append(frame_record(seq, off, rtype, group, payload))
                    off += RECORD_HEADER_SIZE + len(payload)
            _pwrite_all(self._fd, frames[0] if len(frames) == 1 else b"".join(frames), start)
            seg.size = off
            # Counted before the fsync: nothing but the ring should sit between the
            # fsync's return and the loop's wake-up.
            stats = self.stats
            stats.writes += 1
            stats.bytes_written += total
            stats.records += len(frames)
            stats.batches += len(work)
            if self.sync:
                timed = self.on_fsync
                if timed is None:
                    self._sync_file(self._fd)
                else:
                    began = time.perf_counter()
                    self._sync_file(self._fd)
                    timed(time.perf_counter() - began)
                stats.fsyncs += 1
        else:
            self.stats.batches += len(work)

    def _track(self, work: list[_Item]) -> None:
        """After ``_write``: note what is now durable, and delete segments no group needs."""
        gc = False
        seg = self._segments[-1]
        for it in work:
            for g, gw in it.groups.items():
                gc |= self._apply_durable(g, gw, seg)
        if gc:
            self._gc()

    def _apply_durable(self, g: int, gw: GroupWrite, seg: _Segment) -> bool:
        """Track what is now durable; True if segments may have become deletable."""
        d = self._durable.get(g)
        if d is None:
            d = self._durable[g] = _Durable()
        if gw.remove:
            self._durable[g] = _Durable(reset_seq=seg.seq)
            seg.max_index.pop(g, None)
            return True
        gc = False
        if gw.install is not None:
            d.snapshot = gw.install
            d.reset_seq = seg.seq
            seg.max_index.pop(g, None)
            gc = True
        if gw.compact is not None:
            if d.snapshot is None or gw.compact.index >= d.snapshot.index:
                d.snapshot = gw.compact
            gc = True
        if gw.entries:
            last = gw.entries[-1].index
            if last > seg.max_index.get(g, 0):
                seg.max_index[g] = last
        if gw.conf is not None and (d.conf is None or gw.conf[0] >= d.conf[0]):
            d.conf = gw.conf
        if gw.hard_state is not None:
            d.hard_state = gw.hard_state
        return gc

    def _state_records(self) -> list[tuple[int, int, bytes]]:
        out: list[tuple[int, int, bytes]] = []
        for g, d in self._durable.items():
            if d.snapshot is not None:
                out.append((RecordType.COMPACT, g, encode_snapshot_meta(d.snapshot)))
            if d.conf is not None:
                out.append((RecordType.CONF_STATE, g, encode_conf_state(*d.conf)))
            if d.hard_state is not None:
                out.append((RecordType.HARD_STATE, g, encode_hard_state(d.hard_state)))
        return out

    def _next_room(self, seg: _Segment) -> int:
        return min(self.segment_bytes, max(FIRST_SEGMENT_ROOM, 2 * seg.room))

    def _prepare_next(self, seg: _Segment) -> None:
        """Writer thread: start zero-filling the segment after ``seg`` on a helper thread."""
        self._prep = PrepJob(self.directory, seg.seq + 1, self._next_room(seg), self.sync)
        self.stats.segments_prepared += 1

    def _rotate(self) -> None:
        """Writer thread: switch to the prepared next segment (waiting for it if need be)."""
        cur = self._segments[-1]
        job = self._prep
        if job is None:
            self._prepare_next(cur)
            job = self._prep
            assert job is not None
        if not job.done.is_set():
            self.stats.prepare_waits += 1
            job.done.wait()
        self._prep = None
        if job.error is not None:
            raise job.error
        self._install_segment(job.seq, job.path, job.room, self._state_records())

    def _install_segment(
        self, seq: int, prepared: Path, room: int, records: Iterable[tuple[int, int, bytes]]
    ) -> None:
        """Put the state records into a prepared segment, make it durable, name it, use it."""
        path = self.directory / segment_name(seq)
        buf = bytearray()
        off = SEGMENT_HEADER_SIZE
        for rtype, group, payload in records:
            buf += frame_record(seq, off + len(buf), rtype, group, payload)
        fd = os.open(prepared, os.O_WRONLY | os.O_CLOEXEC)
        try:
            if buf:
                _pwrite_all(fd, buf, off)
                if self.sync:
                    self._sync_file(fd)
                    self.stats.fsyncs += 1
            os.rename(prepared, path)
            self._fsync_dir()
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._segments.append(_Segment(seq, path, off + len(buf), max(room, off + len(buf))))
        self.stats.segments_created += 1

    def _deletable(self, seg: _Segment) -> bool:
        for g, mx in seg.max_index.items():
            d = self._durable.get(g)
            if d is None:
                return False
            if seg.seq >= d.reset_seq and (d.snapshot is None or mx > d.snapshot.index):
                return False
        return True

    def _gc(self) -> None:
        while len(self._segments) > 1 and self._deletable(self._segments[0]):
            seg = self._segments.pop(0)
            os.unlink(seg.path)
            self._fsync_dir()
            self.stats.segments_deleted += 1

    def _fsync_dir(self) -> None:
        if self.sync:
            fsync_dir(self.directory)

    # -- introspection and shutdown

    def segment_files(self) -> list[Path]:
        """The live segment files, oldest first (for tests and tools)."""
        return [s.path for s in self._segments]

    @property
    def failed(self) -> WALFatalError | None:
        """The fatal error that stopped the log, if any."""
        return self._failed

    def close(self) -> None:
        """Write out everything queued, stop the writer thread and release the directory."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
        self._wake.put(None)
        if self._thread is not None:
            self._thread.join()
        if self._prep is not None:  # the writer has stopped: the next segment is not needed
            self._prep.discard()
            self._prep = None
        self._release()
        self._detach_loops()

    def _detach_loops(self) -> None:
        """Close every loop's completion doorbell (the writer has stopped).

        Each link is detached on its own loop's thread: directly if that is this
        thread or the loop is not running, else through ``call_soon_threadsafe``.
        """
        links, self._links = list(self._links.values()), {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for link in links:
            loop = link.loop
            if loop is here or loop.is_closed() or not loop.is_running():
                link.detach()
            else:
                try:
                    loop.call_soon_threadsafe(link.detach)
                except RuntimeError:  # closed meanwhile
                    link.detach()

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
