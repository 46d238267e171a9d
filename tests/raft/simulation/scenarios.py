"""Scripted fault scenarios (targeted nemeses) for bugs random schedules rarely reach.

``figure8`` replays Figure 8 of the Raft paper with a 3-node cluster: the
faults are scripted (crashes, restarts, targeted message loss), the decisions
are the core's, and the verdict is the simulator's invariant checker. A correct
core survives it (nothing is committed that is later lost) and then shows
liveness; a core that commits entries of earlier terms by counting replicas is
caught, because the entry it committed is later overwritten by a leader that
never had it.
"""

from __future__ import annotations

from accord.raft.core.types import Message, MessageType, Role
from accord.raft.simulation import (
    PROFILES,
    CoreFactory,
    FaultProfile,
    SimConfig,
    SimResult,
    Simulation,
    default_core,
)

SCRIPTED = FaultProfile("scripted", max_delay=2, propose_rate=0.0, read_rate=0.0,
                        small_messages=True)
LIMIT = 200


class ScenarioError(AssertionError):
    """The script could not drive the cluster to the state it needs (not a Raft violation)."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise ScenarioError(f"figure-8 scenario could not {what}")


def figure8(core_factory: CoreFactory = default_core, variant: str = "",
            seed: int = 0) -> SimResult:
    """Run the Figure 8 script; raises InvariantViolation when the core breaks safety."""
    assert "scripted" not in PROFILES
    sim = Simulation(seed, SimConfig(nodes=3, spare=0, ticks=0, profile=SCRIPTED),
                     core_factory, variant)
    sim.replay_hint = (f"pytest tests/raft/simulation/test_broken_variants.py -k figure8 "
                       f"(variant {variant or 'none'}, seed {seed})")

    def leader_id() -> int:
        leader = sim.leader()
        return leader.id if leader is not None else 0

    # A stable leader A commits a first write everywhere.
    _expect(sim.run_until(lambda: leader_id() != 0, LIMIT), "elect a first leader")
    a = leader_id()
    w = sim.propose(a, "k", 1)
    _expect(w is not None and sim.run_until(lambda: w is not None and w.acked, LIMIT),
            "commit a first write")
    _expect(sim.run_until(lambda: all(n.sm.applied == sim.nodes[a].sm.applied
                                      for n in sim.alive()), LIMIT), "replicate it everywhere")
    # (a) A appends X at index i but its APPs are lost; then A crashes.
    sim.drop_filter = lambda m: m.frm == a and m.type == MessageType.APP
    x = sim.propose(a, "k", 2)
    _expect(x is not None, "propose X")
    assert x is not None
    i = x.index
    sim.step_tick(faults=False)
    sim.crash(a, down_ticks=10**6)
    # (b) One of the others (B) is elected; its own entry at i (its no-op) is lost too.
    others = [n for n in sim.nodes if n != a]
    sim.drop_filter = lambda m: m.type == MessageType.APP and m.frm in others
    _expect(sim.run_until(lambda: leader_id() in others, LIMIT), "elect B")
    b = leader_id()
    f = next(n for n in others if n != b)
    _expect(sim.nodes[b].disk.last_index() >= i, "give B its own entry at index i")
    sim.step_tick(faults=False)
    sim.crash(b, down_ticks=10**6)
    # (c) A restarts and is elected by F. F receives X but never A's entries of the new
    # term, so X (from A's old term) sits on a majority without any current-term entry.
    sim.start(a)

    def lose_new_term(m: Message) -> bool:
        core = sim.nodes[a].core
        if m.frm != a or m.type != MessageType.APP or core is None:
            return False
        return sim.nodes[f].disk.last_index() >= i and any(e.term == core.term
                                                           for e in m.entries)

    sim.drop_filter = lose_new_term
    _expect(sim.run_until(lambda: leader_id() == a, LIMIT), "re-elect A")
    _expect(sim.run_until(lambda: sim.nodes[f].disk.term_at(i) == sim.nodes[a].disk.term_at(i),
                          LIMIT), "replicate X to F")
    sim.run_until(lambda: sim.nodes[a].sm.applied >= i, 3 * sim.cfg.election_tick)
    # A crashes; B restarts. B's last entry (term of B's election) beats F's (X's term).
    sim.crash(a, down_ticks=10**6)
    sim.drop_filter = None
    sim.start(b)
    _expect(sim.run_until(lambda: sim.leader() is not None
                          and sim.leader() is sim.nodes[b], LIMIT), "elect B again")
    sim.run_until(lambda: sim.nodes[f].disk.term_at(i) == sim.nodes[b].disk.term_at(i), LIMIT)
    # Whatever the core did, the cluster must now heal and make progress.
    sim.heal()
    took = sim.await_liveness()
    core = sim.nodes[b].core
    _expect(core is not None and core.role in (Role.LEADER, Role.FOLLOWER), "keep B up")
    return SimResult(seed, "figure8", sim.tick_no, sim.writes_acked, sim.reads_served,
                     max(sim.checker.leader_of_term, default=0), sim.elections, took,
                     sim.fingerprint())
