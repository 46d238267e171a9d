"""ReadIndex bookkeeping for the leader: heartbeat rounds, batches and the lease.

Every heartbeat broadcast of a leader is a numbered *round*; its context carries
``(term, seq, send_tick)`` and followers echo it back. Read requests that
arrive between two flushes are collected into one *batch* attached to the
next round, with the commit index at that time. A peer acknowledging round
``s`` proves the leader was still leader after every batch with seq <= ``s``
was registered, so a batch is released once a quorum (the leader included)
has acknowledged some round >= its own.

The same acknowledgements give the lease: a follower that answered a round
sent at tick ``t`` will not vote for anyone else before its own clock has run
``election_tick`` ticks after ``t``; the leader keeps the latest such ``t`` per
peer and takes the quorum's value.

Round sequence numbers only grow, and contexts include the term, so an id is
never reused by a leader (a restarted node can only lead again in a new term).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from accord.raft.core.quorum import joint_committed_index

_ROUND = struct.Struct(">QQQ")


def encode_round(term: int, seq: int, tick: int) -> bytes:
    """The heartbeat context of round ``seq`` sent at ``tick`` in ``term``."""
    return _ROUND.pack(term, seq, tick)


def decode_round(ctx: bytes) -> tuple[int, int, int] | None:
    """``(term, seq, tick)`` from a heartbeat context, or None if it is not one."""
    if len(ctx) != _ROUND.size:
        return None
    term, seq, tick = _ROUND.unpack(ctx)
    return term, seq, tick


@dataclass(slots=True)
class ReadBatch:
    """Reads waiting for one heartbeat round: (requester, request ctx) pairs."""

    seq: int
    index: int
    requests: list[tuple[int, bytes]] = field(default_factory=list)


class ReadOnly:
    """The leader's pending ReadIndex requests and per-peer round acknowledgements."""

    __slots__ = ("_acked_seq", "_acked_tick", "_batches", "waiting")

    def __init__(self) -> None:
        self.waiting: list[tuple[int, bytes]] = []
        self._batches: deque[ReadBatch] = deque()
        self._acked_seq: dict[int, int] = {}
        self._acked_tick: dict[int, int] = {}

    def reset(self) -> None:
        """Forget everything (leadership changed)."""
        self.waiting.clear()
        self._batches.clear()
        self._acked_seq.clear()
        self._acked_tick.clear()

    def queue(self, requester: int, ctx: bytes) -> None:
        """A read request waiting for the next heartbeat round."""
        self.waiting.append((requester, ctx))

    def start_round(self, seq: int, index: int) -> None:
        """Attach every waiting request to round ``seq`` at read index ``index``."""
        if self.waiting:
            self._batches.append(ReadBatch(seq, index, self.waiting))
            self.waiting = []

    def pending_batches(self) -> int:
        """How many batches wait for their quorum."""
        return len(self._batches)

    def ack(self, peer: int, seq: int, tick: int) -> None:
        """``peer`` acknowledged round ``seq`` that was sent at ``tick``."""
        if seq > self._acked_seq.get(peer, 0):
            self._acked_seq[peer] = seq
            self._acked_tick[peer] = tick

    def release(
        self, incoming: Collection[int], outgoing: Collection[int], self_id: int, current_seq: int
    ) -> list[ReadBatch]:
        """Batches whose round (or a later one) a quorum has acknowledged."""
        if not self._batches:
            return []
        self._acked_seq[self_id] = current_seq
        quorum_seq = joint_committed_index(incoming, outgoing, self._acked_seq)
        out: list[ReadBatch] = []
        while self._batches and self._batches[0].seq <= quorum_seq:
            out.append(self._batches.popleft())
        return out

    def quorum_tick(
        self, incoming: Collection[int], outgoing: Collection[int], self_id: int, now: int
    ) -> int:
        """The latest send tick of a round that a quorum acknowledged (-1: none)."""
        self._acked_tick[self_id] = now
        acked = {k: v + 1 for k, v in self._acked_tick.items()}
        return joint_committed_index(incoming, outgoing, acked) - 1
