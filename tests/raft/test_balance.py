"""Leader balancing converges to an even spread and never moves leadership back and forth."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from accord.raft.balance import plan_transfer


def test_a_node_leading_everything_gives_groups_away() -> None:
    voters = {g: (1, 2, 3) for g in range(1, 7)}
    leaders = dict.fromkeys(voters, 1)
    assert plan_transfer(1, leaders, voters) == (1, 2)
    assert plan_transfer(2, leaders, voters) is None


def test_balanced_or_unknown_leaders_move_nothing() -> None:
    voters = {1: (1, 2, 3), 2: (1, 2, 3), 3: (1, 2, 3)}
    assert plan_transfer(1, {1: 1, 2: 2, 3: 3}, voters) is None
    assert plan_transfer(1, {1: 1, 2: 1, 3: 0}, voters) is None


@given(
    st.integers(2, 5).flatmap(lambda n: st.tuples(
        st.just(n), st.lists(st.integers(1, n), min_size=1, max_size=40))),
)
def test_repeated_rounds_converge_to_within_one_without_oscillating(case: tuple[int, list[int]]) -> None:
    n, initial = case
    nodes = list(range(1, n + 1))
    voters = {g: tuple(nodes) for g in range(len(initial))}
    leaders = dict(enumerate(initial))
    spreads = []
    for _ in range(10 * len(initial) + 10):
        moved = False
        for me in nodes:
            plan = plan_transfer(me, leaders, voters)
            if plan:
                group, target = plan
                assert leaders[group] == me and target != me
                leaders[group] = target
                moved = True
        counts = [list(leaders.values()).count(x) for x in nodes]
        spreads.append(max(counts) - min(counts))
        if not moved:
            break
    assert spreads[-1] <= 1
    assert all(b <= a for a, b in itertools.pairwise(spreads))
