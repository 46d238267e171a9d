"""The fault schedule and the client: what happens to a simulated cluster each tick.

Everything random here draws from the simulation's one seeded ``random.Random``,
in a fixed order, so a seed names a whole schedule.
"""

from __future__ import annotations

import random
from typing import Protocol

from accord.raft.core.confchange import ConfChange, ConfChangeSingle, ConfChangeType
from accord.raft.core.types import ProposalDropped
from accord.raft.simulation.model import Read, SimNode, Write
from accord.raft.simulation.profiles import SimConfig


class Simulation(Protocol):
    """What the nemesis and the client act on (``cluster.Simulation`` fits)."""

    cfg: SimConfig
    rng: random.Random
    tick_no: int
    nodes: dict[int, SimNode]
    started: set[int]
    blocked: dict[tuple[int, int], int]

    def trace(self, text: str) -> None: ...
    def alive(self) -> list[SimNode]: ...
    def leader(self) -> SimNode | None: ...
    def start(self, nid: int) -> None: ...
    def crash(self, nid: int, torn: bool = False, down_ticks: int = 10) -> None: ...
    def report_peer_lost(self, observer: int, peer: int, after_rounds: int = 1) -> None: ...
    def partition(self, pairs: set[tuple[int, int]], ticks: int) -> None: ...
    def propose(self, nid: int, key: str, value: int) -> Write | None: ...
    def read(self, nid: int, key: str) -> Read | None: ...

KEYS = ("a", "b", "c")


def client_step(sim: Simulation) -> None:
    """The client's requests of this tick: maybe a write, maybe a read (mostly via the leader)."""
    p, rng = sim.cfg.profile, sim.rng
    up = sim.alive()
    if not up:
        return
    leader = sim.leader()
    if rng.random() < p.propose_rate:
        target = leader if leader is not None and rng.random() < 0.8 else rng.choice(up)
        sim.propose(target.id, rng.choice(KEYS), rng.randrange(1000))
    if rng.random() < p.read_rate:
        target = leader if leader is not None and rng.random() < 0.5 else rng.choice(up)
        sim.read(target.id, rng.choice(KEYS))


def fault_step(sim: Simulation) -> None:
    """This tick's faults: links heal or break, nodes restart or crash, membership and
    leadership change requests."""
    p, rng = sim.cfg.profile, sim.rng
    expired = [pair for pair, until in sim.blocked.items() if until <= sim.tick_no]
    for pair in expired:
        del sim.blocked[pair]
    if expired:
        sim.trace("cut links heal" if sim.blocked else "network heals")
    for node in sim.nodes.values():
        if node.core is None and node.id in sim.started and node.down_until <= sim.tick_no:
            sim.start(node.id)
    members = sorted(sim.started)
    if not sim.blocked and rng.random() < p.partition_rate:
        _random_partition(sim, members)
    down = sum(1 for n in members if sim.nodes[n].core is None)
    if rng.random() < p.crash_rate and down < sim.cfg.nodes // 2 + (sim.cfg.nodes == 3):
        leader = sim.leader()
        victim = (leader.id if leader is not None and rng.random() < p.leader_bias
                  else rng.choice([n.id for n in sim.alive()]))
        torn = rng.random() < p.torn_share
        sim.crash(victim, torn=torn, down_ticks=rng.randint(*p.down_ticks))
    if rng.random() < p.conf_change_rate:
        _random_conf_change(sim)
    if rng.random() < p.transfer_rate:
        _random_transfer(sim)
    if p.spurious_loss_rate and rng.random() < p.spurious_loss_rate:
        _spurious_link_loss(sim)


def _spurious_link_loss(sim: Simulation) -> None:
    """Tell a node its link to a live peer (mostly the leader) is lost: a blip."""
    rng = sim.rng
    up = sim.alive()
    if len(up) < 2:
        return
    observer = rng.choice(up)
    leader = sim.leader()
    if leader is not None and leader is not observer and rng.random() < 0.8:
        peer = leader.id
    else:
        peer = rng.choice([n.id for n in up if n is not observer])
    sim.trace(f"node {observer.id} is told its link to live node {peer} is lost")
    sim.report_peer_lost(observer.id, peer)


def new_leader_fault(sim: Simulation, leader: SimNode) -> None:
    """Maybe cut a leader off the moment it is elected (its first APPs are lost).

    This is what leaves divergent uncommitted tails of several terms on
    different nodes, the ground on which Figure 8 of the Raft paper grows.
    """
    _isolate_at_once(sim, leader, sim.cfg.profile.isolate_new_leader, "new leader")


def leader_commit_fault(sim: Simulation, leader: SimNode) -> None:
    """Maybe cut a leader off the moment its commit index moves (the APPs after it are lost)."""
    _isolate_at_once(sim, leader, sim.cfg.profile.isolate_after_commit, "committing leader")


