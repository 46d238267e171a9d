"""The apply side of the host: committed entries applied, proposals answered, snapshots.

Committed entries queue per group (``Group.apply_queue``). The apply task applies them in
batches of ``max_apply_batch``, yielding to the loop in between, so a slow state machine
delays answers, never heartbeats. Applying an entry this node proposed answers the
proposal's future with the state machine's return value (the same on every replica).
A group that applied ``snapshot_entries`` since its last snapshot is snapshotted:
serialized and written off the loop, then its core is compacted and the compaction
queued for the next turn's log write.

A turn that writes nothing to the log applies a short queue (``INLINE_APPLY_MAX``)
itself rather than wake the task: its callers are answered one loop iteration sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgpack

from accord.raft.core.types import Entry, EntryType, SnapshotMeta
from accord.raft.host.group import Group, HostConfig
from accord.raft.host.reads import ReadRounds
from accord.raft.storage.snapshot import SnapshotStore

log = logging.getLogger("accord.raft.host")
INLINE_APPLY_MAX = 16
"""Longest apply queue the poll loop applies itself rather than wake the apply task."""


class Applier:
    """Applies one node's committed entries and snapshots its groups."""

    def __init__(self, node_id: int, config: HostConfig, snapshots: SnapshotStore,
                 mark: Callable[[Group], None]) -> None:
        self.node_id = node_id
        self.config = config
        self._snapshots = snapshots
        self._mark = mark
        self.ready: set[Group] = set()
        """Groups with work for the apply task."""
        self.wake = asyncio.Event()
        """Set when ``ready`` gained a group."""
        self.answered = 0
        """Proposals of this node answered (metrics; tells a turn that its inline apply
        woke a caller)."""
        self.compactions: list[tuple[int, SnapshotMeta]] = []
        """Snapshots taken whose log compaction the next turn writes."""

    def schedule(self, g: Group) -> None:
        """Hand ``g`` to the apply task."""
        self.ready.add(g)
        self.wake.set()

    def dispatch(self, groups: list[Group], *, inline: bool) -> None:
        """Apply the newly queued entries of ``groups`` now, or wake the apply task.

        ``inline`` is for a turn that writes nothing to the log: the poll loop has
        nothing to wait for, so a short queue (at most ``INLINE_APPLY_MAX`` entries) is
        applied on the spot. A turn that writes leaves the applying to the task, which
        runs while the write is in flight. A group whose snapshot is being taken or
        restored always goes to the task (it serializes those).
        """
        woke = False
        for g in groups:
            if (inline and len(g.apply_queue) <= INLINE_APPLY_MAX and not g.snapshot_busy
                    and g.pending_restore is None and self.apply_some(g)
                    and not self.snapshot_due(g)):
                continue  # applied; else the task takes the snapshot that is due
            self.ready.add(g)
            woke = True
        if woke:
            self.wake.set()

    async def run(self) -> None:
        """The apply task: apply and snapshot groups as they become ready (until cancelled)."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.ready:
                g = self.ready.pop()
                done = self.apply_some(g)
                if not done:
                    self.ready.add(g)
                await asyncio.sleep(0)
                if g.apply_queue or g.pending_restore is not None:
                    continue
                if self.snapshot_due(g):
                    await self.take_snapshot(g)

    def snapshot_due(self, g: Group) -> bool:
        """Whether ``g`` is to be snapshotted now (``Group.snapshot_due``)."""
        return g.snapshot_due(self.config)

    def apply_some(self, g: Group) -> bool:
        """Apply up to ``max_apply_batch`` entries; True when the queue is empty."""
        if g.pending_restore is not None:
            snap = g.pending_restore
            g.pending_restore = None
            g.sm.restore(snap.data)
            g.applied = snap.meta.index
            g.applied_term = snap.meta.term
            g.last_snapshot_index = snap.meta.index
            g.last_snapshot_bytes, g.applied_bytes = len(snap.data), 0
        q = g.apply_queue
        n = 0
        without_command = False
        while q and n < self.config.max_apply_batch:
            e = q.popleft()
            n += 1
            if e.index <= g.applied:
                continue
            if e.type == EntryType.NORMAL and e.data:
                self._apply_entry(g, e)
                g.applied_bytes += len(e.data)
            else:
                without_command = True
            g.applied = e.index
            g.applied_term = e.term
        if without_command and g.note_applied is not None:
            g.note_applied(g.applied)
        if g.reads_waiting:
            ReadRounds.release(g)
        return not q

    def _apply_entry(self, g: Group, e: Entry) -> None:
        origin, seq, payload = msgpack.unpackb(e.data, raw=False)
        fut = g.proposals.get(seq) if origin == self.node_id else None
        if fut is None or fut.done():
            # Nobody here waits for this entry's answer (another node's proposal, or one
            # replayed at start): a state machine that can skip building it does.
            apply: Callable[[int, bytes], object] = g.apply_unanswered or g.sm.apply
            with contextlib.suppress(Exception):  # a refusal: its answer, unread here
                apply(e.index, payload)
            return
        try:
            result: object = g.sm.apply(e.index, payload)
            failed = False
        except Exception as exc:  # the state machine refused the command: that is its answer
            result, failed = exc, True
        self.answered += 1
        if failed:
            assert isinstance(result, BaseException)
            fut.set_exception(result)
        else:
            fut.set_result(result)

    async def take_snapshot(self, g: Group) -> None:
        """Snapshot ``g`` now unless a snapshot of it is already being taken."""
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
        applied_bytes = g.applied_bytes

        def _write() -> int:
            data = serialize()
            with self._snapshots.writer(g.id, meta) as w:
                w.write(data)
                w.finish()
            return len(data)

        size = await asyncio.to_thread(_write)
        g.last_snapshot_index = index
        g.last_snapshot_bytes = size
        # What was applied while it was written counts towards the next one.
        g.applied_bytes = max(0, g.applied_bytes - applied_bytes)
        g.core.compact(meta)
        self.compactions.append((g.id, meta))
        self._mark(g)
