"""Leader balancing: spread group leaderships evenly over the nodes.

A leader does more work than a follower (it receives every proposal, sends every
append), so a node that leads most groups becomes the cluster's bottleneck. Every
node hosts a replica of the groups it is a voter of and knows each one's leader,
so each can compute the same picture; a node that leads more than its fair share
hands one leadership at a time to the voter of that group that leads the fewest.
A move is made only when the target leads at least two fewer groups than the
mover, so every move lowers the sum of squared counts: no oscillation, and the
spread ends within one where every node can take any group.

Leaderships also follow the workload: a group whose requests arrive mostly at one
other node is handed to that node (``plan_moves``), so a client that talks to one
member (as etcd clients and Kubernetes' API servers do) stops paying a forwarding hop
to another node's leader on every request. Count balancing leaves such groups alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence


def plan_transfer(
    me: int,
    leaders: Mapping[int, int],
    voters: Mapping[int, Sequence[int]],
    keep: Collection[int] = (),
) -> tuple[int, int] | None:
    """One ``(group, target)`` leadership move for node ``me``, or None if balanced.

    ``leaders`` maps each group to its known leader (0 when unknown), ``voters`` each
    group to its voters; groups in ``keep`` are not moved (they still count).
    """
    if any(lead == 0 for lead in leaders.values()):
        return None  # wait until every group has a leader
    counts = Counter({n: 0 for vs in voters.values() for n in vs})
    counts.update(leaders.values())
    best: tuple[int, int, int] | None = None
    for group in sorted(g for g, lead in leaders.items() if lead == me and g not in keep):
        for n in voters[group]:
            # Only strictly improving moves: the sum of squared counts drops every time.
            if n != me and counts[n] + 1 < counts[me] and (best is None or counts[n] < best[0]):
                best = (counts[n], group, n)
    return None if best is None else (best[1], best[2])


FOLLOW_SHARE = 0.6
"""The share of a group's requests one node must send for its leadership to follow them
there (and, once there, for count balancing to leave it alone). Below it (traffic from
everywhere) leaderships are spread by count; the gap to one half is the hysteresis."""


def follow_target(
    me: int, load: Mapping[int, int], voters: Sequence[int], *, min_requests: int
) -> int | None:
    """The voter a group led by ``me`` should hand its leadership to, or None.

    ``load`` counts the group's requests by the node they arrived at (proposals and
    ReadIndex requests, ``me``'s own included) over one balancing interval. A node other
    than ``me`` that sent at least ``FOLLOW_SHARE`` of at least ``min_requests`` is the
    target: its clients then stop paying a forwarding hop per request (CockroachDB's
    "follow the workload"). Only voters can lead.
    """
    total = sum(load.values())
    if min_requests <= 0 or total < min_requests:
        return None
    node, count = max(load.items(), key=lambda kv: (kv[1], -kv[0]))
    if node == me or node not in voters or count < FOLLOW_SHARE * total:
        return None
    return node


def held_by_workload(me: int, load: Mapping[int, int], *, min_requests: int) -> bool:
    """Whether ``me``'s own clients send most of a group's requests (see ``follow_target``):
    count balancing must not move such a group away, or it would come straight back.

    Half of ``min_requests`` is enough to hold a group that following brought here, so
    a workload near the threshold does not send it back and forth between rounds.
    """
    total = sum(load.values())
    return min_requests > 0 and total * 2 >= min_requests and load.get(me, 0) >= FOLLOW_SHARE * total


def plan_moves(
    me: int,
    leaders: Mapping[int, int],
    voters: Mapping[int, Sequence[int]],
    loads: Mapping[int, Mapping[int, int]],
    *,
    min_requests: int,
    arrived: Collection[int] = (),
) -> list[tuple[int, int]]:
    """This interval's leadership moves for node ``me``: every group whose requests come
    mostly from one other node goes there; failing that, one count-balancing move
    (``plan_transfer``) among the groups no workload holds here.

    ``arrived`` are the groups ``me`` began leading during the interval: their load
    covers only the part since, so neither rule moves them before a whole interval was
    counted. Without that, a group that followed its workload here is moved on at once
    by the count (its few requests here do not hold it) and comes straight back by
    following: leadership goes back and forth every interval, and every move resets
    what a group's leader does only once it has led for a while (the scheduling shard
    declares no dead node before ``leader_grace``)."""
    moves = []
    for group in sorted(g for g, lead in leaders.items() if lead == me and g not in arrived):
        target = follow_target(me, loads.get(group, {}), voters[group], min_requests=min_requests)
        if target is not None:
            moves.append((group, target))
    if moves:
        return moves
    held = {g for g, load in loads.items() if held_by_workload(me, load, min_requests=min_requests)}
    plan = plan_transfer(me, leaders, voters, keep=held | set(arrived))
    return [] if plan is None else [plan]
