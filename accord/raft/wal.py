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
``write``, runs one ``fdatasync``, and rings the loop's own completion doorbell: an
eventfd the loop watches with ``add_reader``, rung through ``os.eventfd_write``,
which releases the GIL around the syscall, so the loop thread wakes to a free GIL
(``call_soon_threadsafe`` under uvloop rings with the GIL held, and the woken loop
thread went back to sleep until the writer let go of it).

Segments rotate at ``segment_bytes``. The new segment starts with a copy of every
group's hard state, conf state and snapshot marker, so that older segments only
matter for the entries they hold; the oldest segments are deleted (one by one,
oldest first, each deletion made durable before the next) once every group's
entries in them are covered by a durable snapshot/compaction or were discarded by
a snapshot install or a group removal. The on-disk format and recovery rules are
in ``storage_codec.py``.

Recovery (``open``) truncates a torn final record (and removes a half-created last
segment), then rebuilds every group; corruption anywhere else raises
``WALCorruptError`` naming the file, the offset and the group (and changes
nothing). ``open`` does blocking I/O: call it before the event loop serves
anything, or through ``asyncio.to_thread``. The log holds no entries in memory
after writing them (only, per segment, the highest index of each group, and per
group its hard state, conf state and snapshot marker); recovery reads one
segment at a time. A directory can be open in one process only (``LOCK``).

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
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .storage_codec import (
    EMPTY_PAYLOAD,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
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
    list_segments,
    replay_checked,
    scan_segment,
    segment_header,
    segment_name,
)
from .types import ConfState, HardState, PersistentState, SnapshotMeta

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


class WALFatalError(Exception):
    """A write or fsync failed: durability can no longer be promised; stop the node."""


