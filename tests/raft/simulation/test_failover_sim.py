"""Simulated "leader connection lost": a killed leader's closed links speed up failover.

Scripted runs compare a leader crash whose links close (``conn_loss=1``: the peers'
transports report the leader lost, ``RaftCore.leader_unreachable``) with a silent
one, and check that reports about a *live* leader never unseat it. Random
schedules of the ``failover`` profile (leader-biased crashes that close links,
plus spurious reports) must keep every invariant of the checker.
"""

from __future__ import annotations

import pytest

from accord.raft.simulation import (
    PROFILES,
    FaultProfile,
    SimConfig,
    Simulation,
    run_schedule,
)

ELECTION = SimConfig().election_tick


def _sim(conn_loss: float, seed: int = 1, nodes: int = 3) -> Simulation:
    profile = FaultProfile("scripted-failover", max_delay=2, propose_rate=0.0, read_rate=0.0,
                           conn_loss=conn_loss)
    return Simulation(seed, SimConfig(nodes=nodes, spare=0, ticks=0, profile=profile))


def _leader_id(sim: Simulation) -> int:
    leader = sim.leader()
    return leader.id if leader is not None else 0


def _ticks_to_new_leader(conn_loss: float, seed: int, nodes: int = 3) -> int:
    sim = _sim(conn_loss, seed, nodes)
    assert sim.run_until(lambda: _leader_id(sim) != 0, 200)
    old = _leader_id(sim)
    w = sim.propose(old, "k", 1)
    assert w is not None and sim.run_until(lambda: w.acked, 100)
    sim.run_until(lambda: False, 3)  # every follower hears a heartbeat: all in their lease
    sim.crash(old, down_ticks=10**6)
    begin = sim.tick_no
    assert sim.run_until(lambda: _leader_id(sim) not in (0, old), 200)
    took = sim.tick_no - begin
    w2 = sim.propose(_leader_id(sim), "k", 2)
    assert w2 is not None and sim.run_until(lambda: w2.acked, 100)
    return took


@pytest.mark.parametrize("nodes", [3, 5])
def test_closed_links_elect_a_new_leader_before_an_election_timeout(nodes: int) -> None:
    fast = [_ticks_to_new_leader(1.0, seed, nodes) for seed in range(8)]
    slow = [_ticks_to_new_leader(0.0, seed, nodes) for seed in range(8)]
    assert max(slow) >= ELECTION, slow  # without reports: a whole election timeout
    assert sorted(fast)[len(fast) // 2] < ELECTION // 2, fast
    assert sum(fast) < sum(slow), (fast, slow)


def test_reports_about_a_live_leader_never_unseat_it() -> None:
    sim = _sim(0.0, seed=3, nodes=5)
    assert sim.run_until(lambda: _leader_id(sim) != 0, 200)
    lead = _leader_id(sim)
    lead_core = sim.nodes[lead].core
    assert lead_core is not None
    term = lead_core.term
    followers = [n for n in sim.nodes if n != lead]
    for tick in range(6 * ELECTION):
        # A minority of followers is told, tick after tick, that its link is lost.
        for f in followers[: (len(sim.nodes) - 1) // 2]:
            sim.report_peer_lost(f, lead, after_rounds=1 + tick % 3)
        sim.step_tick(faults=False)
        assert _leader_id(sim) == lead
    core = sim.nodes[lead].core
    assert core is not None and core.term == term
    w = sim.propose(lead, "k", 9)
    assert w is not None and sim.run_until(lambda: w.acked, 100)


def test_failover_profile_keeps_every_invariant_and_uses_the_fast_path() -> None:
    assert PROFILES["failover"].conn_loss > 0
    early = 0
    for nodes, seed in ((3, 0), (3, 1), (5, 2), (3, 3), (5, 4), (3, 5)):
        lines: list[str] = []
        run_schedule(seed, "failover", nodes, ticks=200, trace=lines.append)
        early += sum("campaigns early" in line for line in lines)
    assert early > 0, "no schedule exercised a report about a dead leader"
