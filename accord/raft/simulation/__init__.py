"""Deterministic simulation of a Raft group: N cores, one process, simulated network and clock.

Why: the core is a pure state machine, so a whole cluster can run inside one
process under a seeded schedule of faults, and every safety property of Raft can
be checked after every step. A failing schedule is a seed plus a profile, a
node count and a length; the failure message ends with the command that
replays it exactly: ``python -m accord.raft.simulation --seed N --profile P
--nodes K --ticks T``.

What is modelled (details in tests/raft/simulation/README.md):
- each node is a core, its *disk* (hard state, entries, snapshot, membership;
  written exactly in the order of duty ``Ready`` prescribes) and its state
  machine (a register store with snapshots, so compaction and SNAP are exercised);
- the network is a priority queue keyed by delivery round, driven by one seeded
  ``random.Random``: messages are delayed, reordered, dropped, duplicated, held
  back for many ticks, and cut by symmetric, one-way or leader-isolating partitions;
- nodes crash (losing everything not on disk, sometimes between sending and
  persisting a Ready) and restart from what they persisted; under the
  ``failover`` profile a crash closes the node's links and its peers' transports
  say so (``leader_unreachable``), and some live links are reported lost too;
- membership changes (simple and joint) and leadership transfers happen mid-flight;
- a client proposes writes and issues ReadIndex (or lease) reads; some clocks run
  fast within the configured drift bound.

``Checker`` verifies after every round: one leader per term, log matching,
leader completeness, state machine safety (and snapshot contents), durability
promises (votes and acks on disk before they leave, terms and commits never
going back), linearizable reads; after the faults heal (links lossless and
FIFO, every node up), liveness: a leader appears and a new write commits within
a bounded number of ticks.

Modules: ``profiles`` (fault profiles), ``model`` (disks, state machines,
client requests), ``checker`` (the invariants), ``nemesis`` (faults and client
of each tick), ``cluster`` (the simulation loop), ``cli`` (replay command).
"""

from __future__ import annotations

from accord.raft.simulation.checker import Checker
from accord.raft.simulation.cli import VARIANTS, main
from accord.raft.simulation.cluster import Simulation, run_schedule
from accord.raft.simulation.model import (
    CoreFactory,
    Disk,
    InvariantViolation,
    Read,
    SimNode,
    SimResult,
    StateMachine,
    Write,
    decode_write,
    default_core,
    encode_write,
)
from accord.raft.simulation.profiles import (
    PROFILES,
    ROUNDS_PER_TICK,
    FaultProfile,
    SimConfig,
    parse_profile,
)

__all__ = [
    "PROFILES",
    "ROUNDS_PER_TICK",
    "VARIANTS",
    "Checker",
    "CoreFactory",
    "Disk",
    "FaultProfile",
    "InvariantViolation",
    "Read",
    "SimConfig",
    "SimNode",
    "SimResult",
    "Simulation",
    "StateMachine",
    "Write",
    "decode_write",
    "default_core",
    "encode_write",
    "main",
    "parse_profile",
    "run_schedule",
]