def fsync_dir(path: Path | str) -> None:
    """fsync a directory so that file creations, renames and deletions in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    """Bytes of torn tail cut off by recovery at open."""


class _SyncWaiter:
    __slots__ = ("error", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None


_Done = tuple[list[asyncio.Future[None]], BaseException | None]


class _LoopLink:
    """One event loop's two doorbells with the writer thread.

    ``done`` holds batches of futures the writer has finished (durable, or failed);
    the writer rings ``fd`` (an eventfd the loop watches with ``add_reader``) after
    queueing them. ``os.eventfd_write`` releases the GIL around the syscall, so the
    loop thread wakes to a free GIL instead of waking, finding the writer still
    holding it, and sleeping again (what ``call_soon_threadsafe`` costs: uvloop rings
    its async handle with the GIL held). ``kick_pending`` is True while a ``_kick``
    of the writer is scheduled on this loop (one per loop turn).
    """

    __slots__ = ("done", "fd", "kick_pending", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.done: deque[_Done] = deque()
        self.kick_pending = False
        try:
            loop.add_reader(self.fd, self.drain)
        except BaseException:
            os.close(self.fd)
            raise

    def drain(self) -> None:
        """On the loop: resolve every future the writer has finished."""
        if self.fd < 0:
            return
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        done = self.done
        while done:
            futs, exc = done.popleft()
            _resolve(futs, exc)

    def detach(self) -> None:
        """On the loop (or with the loop stopped): settle what is done, stop watching."""
        if self.fd < 0:
            return
        if not self.loop.is_closed():
            self.drain()
            self.loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1


@dataclass(slots=True)
class _Item:
    groups: dict[int, GroupWrite]
    records: list[tuple[int, int, bytes]]
    size: int
    waiter: asyncio.Future[None] | _SyncWaiter
    link: _LoopLink | None


def _resolve(futs: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    for f in futs:
        if not f.done():
            if exc is None:
                f.set_result(None)
            else:
                f.set_exception(exc)


def _deliver(link: _LoopLink, futs: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    """Writer thread: hand settled futures to their loop and ring it.

    ``os.eventfd_write`` releases the GIL around the syscall. Links are closed only
    after the writer has stopped (see ``close``); the check and the guard only keep
    a misuse from killing the writer thread.
    """
    link.done.append((futs, exc))
    if link.fd >= 0:
        try:
            os.eventfd_write(link.fd, 1)
        except OSError:
            pass


def _write_all(fd: int, data: bytes | bytearray) -> None:
    n = os.write(fd, data)
    if n < len(data):  # a short write (rare): finish it
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(fd, view) :]


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
        self._sync_file = os.fdatasync
        self._mu = threading.Lock()
        self._pending: list[_Item] = []
        # The writer's doorbell: a C-level queue, rung with the GIL held (see _kick).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._links: dict[asyncio.AbstractEventLoop, _LoopLink] = {}
        self._closed = False
        self._failed: WALFatalError | None = None
        self._logical: dict[int, _Logical] = {}
        self._durable: dict[int, _Durable] = {}
        self._segments: list[_Segment] = []
        self._fd = -1
        self._lock_fd = -1
        self._thread: threading.Thread | None = None

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
            seg = _Segment(s.seq, s.path, s.valid_end)
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
        if torn is not None:
            self._repair_tail(torn)
        if self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
        else:
            self._create_segment(1, [])
        self._gc()
        return recovered

    def _repair_tail(self, torn: SegmentScan) -> None:
        """Remove a half-created last segment, or cut a torn final record off it."""
        if torn.header_torn:
            os.unlink(torn.path)
            self._fsync_dir()
            self.stats.truncated_bytes += torn.size
            return
        fd = os.open(torn.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, torn.valid_end)
            if self.sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self.stats.truncated_bytes += torn.size - torn.valid_end

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
        w = _SyncWaiter()
        self._submit(batch, w, None)
        w.event.wait()
        if w.error is not None:
            raise w.error

    def _attach(self, loop: asyncio.AbstractEventLoop) -> _LoopLink:
        """First append from ``loop``: give it a completion doorbell."""
        with self._mu:
            if self._closed:
                raise RuntimeError("the write-ahead log is closed")
            link = self._links[loop] = _LoopLink(loop)
        return link

    def _submit(
        self,
        batch: WriteBatch,
        waiter: asyncio.Future[None] | _SyncWaiter,
        link: _LoopLink | None,
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

    def _kick(self, link: _LoopLink) -> None:
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
            assert not isinstance(it.waiter, _SyncWaiter)
            _deliver(work[0].link, [it.waiter], exc)
            return
        by_link: dict[_LoopLink, list[asyncio.Future[None]]] = {}
        for it in work:
            w = it.waiter
            link = it.link
            if link is None:
                assert isinstance(w, _SyncWaiter)
                w.error = exc
                w.event.set()
            else:
                assert not isinstance(w, _SyncWaiter)
                futs = by_link.get(link)
                if futs is None:
                    by_link[link] = [w]
                else:
                    futs.append(w)
        for link, futs in by_link.items():
            _deliver(link, futs, exc)

    def _write(self, work: list[_Item]) -> None:
        total = 0
        for it in work:
            total += it.size
        if total:
            seg = self._segments[-1]
            if seg.size > SEGMENT_HEADER_SIZE and seg.size + total > self.segment_bytes:
                self._rotate()
                seg = self._segments[-1]
            seq, off = seg.seq, seg.size
            frames: list[bytes] = []
            for it in work:
                for rtype, group, payload in it.records:
                    frames.append(frame_record(seq, off, rtype, group, payload))
                    off += RECORD_HEADER_SIZE + len(payload)
            _write_all(self._fd, frames[0] if len(frames) == 1 else b"".join(frames))
            seg.size = off
            # Counted before the fsync: nothing but the ring should sit between the
            # fsync's return and the loop's wake-up.
            stats = self.stats
            stats.writes += 1
            stats.bytes_written += total
            stats.records += len(frames)
            stats.batches += len(work)
            if self.sync:
                self._sync_file(self._fd)
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

    def _create_segment(self, seq: int, records: Iterable[tuple[int, int, bytes]]) -> None:
        path = self.directory / segment_name(seq)
        buf = bytearray(segment_header(seq))
        for rtype, group, payload in records:
            buf += frame_record(seq, len(buf), rtype, group, payload)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            _write_all(fd, buf)
            if self.sync:
                self._sync_file(fd)
                self.stats.fsyncs += 1
            self._fsync_dir()
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._segments.append(_Segment(seq, path, len(buf)))
        self.stats.segments_created += 1

    def _rotate(self) -> None:
        self._create_segment(self._segments[-1].seq + 1, self._state_records())

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
