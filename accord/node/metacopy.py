"""The meta group's state on every worker of a node (``docs/workers.md``).

The meta group (members, shard map, auth, alarms) lives in worker 0; the other workers
read it on every call (the shard map routes keys, auth checks tokens). Each keeps a
read-only copy, fed by worker 0 over the forwarding socket (``forward.py``):

* ``MetaFeed`` wraps the meta group's state machine on worker 0 (it is what the host
  applies to): every applied entry passes through to the machine and is kept in a
  bounded ring; ``serve`` answers a copy's "what came after index ``i``" with the
  entries after ``i``, or, when the ring no longer reaches back to ``i`` (or the
  machine was restored from a snapshot), with a snapshot of the machine and its index
  first. A copy that is up to date is answered when the next entry is applied or
  after ``wait_s`` (a long poll), so an idle node sends one small call per ``wait_s``.
* ``MetaCopy`` on worker ``k > 0`` applies what the feed sends to its own machine of the
  same kind, in order, and offers ``wait_applied(index)``: the freshness barrier, where
  worker 0 answers a ReadIndex on the meta group with the index to wait for.

Body of a request: msgpack ``[since, wait_s]``; of an answer:
``[snapshot_index, snapshot_or_nil, [[index, payload], ...]]`` (``snapshot_index`` 0
without a snapshot). Entries are applied deterministically, as on any replica, so the
copy holds the same state as worker 0's machine at the same index.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
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
        self._ring: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=keep)
        self._changed = asyncio.Event()

    # -- the StateMachine contract (the host calls these) --------------------

    def apply(self, index: int, payload: bytes) -> object:
        """Apply to the machine and keep the entry for the copies."""
        result = self.machine.apply(index, payload)
        self._ring.append((index, payload))
        self._changed.set()
        return result

    def prepare_snapshot(self) -> Callable[[], bytes]:
        """The machine's own."""
        return self.machine.prepare_snapshot()

    def restore(self, data: bytes) -> None:
        """Restore the machine; the ring no longer describes its state."""
        self.machine.restore(data)
        self._ring.clear()
        self._changed.set()

    # -- the feed ------------------------------------------------------------

    def _entries_after(self, since: int) -> list[tuple[int, bytes]] | None:
        """The kept entries after ``since``, or None when the ring does not reach back."""
        if since >= self._applied_index():
            return []
        if not self._ring or self._ring[0][0] > since + 1:
            return None
        return [(i, p) for i, p in self._ring if i > since]

    async def serve(self, body: bytes) -> bytes:
        """``forward.py`` handler: what came after the copy's ``since``."""
        try:
            since, wait_s = msgpack.unpackb(body)
            if type(since) is not int or since < 0 or not isinstance(wait_s, (int, float)):
                raise ValueError(body[:40])
        except Exception:
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "meta feed request: expected [since, wait_s]") from None
        if since >= self._applied_index():
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(float(wait_s), 60.0)):
                    await self._changed.wait()
        entries = self._entries_after(since)
        if entries is None:
            index = self._applied_index()
            data = self.machine.prepare_snapshot()()
            return bytes(msgpack.packb([index, data, []]))
        return bytes(msgpack.packb([0, None, [[i, p] for i, p in entries]]))


class MetaCopy:
    """A worker's read-only copy of the meta state, kept up to date from worker 0's feed."""

    def __init__(self, machine: StateMachine, client: ForwardClient, wait_s: float = 5.0,
                 retry_s: float = 0.2) -> None:
        self.machine = machine
        self.applied = 0
        self._client = client
        self._wait_s = wait_s
        self._retry_s = retry_s
        self._advanced = asyncio.Event()

    def take(self, answer: bytes) -> None:
        """Apply one answer of the feed, in order; a gap is an error (never applied)."""
        snap_index, data, entries = msgpack.unpackb(answer)
        if data is not None:
            self.machine.restore(data)
            self.applied = snap_index
        for index, payload in entries:
            if index <= self.applied:
                continue  # worker 0 replayed its log after a restart: already applied
            if index != self.applied + 1:
                raise ValueError(f"meta feed skipped from index {self.applied} to {index}")
            self.machine.apply(index, payload)
            self.applied = index
        self._advanced.set()

    async def run(self) -> None:
        """Follow the feed until cancelled; a worker 0 that is away is asked again."""
        while True:
            try:
                answer = await self._client.call(
                    METHOD, msgpack.packb([self.applied, self._wait_s]), self._wait_s + 10.0)
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
