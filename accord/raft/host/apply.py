"""The host's read and apply side: ReadIndex waiters, the apply task, snapshots.

``MultiRaftHost`` (``host.py``) inherits this mixin; it is split out only to keep each
module readable. Reads: reads that arrive in one turn share one ``read_index`` request
per group, and are released once the local applied index reaches the index the leader
confirmed. Apply: committed entries queue per group; the apply task applies them in
batches of ``max_apply_batch`` (yielding to the loop in between), answers the futures
of proposals made on this node, and snapshots a group every ``snapshot_entries``
applied entries (serialized and written off the loop), then compacts its log.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Iterable

import msgpack

from accord.raft.core.types import NO_NODE, Entry, EntryType, ProposalDropped, SnapshotMeta
from accord.raft.host.group import Group, GroupUnavailable, HostConfig, ReadWaiter
from accord.raft.storage.snapshot import SnapshotStore

log = logging.getLogger("accord.raft.host.multiraft")
_READ_CTX = struct.Struct(">QQQ")
INLINE_APPLY_MAX = 16
"""Longest apply queue the poll loop applies itself rather than wake the apply task."""


class ReadsAndApply:
    """Read and apply behaviour of ``MultiRaftHost`` (state is owned and initialised there)."""

    node_id: int
    config: HostConfig
    _loop: asyncio.AbstractEventLoop
    _boot: int
    _read_seq: int
    _dirty: set[Group]
    _wake: asyncio.Event
    _apply_wake: asyncio.Event
    _apply_ready: set[Group]
    _snapshots: SnapshotStore
    _pending_compactions: list[tuple[int, SnapshotMeta]]
    answered: int
    """Proposals of this node answered by the apply side (metrics; tells a turn that
    its inline apply woke a caller)."""

    def _mark(self, g: Group) -> None:
        self._dirty.add(g)
        self._wake.set()

    # ------------------------------------------------------------------ reads
    def _issue_reads(self, g: Group) -> None:
        self._read_seq += 1
        ctx = _READ_CTX.pack(self.node_id, self._boot, self._read_seq)
        try:
            g.core.read_index(ctx)
        except ProposalDropped as e:
            # No leader known yet, or a new leader has not committed in its term:
            # the reads stay pending and are retried every tick until they time out.
            log.debug("group %d: read deferred: %s", g.id, e)
            return
        leader = g.core.leader_id
        g.reads_round_at = self._loop.time()
        g.reads_issued[ctx] = (leader, g.reads_pending)
        g.reads_pending = []
        if leader == self.node_id:
            g.load[leader] = g.load.get(leader, 0) + 1

    def _release_reads(self, g: Group) -> None:
        keep: list[ReadWaiter] = []
        for w in g.reads_waiting:
            if w.index <= g.applied:
                if not w.future.done():
                    w.future.set_result(None)
            else:
                keep.append(w)
        g.reads_waiting = keep

    def _reissue_reads(self, g: Group, new_leader: int) -> None:
        """Send the ReadIndex requests a former leader left unanswered to ``new_leader``.

        A read may be confirmed at any point after it arrived, so asking the next
        leader is as linearizable as the first answer would have been; the reads wait
        (pending, within their timeout) while no leader is known. Failing them instead
        would turn every leadership change into client errors.
        """
        for ctx, (leader, futs) in list(g.reads_issued.items()):
            if leader != new_leader or leader == NO_NODE:
                del g.reads_issued[ctx]
                g.reads_pending.extend(f for f in futs if not f.done())
        if g.reads_pending:
            self._mark(g)

    def _fail_reads(self, g: Group) -> None:
        """Fail every ReadIndex request still waiting for an answer."""
        err = GroupUnavailable("leader changed")
        for _leader, futs in g.reads_issued.values():
            self._fail_futures(futs, err)
        g.reads_issued.clear()

    @staticmethod
    def _fail_futures(futs: Iterable[asyncio.Future[None]], err: BaseException) -> None:
        for f in futs:
            if not f.done():
                f.set_exception(err)

    def _fail_waiters(self, g: Group, err: BaseException) -> None:
        for pf in g.proposals.values():
            if not pf.done():
                pf.set_exception(err)
        self._fail_futures(g.reads_pending, err)
        g.reads_pending = []
        self._fail_reads(g)
        self._fail_futures((w.future for w in g.reads_waiting), err)
        g.reads_waiting = []

    # ------------------------------------------------------------------ apply
    def _dispatch_applies(self, groups: list[Group], *, inline: bool) -> None:
        """Apply the newly queued entries of ``groups`` now, or wake the apply task.

        ``inline`` is for a turn that writes nothing to the log: the poll loop has
        nothing to wait for, so a short queue (at most ``INLINE_APPLY_MAX`` entries) is
        applied on the spot, and its futures resolve one loop iteration sooner than
        through the apply task. A turn that writes leaves the applying to the task,
        which runs while the write is in flight. A group whose snapshot is being
        taken or restored always goes to the task (it serializes those).
        """
        woke = False
        for g in groups:
            if (inline and len(g.apply_queue) <= INLINE_APPLY_MAX and not g.snapshot_busy
                    and g.pending_restore is None and self._apply_some(g)
                    and not self._snapshot_due(g)):
                continue  # applied; else the task takes the snapshot that is due
            self._apply_ready.add(g)
            woke = True
        if woke:
            self._apply_wake.set()

    async def _apply_loop(self) -> None:
        while True:
            await self._apply_wake.wait()
            self._apply_wake.clear()
            while self._apply_ready:
                g = self._apply_ready.pop()
                done = self._apply_some(g)
                if not done:
                    self._apply_ready.add(g)
                await asyncio.sleep(0)
                if g.apply_queue or g.pending_restore is not None:
                    continue
                if self._snapshot_due(g):
                    await self._take_snapshot(g)

    def _snapshot_due(self, g: Group) -> bool:
        """Whether ``g`` applied ``snapshot_entries`` since its last snapshot (or must
        compact a log that still starts at index 1 for a newcomer)."""
        return (g.applied - g.last_snapshot_index >= self.config.snapshot_entries
                or (g.want_compaction and g.applied > 0))

    def _apply_some(self, g: Group) -> bool:
        """Apply up to ``max_apply_batch`` entries; True when the queue is empty."""
        if g.pending_restore is not None:
            snap = g.pending_restore
            g.pending_restore = None
            g.sm.restore(snap.data)
            g.applied = snap.meta.index
            g.applied_term = snap.meta.term
            g.last_snapshot_index = snap.meta.index
        q = g.apply_queue
        n = 0
        while q and n < self.config.max_apply_batch:
            e = q.popleft()
            n += 1
            if e.index <= g.applied:
                continue
            if e.type == EntryType.NORMAL and e.data:
                self._apply_entry(g, e)
            g.applied = e.index
            g.applied_term = e.term
        if g.reads_waiting:
            self._release_reads(g)
        return not q

    def _apply_entry(self, g: Group, e: Entry) -> None:
        origin, seq, payload = msgpack.unpackb(e.data, raw=False)
        try:
            result: object = g.sm.apply(e.index, payload)
            failed = False
        except Exception as exc:  # the state machine refused the command: that is its answer
            result, failed = exc, True
        if origin != self.node_id:
            return
        fut = g.proposals.get(seq)
        if fut is None or fut.done():
            return
        self.answered += 1
        if failed:
            assert isinstance(result, BaseException)
            fut.set_exception(result)
        else:
            fut.set_result(result)

    async def _take_snapshot(self, g: Group) -> None:
        if g.snapshot_busy:
            return
        g.snapshot_busy = True
        try:
            await self._snapshot_group(g)
        finally:
            g.snapshot_busy = False

    async def _snapshot_group(self, g: Group) -> None:
        index, term = g.applied, g.applied_term
        if g.core.applied_index < index:
            # The core has not yet been told these entries were handed out (its
            # advance() comes after this node's write): its membership may not include
            # a change among them. Snapshot on a later pass.
            return
        meta = SnapshotMeta(index=index, term=term, conf_state=g.core.conf_state)
        serialize = g.sm.prepare_snapshot()

        def _write() -> None:
            data = serialize()
            with self._snapshots.writer(g.id, meta) as w:
                w.write(data)
                w.finish()

        await asyncio.to_thread(_write)
        g.last_snapshot_index = index
        g.core.compact(meta)
        self._pending_compactions.append((g.id, meta))
        self._mark(g)