def _isolate_at_once(sim: Simulation, leader: SimNode, chance: float, who: str) -> None:
    rng = sim.rng
    if not chance or rng.random() >= chance:
        return
    p = sim.cfg.profile
    members = sorted(sim.started)
    ticks = rng.randint(*p.partition_ticks)
    sim.partition({(a, b) for a in members for b in members
                   if a != b and leader.id in (a, b)}, ticks)
    sim.trace(f"partition for {ticks} ticks: {who} {leader.id} isolated at once")


def _random_partition(sim: Simulation, members: list[int]) -> None:
    if len(members) < 2:
        return
    rng = sim.rng
    ticks = rng.randint(*sim.cfg.profile.partition_ticks)
    leader = sim.leader()
    if leader is not None and rng.random() < sim.cfg.profile.leader_bias:
        pairs = {(a, b) for a in members for b in members
                 if a != b and leader.id in (a, b)}
        sim.trace(f"partition for {ticks} ticks: leader {leader.id} isolated")
    elif rng.random() < sim.cfg.profile.one_way_share:
        x = rng.choice(members)
        outbound = rng.random() < 0.5
        pairs = {(x, o) if outbound else (o, x) for o in members if o != x}
        sim.trace(f"one-way partition for {ticks} ticks: node {x} can "
                   f"{'only receive' if outbound else 'only send'}")
    else:
        shuffled = members[:]
        rng.shuffle(shuffled)
        cut = rng.randint(1, len(shuffled) - 1)
        side_a, side_b = shuffled[:cut], shuffled[cut:]
        pairs = {(a, b) for a in side_a for b in side_b} | {(b, a) for a in side_a
                                                          for b in side_b}
        sim.trace(f"partition for {ticks} ticks: {sorted(side_a)} | {sorted(side_b)}")
    sim.partition(pairs, ticks)

def _random_conf_change(sim: Simulation) -> None:
    leader = sim.leader()
    if leader is None or leader.core is None:
        return
    rng, cs = sim.rng, leader.core.conf_state
    if cs.voters_outgoing:
        if not cs.auto_leave:
            _propose_cc(sim, leader, ConfChange(()), "leave joint")
        return
    spares = [i for i in sim.nodes if i not in sim.started]
    voters, learners = list(cs.voters), list(cs.learners)
    add, rem, lrn = ConfChangeType.ADD_VOTER, ConfChangeType.REMOVE_NODE, \
        ConfChangeType.ADD_LEARNER
    options: list[tuple[str, list[ConfChangeSingle]]] = []
    for s in spares:
        options.append((f"add learner {s}", [ConfChangeSingle(lrn, s)]))
        options.append((f"add voter {s}", [ConfChangeSingle(add, s)]))
        for v in voters:
            options.append((f"replace voter {v} by {s} (joint)",
                            [ConfChangeSingle(add, s), ConfChangeSingle(rem, v)]))
            options.append((f"replace voter {v} by {s} (joint, explicit leave)",
                            [ConfChangeSingle(add, s), ConfChangeSingle(rem, v)]))
    for n in learners:
        options.append((f"promote learner {n}", [ConfChangeSingle(add, n)]))
        options.append((f"remove learner {n}", [ConfChangeSingle(rem, n)]))
    if len(voters) > 3:
        for v in voters:
            options.append((f"remove voter {v}", [ConfChangeSingle(rem, v)]))
            options.append((f"demote voter {v}", [ConfChangeSingle(lrn, v)]))
    if not options:
        return
    what, changes = rng.choice(options)
    for c in changes:
        if c.node_id not in sim.started:
            sim.start(c.node_id)
    _propose_cc(sim, leader, ConfChange(tuple(changes), auto_leave="explicit" not in what),
                     what)

def _propose_cc(sim: Simulation, leader: SimNode, cc: ConfChange, what: str) -> None:
    assert leader.core is not None
    try:
        index = leader.core.propose_conf_change(cc)
    except (ProposalDropped, ValueError) as exc:
        sim.trace(f"leader {leader.id} refuses conf change ({what}): {exc}")
        return
    sim.trace(f"leader {leader.id} proposes conf change ({what}) at index {index}")

def _random_transfer(sim: Simulation) -> None:
    leader = sim.leader()
    if leader is None or leader.core is None:
        return
    targets = [v for v in leader.core.conf_state.voters if v != leader.id]
    if not targets or sim.rng.random() < 0.1:
        targets = list(sim.nodes)  # sometimes a learner, a stranger or itself
    target = sim.rng.choice(targets)
    via = leader if sim.rng.random() < 0.7 else sim.rng.choice(sim.alive())
    assert via.core is not None
    try:
        via.core.transfer_leader(target)
    except (ProposalDropped, ValueError) as exc:
        sim.trace(f"node {via.id} refuses transfer to {target}: {exc}")
        return
    sim.trace(f"leadership transfer to node {target} requested at node {via.id}")


def describe_cc(data: bytes) -> str:
    """A conf change entry in words, for traces."""
    try:
        cc = ConfChange.decode(data)
    except Exception as exc:
        return f"undecodable ({exc})"
    if not cc.changes:
        return "leave joint configuration"
    return ", ".join(f"{c.type.name.lower()} {c.node_id}" for c in cc.changes)
