"""Quorum arithmetic: majority and joint commit indexes and vote results."""

from __future__ import annotations

import itertools

from accord.raft.core.quorum import (
    INFINITE_INDEX,
    VoteResult,
    joint_committed_index,
    joint_vote_result,
    majority_committed_index,
    majority_vote_result,
)


def _brute_committed(voters: list[int], acked: dict[int, int]) -> int:
    """The largest value v such that a majority has acked >= v (by brute force)."""
    best = 0
    for v in set(acked.values()) | {0}:
        if sum(1 for x in voters if acked.get(x, 0) >= v) * 2 > len(voters):
            best = max(best, v)
    return best


def test_majority_committed_index_examples() -> None:
    assert majority_committed_index([1], {1: 5}) == 5
    assert majority_committed_index([1, 2, 3], {1: 5, 2: 3, 3: 1}) == 3
    assert majority_committed_index([1, 2, 3], {1: 5}) == 0
    assert majority_committed_index([1, 2, 3, 4], {1: 5, 2: 5, 3: 4, 4: 1}) == 4
    assert majority_committed_index([], {1: 5}) == INFINITE_INDEX


def test_majority_committed_index_matches_brute_force() -> None:
    for n in range(1, 6):
        voters = list(range(1, n + 1))
        for values in itertools.product(range(4), repeat=n):
            acked = dict(zip(voters, values, strict=True))
            assert majority_committed_index(voters, acked) == _brute_committed(voters, acked)


def test_joint_committed_index_is_min_of_halves() -> None:
    acked = {1: 9, 2: 9, 3: 2, 4: 3, 5: 3}
    assert joint_committed_index([1, 2, 3], [], acked) == 9
    assert joint_committed_index([1, 2, 3], [3, 4, 5], acked) == 3
    assert joint_committed_index([3, 4, 5], [1, 2, 3], acked) == 3


def test_vote_results() -> None:
    v = [1, 2, 3]
    assert majority_vote_result(v, {}) == VoteResult.PENDING
    assert majority_vote_result(v, {1: True}) == VoteResult.PENDING
    assert majority_vote_result(v, {1: True, 2: True}) == VoteResult.WON
    assert majority_vote_result(v, {1: True, 2: False}) == VoteResult.PENDING
    assert majority_vote_result(v, {1: False, 2: False}) == VoteResult.LOST
    assert majority_vote_result([1, 2, 3, 4], {1: True, 2: True}) == VoteResult.PENDING
    assert majority_vote_result([1, 2, 3, 4], {1: False, 2: False}) == VoteResult.LOST
    assert majority_vote_result([], {}) == VoteResult.WON
    # votes of non-voters do not count
    assert majority_vote_result(v, {7: True, 8: True, 1: True}) == VoteResult.PENDING


def test_joint_vote_results() -> None:
    inc, out = [1, 2, 3], [3, 4, 5]
    assert joint_vote_result(inc, out, {1: True, 2: True}) == VoteResult.PENDING
    assert joint_vote_result(inc, out, {1: True, 2: True, 4: True, 5: True}) == VoteResult.WON
    assert joint_vote_result(inc, out, {1: True, 2: True, 4: False, 5: False}) == VoteResult.LOST
    assert joint_vote_result(inc, [], {1: True, 3: True}) == VoteResult.WON
