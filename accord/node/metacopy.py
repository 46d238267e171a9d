"""The meta group's state on every worker of a node (``docs/workers.md``).

The meta group (members, shard map, auth, alarms) lives in worker 0; the other workers
read it on every call (the shard map routes keys, auth checks tokens). Each keeps a
read-only copy, fed by worker 0 over the forwarding socket (``forward.py``):

* ``MetaFeed`` wraps the meta group's state machine on worker 0 (it is what the host
  applies to): every applied entry passes through to the machine and is kept in a
  bounded ring, chained to the entry the machine applied before it (``prev``: the host
  applies only entries with a command, so the indexes of a group's log skip its empty
  and configuration entries); ``serve`` answers a copy's "what came after index ``i``"
  with the entries after ``i``, or, when the ring no longer reaches back to ``i`` (or
  the machine was restored from a snapshot the copy did not see), with a snapshot of the
  machine and its index first. A copy that is up to date is answered when the group's
  applied index next moves (an entry applied, or one without a command passed:
  ``note_applied``) or after ``wait_s`` (a long poll), so an idle node sends one small
  call per ``wait_s``. Without the second, a worker's freshness barrier after the meta
  group's leader changed (its new leader's empty entry) waited out the poll: seconds.
* ``MetaCopy`` on worker ``k > 0`` applies what the feed sends to its own machine of the
  same kind, in order, refusing an entry whose ``prev`` it has not reached (an entry
  skipped), and offers ``wait_applied(index)``: the freshness barrier, where worker 0
  answers a ReadIndex on the meta group with the index to wait for.

Every answer carries the feed's *epoch* (a random number, new in each worker 0 process
and at each restore) and the group's applied index: the copy reaches that index even
when no entry with a command came (empty entries), and an entry chained to a restore
(``prev`` nil) is only taken by a copy that followed this epoch's snapshot.

Body of a request: msgpack ``[since, wait_s, epoch]`` (``epoch`` nil before the first
answer); of an answer: ``[snapshot_index, snapshot_or_nil, [[prev, index, payload], ...],
epoch, applied]`` (``snapshot_index`` 0 without a snapshot). Entries are applied
deterministically, as on any replica, so the copy holds the same state as worker 0's
machine at the same index.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
from collections.abc import Callable

import grpc
import msgpack

from accord.node.forward import ForwardClient, ForwardedError
from accord.raft.host.group import StateMachine

log = logging.getLogger(__name__)

METHOD = "/accord.worker/MetaSince"
"""The forwarded method name under which worker 0 serves the feed."""

KEEP = 4096
"""Entries the feed keeps for copies that fall behind; older ones get a snapshot."""


class MetaFeed:
    """Worker 0's side: the meta state machine the host applies to, teed to the copies."""

    def __init__(self, machine: StateMachine, applied_index: Callable[[], int],
                 keep: int = KEEP) -> None:
        self.machine = machine
        self._applied_index = applied_index
        """The group's applied index (what a snapshot taken now stands for)."""
        self._keep = keep
        self._ring: collections.deque[tuple[int | None, int, bytes]] = collections.deque()
        self._last: int | None = 0
        """Index of the last entry the machine applied (0: the bootstrap state, which a
        copy starts from too; None: a restore, whose index the host sets afterwards)."""
        self._from: int | None = 0
        """The ring holds every entry applied after this index (None: every one since
        the restore, whose index is not known here)."""
        self.epoch = random.getrandbits(62)
        self._changed = asyncio.Event()

    # -- the StateMachine contract (the host calls these) --------------------

    def apply(self, index: int, payload: bytes) -> object:
        """Apply to the machine and keep the entry for the copies."""
        result = self.machine.apply(index, payload)
        self._ring.append((self._last, index, payload))
        self._last = index
        if len(self._ring) > self._keep:
            self._from = self._ring.popleft()[1]
        self._changed.set()
        return result

    def note_applied(self, index: int) -> None:
        """The host passed entries without a command (``AppliedIndexListener``): the
        applied index moved, so a copy waiting for it is answered now."""
        self._changed.set()

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """The machine's own."""
        return self.machine.prepare_snapshot()

    def restore(self, data: bytes) -> None:
        """Restore the machine; the ring no longer describes its state: a new epoch."""
        self.machine.restore(data)
        self._ring.clear()
        self._last = self._from = None
        self.epoch = random.getrandbits(62)
        self._changed.set()

    # -- the feed ------------------------------------------------------------

    def _entries_after(self, since: int,
                       epoch: int | None) -> list[tuple[int | None, int, bytes]] | None:
        """The kept entries after ``since``, or None when the copy needs a snapshot: the
        ring does not reach back to ``since``, or it starts at a restore that the copy
        (of another epoch) has not seen."""
        if self._from is None:
            if epoch != self.epoch:
                return None
        elif since < self._from:
            return None
        return [e for e in self._ring if e[1] > since]

    async def serve(self, body: bytes) -> bytes:
        """``forward.py`` handler: what came after the copy's ``since``."""
        try:
            since, wait_s, epoch = msgpack.unpackb(body)
            if (type(since) is not int or since < 0 or not isinstance(wait_s, (int, float))
                    or not (epoch is None or type(epoch) is int)):
                raise ValueError(body[:40])
        except Exception:
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "meta feed request: expected [since, wait_s, epoch]") from None
        if since >= self._applied_index() and epoch == self.epoch:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(float(wait_s), 60.0)):
                    await self._changed.wait()
        entries = self._entries_after(since, epoch)
        applied = self._applied_index()
        if entries is None:
            data = self.machine.prepare_snapshot()()
            return bytes(msgpack.packb([applied, data, [], self.epoch, applied]))
        return bytes(msgpack.packb([0, None, [list(e) for e in entries], self.epoch, applied]))


