"""Seeded random runs of the tiny network: safety invariants after every round,
plus the purity rule (the core modules import no clock, socket, os or asyncio)."""

from __future__ import annotations

import itertools
import random

import pytest

from accord.raft.core.types import MessageType, ProposalDropped, Role
from tests.raft.core.core_net import Net


def _check(net: Net, leaders_by_term: dict[int, int]) -> None:
    for c in net.cores.values():
        if c.role == Role.LEADER:
            assert leaders_by_term.setdefault(c.term, c.id) == c.id, "two leaders in one term"
    cores = list(net.cores.values())
    for a in cores:
        for b in cores:
            # committed entries agree wherever both still hold them
            lo = max(a.log.first_index(), b.log.first_index())
            for i in range(lo, min(a.commit_index, b.commit_index) + 1):
                assert a.log.term(i) == b.log.term(i), f"committed entry {i} differs"
    applied = sorted(net.applied.values(), key=len)
    for shorter, longer in itertools.pairwise(applied):
        assert longer[: len(shorter)] == shorter, "applied sequences diverge"


@pytest.mark.parametrize("seed", range(16))
def test_random_faults_keep_safety(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([3, 5])
    lease = seed % 2 == 1
    net = Net(range(1, n + 1), pre_vote=rng.random() < 0.8,
              check_quorum=lease or rng.random() < 0.8,
              max_inflight_msgs=rng.choice([1, 4, 64]),
              lease_read=lease, clock_drift_ticks=2 if lease else 0)
    # ReadIndex linearizability: a read's index covers every write committed anywhere
    # before the read was issued.
    reads: dict[bytes, int] = {}
    seen = {i: 0 for i in net.cores}
    drop = rng.choice([0.0, 0.1, 0.3])
    net.msg_filter = lambda m: m.type == MessageType.SNAP or rng.random() >= drop
    leaders_by_term: dict[int, int] = {}
    written = 0
    for step in range(150):
        r = rng.random()
        if r < 0.05:
            net.isolate(rng.randrange(1, n + 1))
        elif r < 0.12:
            net.heal()
        elif r < 0.15:
            victim = rng.randrange(1, n + 1)
            net.restart(victim)
        lead = net.leader()
        if lead is not None and rng.random() < 0.5:
            try:
                lead.propose(b"w%d" % step)
                written += 1
            except ProposalDropped:
                pass
            if rng.random() < 0.1:
                for c in net.cores.values():
                    if c.applied_index > c.log.snapshot_index + 3:
                        net.compact(c.id)
        if rng.random() < 0.3:
            reader = net.cores[rng.randrange(1, n + 1)]
            ctx = b"r%d" % step
            try:
                reader.read_index(ctx)
                reads[ctx] = max(c.commit_index for c in net.cores.values())
            except ProposalDropped:
                pass
        net.tick(1)
        _check(net, leaders_by_term)
        for i, states in net.read_states.items():
            for rs in states[seen[i]:]:
                assert rs.index >= reads[rs.request_ctx], "stale read"
            seen[i] = len(states)
    net.heal()
    net.msg_filter = None
    net.tick(60)
    _check(net, leaders_by_term)
    lead = net.leader()
    assert lead is not None, "no leader after healing"
    lead.propose(b"final")
    net.stabilize()
    net.tick(3)
    for i in net.cores:
        assert net.applied[i][-1] == (lead.commit_index, b"final"), (i, net.applied[i][-3:], lead.commit_index, lead.id, {j: (c.role.name, c.term, c.commit_index, c.applied_index, c.last_index) for j, c in net.cores.items()})
