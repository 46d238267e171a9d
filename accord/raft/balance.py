"""Leader balancing: spread group leaderships evenly over the nodes.

A leader does more work than a follower (it receives every proposal, sends every
append), so a node that leads most groups becomes the cluster's bottleneck. Every
node hosts a replica of the groups it is a voter of and knows each one's leader,
so each can compute the same picture; a node that leads more than its fair share
hands one leadership at a time to the voter of that group that leads the fewest.
A move is made only when the target leads at least two fewer groups than the
mover, so every move lowers the sum of squared counts: no oscillation, and the
spread ends within one where every node can take any group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence


def plan_transfer(
    me: int,
    leaders: Mapping[int, int],
    voters: Mapping[int, Sequence[int]],
) -> tuple[int, int] | None:
    """One ``(group, target)`` leadership move for node ``me``, or None if balanced.

    ``leaders`` maps each group to its known leader (0 when unknown), ``voters`` each
    group to its voters.
    """
    if any(lead == 0 for lead in leaders.values()):
        return None  # wait until every group has a leader
    counts = Counter({n: 0 for vs in voters.values() for n in vs})
    counts.update(leaders.values())
    best: tuple[int, int, int] | None = None
    for group in sorted(g for g, lead in leaders.items() if lead == me):
        for n in voters[group]:
            # Only strictly improving moves: the sum of squared counts drops every time.
            if n != me and counts[n] + 1 < counts[me] and (best is None or counts[n] < best[0]):
                best = (counts[n], group, n)
    return None if best is None else (best[1], best[2])
