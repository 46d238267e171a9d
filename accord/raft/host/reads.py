"""ReadIndex rounds of one node's groups: issued, answered, re-sent, failed.

A linearizable read needs the leader to confirm it still leads (one heartbeat round to
a quorum) and the local replica to apply up to the index the leader named. One round
per group is in flight at a time; reads that arrive meanwhile wait in
``Group.reads_pending`` and share the next round (etcd's read loop does the same), so at
many reads in flight a round costs each read a fraction of one heartbeat. Each round is
tagged ``(node, boot nonce, sequence)``, so an answer from a node's earlier life never
releases a read of this one. A round a leader change leaves unanswered goes to the next
leader: a read may be confirmed at any point after it arrived, so that is as
linearizable as the first answer would have been. For the same reason a round still
unanswered after :data:`RESEND_AFTER_S` is sent again, to whatever leader is known then:
a READ_INDEX or its answer lost on the way (a link not up yet after a restart, a
connection reset) otherwise held its reads until their timeout, a client's "request
timed out" (etcd's read loop re-sends after 500 ms as well).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Iterable
from typing import Any

from accord.raft.core.types import NO_NODE, ProposalDropped
from accord.raft.host.group import Group, ReadWaiter

log = logging.getLogger("accord.raft.host")
_READ_CTX = struct.Struct(">QQQ")
RESEND_AFTER_S = 0.5
"""Seconds a ReadIndex round may go unanswered before its reads join a new round."""


class ReadRounds:
    """Issues and settles the ReadIndex rounds of one node's groups."""

    def __init__(self, node_id: int, boot: int, loop: asyncio.AbstractEventLoop,
                 mark: Callable[[Group], None]) -> None:
        self.node_id = node_id
        self._boot = boot
        self._loop = loop
        self._mark = mark
        self.seq = 0
        """Rounds issued by this node since it started (tests and metrics count them)."""
        self.resent = 0
        """Rounds that went unanswered for :data:`RESEND_AFTER_S` and were sent again."""

    def issue(self, g: Group) -> None:
        """Start a round for the reads pending on ``g`` (the caller checks none is in flight)."""
        self.seq += 1
        ctx = _READ_CTX.pack(self.node_id, self._boot, self.seq)
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
        self._loop.call_later(RESEND_AFTER_S, self._resend, g, ctx)

    def _resend(self, g: Group, ctx: bytes) -> None:
        """Round ``ctx`` was not answered in time: its reads join the next round."""
        issued = g.reads_issued.pop(ctx, None)
        if issued is None:
            return  # answered, handed to a new leader, or failed
        waiting = [f for f in issued[1] if not f.done()]
        if not waiting:
            return
        g.reads_pending.extend(waiting)
        self.resent += 1
        log.debug("group %d: a ReadIndex round went unanswered for %.1f s; sent again",
                  g.id, RESEND_AFTER_S)
        g.reads_round_at = 0.0  # no round of these reads is in flight now
        self._mark(g)

    @staticmethod
    def release(g: Group) -> None:
        """Serve every confirmed read whose index ``g`` has applied."""
        keep: list[ReadWaiter] = []
        for w in g.reads_waiting:
            if w.index <= g.applied:
                if not w.future.done():
                    w.future.set_result(None)
            else:
                keep.append(w)
        g.reads_waiting = keep

    def reissue(self, g: Group, new_leader: int) -> None:
        """Send the rounds a former leader left unanswered to ``new_leader``.

        The reads wait (pending, within their timeout) while no leader is known; failing
        them instead would turn every leadership change into client errors.
        """
        for ctx, (leader, futs) in list(g.reads_issued.items()):
            if leader != new_leader or leader == NO_NODE:
                del g.reads_issued[ctx]
                g.reads_pending.extend(f for f in futs if not f.done())
        if g.reads_pending:
            self._mark(g)

    @staticmethod
    def fail_all(g: Group, err: BaseException) -> None:
        """Fail every read of ``g``: pending, in a round, and waiting to be applied."""
        fail_futures(g.reads_pending, err)
        g.reads_pending = []
        for _leader, futs in g.reads_issued.values():
            fail_futures(futs, err)
        g.reads_issued.clear()
        fail_futures((w.future for w in g.reads_waiting), err)
        g.reads_waiting = []


def fail_futures(futs: Iterable[asyncio.Future[Any]], err: BaseException) -> None:
    """Set ``err`` on every future not done yet."""
    for f in futs:
        if not f.done():
            f.set_exception(err)
