"""ReadIndex rounds of one node's groups: issued, answered, re-sent, failed.

A linearizable read needs the leader to confirm it still leads (one heartbeat round to
a quorum) and the local replica to apply up to the index the leader named. One round
per group is in flight at a time; reads that arrive meanwhile wait in
``Group.reads_pending`` and share the next round (etcd's read loop does the same), so at
many reads in flight a round costs each read a fraction of one heartbeat. Each round is
tagged ``(node, boot nonce, sequence)``, so an answer from a node's earlier life never
releases a read of this one. A round a leader change leaves unanswered goes to the next
leader: a read may be confirmed at any point after it arrived, so that is as
linearizable as the first answer would have been.
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
