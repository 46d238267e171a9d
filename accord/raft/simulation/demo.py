"""A visible Raft simulation: elect, replicate, kill the leader, elect again, catch up.

``python -m accord.raft.simulation.demo [--seed N] [--nodes 3|5] [--ticks T]`` (and
``accord dev --simulate``) runs a small cluster inside the deterministic
simulator and prints what happens step by step, as a readable log: elections,
proposals and their commits, a ReadIndex read, the leader crashing, a new
leader, the old one restarting and catching up. Every Raft invariant is checked
after every step, exactly as in the test-suite; the same seed prints the same
story.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from accord.raft.core.types import Role
from accord.raft.simulation import (
    FaultProfile,
    InvariantViolation,
    SimConfig,
    Simulation,
    Write,
)

QUIET = FaultProfile("demo", max_delay=2, propose_rate=0.0, read_rate=0.0, compact_every=8)


def _leader_id(sim: Simulation) -> int | None:
    leader = sim.leader()
    return leader.id if leader is not None else None


def _write_all(sim: Simulation, out: Callable[[str], None], pairs: Sequence[tuple[str, int]],
               limit: int) -> bool:
    """Propose each write through the current leader and wait for it to be acknowledged."""
    for key, value in pairs:
        pending: Write | None = None
        for _ in range(limit):
            lid = _leader_id(sim)
            if pending is None and lid is not None:
                pending = sim.propose(lid, key, value)
            if pending is not None and pending.acked:
                break
            sim.step_tick(faults=False)
        else:
            out(f"!! write {key}={value} was not acknowledged within {limit} ticks")
            return False
    return True


def _table(sim: Simulation, out: Callable[[str], None]) -> None:
    out("  node  role          term  commit  applied  state machine")
    for node in sim.nodes.values():
        if node.id not in sim.started:
            continue
        core = node.core
        if core is None:
            out(f"  {node.id:>4}  DOWN")
            continue
        kv = ", ".join(f"{k}={v[0]}" for k, v in sorted(node.sm.kv.items()))
        out(f"  {node.id:>4}  {core.role.name:<12}  {core.term:>4}  {core.commit_index:>6}  "
            f"{node.sm.applied:>7}  {{{kv}}}")


def run_demo(seed: int, nodes: int, ticks: int, out: Callable[[str], None] = print) -> int:
    """Tell the story; returns 0 when every step happened and no invariant broke."""
    cfg = SimConfig(nodes=nodes, spare=0, ticks=ticks, profile=QUIET)
    sim = Simulation(seed, cfg, trace=lambda line: out("  " + line))
    limit = max(ticks, 10 * cfg.election_tick)
    try:
        out(f"== {nodes} nodes boot (seed {seed}); waiting for the first election")
        if not sim.run_until(lambda: sim.leader() is not None, limit):
            out("!! no leader was elected")
            return 1
        first = _leader_id(sim)
        out(f"== node {first} leads; the client writes through it")
        if not _write_all(sim, out, [("x", 1), ("y", 2), ("x", 3)], limit):
            return 1
        follower = next(n.id for n in sim.alive() if n.id != first)
        out(f"== a linearizable ReadIndex read of x through follower {follower}")
        read = sim.read(follower, "x")
        if read is not None:
            sim.run_until(lambda: sim.reads_served > 0, limit)
        _table(sim, out)
        assert first is not None
        out(f"== the leader, node {first}, is killed")
        sim.crash(first, down_ticks=ticks)
        if not sim.run_until(lambda: _leader_id(sim) not in (None, first), limit):
            out("!! no new leader after the crash")
            return 1
        out(f"== node {_leader_id(sim)} took over; the client keeps writing "
            f"(and the nodes compact their logs into snapshots)")
        more = [("y", 4), ("z", 5), ("x", 6), ("y", 7), ("z", 8), ("x", 9)]
        if not _write_all(sim, out, more, limit):
            return 1
        out(f"== node {first} restarts from its disk and catches up "
            f"(entries compacted away reach it as a snapshot)")
        sim.start(first)
        target = max(n.sm.applied for n in sim.alive())
        sim.run_until(lambda: sim.nodes[first].sm.applied >= target, limit)
        spent = sim.tick_no
        while sim.tick_no < max(ticks, spent):
            sim.step_tick(faults=False)
        _table(sim, out)
        roles = [n.core.role for n in sim.alive() if n.core is not None]
        out(f"== done after {sim.tick_no} ticks: {sim.elections} elections, "
            f"{sim.writes_acked} writes acknowledged, {sim.reads_served} read served, "
            f"{roles.count(Role.LEADER)} leader now; every invariant held at every step")
    except InvariantViolation as exc:
        out(f"!! INVARIANT VIOLATED: {exc}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``--seed``, ``--nodes``, ``--ticks``."""
    ap = argparse.ArgumentParser(prog="python -m accord.raft.simulation.demo",
                                 description="Watch a simulated Raft cluster survive its leader.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    ap.add_argument("--ticks", type=int, default=120,
                    help="minimum simulated ticks to run (default 120)")
    args = ap.parse_args(argv)
    if args.ticks < 1:
        ap.error("--ticks must be >= 1")
    return run_demo(args.seed, args.nodes, args.ticks)


if __name__ == "__main__":
    raise SystemExit(main())
