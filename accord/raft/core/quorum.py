"""Quorum arithmetic as pure functions: commit indexes and election results.

A configuration is either a plain majority config (one voter set) or a joint
config (incoming and outgoing voter sets, both of which must agree). Keeping
these rules apart from the core makes them easy to test exhaustively and lets
the same code decide commits, elections, check-quorum activity, ReadIndex
rounds and leases (all are "what has a quorum acknowledged?" questions).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import IntEnum

INFINITE_INDEX = (1 << 63) - 1
"""What an empty config "commits": it never holds a joint decision back."""


class VoteResult(IntEnum):
    """Outcome of a (pre-)vote tally."""

    PENDING = 0
    LOST = 1
    WON = 2


def majority_committed_index(voters: Collection[int], acked: Mapping[int, int]) -> int:
    """The largest value that a majority of ``voters`` has reached in ``acked``.

    Voters absent from ``acked`` count as 0. An empty voter set returns
    ``INFINITE_INDEX`` so that it does not constrain a joint config.
    """
    n = len(voters)
    if n == 0:
        return INFINITE_INDEX
    if n == 1:
        for v in voters:
            return acked.get(v, 0)
    values = sorted((acked.get(v, 0) for v in voters), reverse=True)
    return values[n // 2]


def joint_committed_index(
    incoming: Collection[int], outgoing: Collection[int], acked: Mapping[int, int]
) -> int:
    """The committed index of a joint config: the smaller of both majorities."""
    a = majority_committed_index(incoming, acked)
    if not outgoing:
        return a
    b = majority_committed_index(outgoing, acked)
    return a if a < b else b


def majority_vote_result(voters: Collection[int], votes: Mapping[int, bool]) -> VoteResult:
    """WON once a majority granted, LOST once a majority cannot be reached.

    An empty voter set wins (it places no constraint on a joint config).
    """
    n = len(voters)
    if n == 0:
        return VoteResult.WON
    granted = rejected = 0
    for v in voters:
        got = votes.get(v)
        if got is None:
            continue
        if got:
            granted += 1
        else:
            rejected += 1
    quorum = n // 2 + 1
    if granted >= quorum:
        return VoteResult.WON
    if n - rejected < quorum:
        return VoteResult.LOST
    return VoteResult.PENDING


def joint_vote_result(
    incoming: Collection[int], outgoing: Collection[int], votes: Mapping[int, bool]
) -> VoteResult:
    """The vote result of a joint config: both halves must win; either losing loses."""
    a = majority_vote_result(incoming, votes)
    b = majority_vote_result(outgoing, votes)
    if a == b:
        return a
    if VoteResult.LOST in (a, b):
        return VoteResult.LOST
    return VoteResult.PENDING