class MetaCopy:
    """A worker's read-only copy of the meta state, kept up to date from worker 0's feed."""

    def __init__(self, machine: StateMachine, client: ForwardClient, wait_s: float = 5.0,
                 retry_s: float = 0.2) -> None:
        self.machine = machine
        self.applied = 0
        self.epoch: int | None = None
        """The epoch of the feed this copy last heard (None: none yet)."""
        self._client = client
        self._wait_s = wait_s
        self._retry_s = retry_s
        self._advanced = asyncio.Event()

    def take(self, answer: bytes) -> None:
        """Apply one answer of the feed, in order; a skipped entry is an error (never
        applied)."""
        snap_index, data, entries, epoch, applied = msgpack.unpackb(answer)
        if data is not None:
            self.machine.restore(data)
            self.applied = snap_index
            self.epoch = epoch
        for prev, index, payload in entries:
            if index <= self.applied:
                continue  # worker 0 replayed its log after a restart: already applied
            if (prev is None and epoch != self.epoch) or (prev is not None and prev > self.applied):
                raise ValueError(f"meta feed skipped from index {self.applied} to {index}")
            self.machine.apply(index, payload)
            self.applied = index
        self.applied = max(self.applied, int(applied))
        self.epoch = epoch
        self._advanced.set()

    async def run(self) -> None:
        """Follow the feed until cancelled; a worker 0 that is away is asked again."""
        while True:
            try:
                answer = await self._client.call(
                    METHOD, msgpack.packb([self.applied, self._wait_s, self.epoch]),
                    self._wait_s + 10.0)
            except ForwardedError as exc:
                log.debug("meta feed: %s; asking again", exc)
                await asyncio.sleep(self._retry_s)
                continue
            self.take(answer)

    async def wait_applied(self, index: int) -> None:
        """Wait until the copy has applied ``index`` (the caller bounds the wait)."""
        while self.applied < index:
            self._advanced.clear()
            await self._advanced.wait()
