"""Fault profiles: how hostile a simulated schedule is, by name, with overrides.

A profile is part of a schedule's identity: a replay names it (``--profile``),
possibly with numeric overrides (``chaos+drop=0.2``) that Hypothesis draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

ROUNDS_PER_TICK = 4
"""Network rounds per clock tick: messages take 1..max_delay rounds to arrive."""
LEASE_DRIFT = 2
"""clock_drift_ticks given to cores in lease-read profiles."""
SNAP_OK, SNAP_FAIL, UNREACHABLE, PEER_LOST = 1, 0, 2, 3
"""Kinds of transport reports the simulator hands back to nodes (``PEER_LOST``: the
node's link to the peer closed and could not be redialed, ``leader_unreachable``)."""
DRIFT_WINDOW = 9
"""A fast clock gains one tick per this many ticks (> election_tick - LEASE_DRIFT)."""


@dataclass(frozen=True, slots=True)
class FaultProfile:
    """How hostile a schedule is. Rates are per tick (or per message for drop/dup)."""

    name: str
    drop: float = 0.0
    dup: float = 0.0
    max_delay: int = 3
    straggler: float = 0.0
    """Share of messages held back 10..40 ticks (stale messages from old terms)."""
    partition_rate: float = 0.0
    one_way_share: float = 0.5
    partition_ticks: tuple[int, int] = (5, 40)
    crash_rate: float = 0.0
    down_ticks: tuple[int, int] = (1, 30)
    torn_share: float = 0.5
    conf_change_rate: float = 0.0
    transfer_rate: float = 0.0
    compact_every: int = 0
    small_messages: bool = False
    """One entry per APP (max_size_per_msg=1)."""
    max_inflight: int = 256
    """The pipelining window in APP messages (small windows exercise flow control)."""
    propose_rate: float = 0.6
    read_rate: float = 0.4
    pre_vote: bool = True
    check_quorum: bool = True
    leader_bias: float = 0.3
    """Share of crashes and partitions aimed at the current leader (a Jepsen-style nemesis)."""
    isolate_new_leader: float = 0.0
    """Chance that a leader is cut off the moment it is elected."""
    isolate_after_commit: float = 0.0
    """Chance that a leader is cut off the moment its commit index advances."""
    lease_read: bool = False
    """Leader-lease reads (clock_drift_ticks=2); some clocks then run fast within that bound."""
    conn_loss: float = 0.0
    """Chance that a crash closes the node's connections (a killed process, not a lost
    machine): every node still linked to it is told the link is lost, 1..max_delay rounds
    later."""
    spurious_loss_rate: float = 0.0
    """Chance per tick that one node is told its link to another (mostly the live leader)
    is lost although that node is fine: a blip whose redial failed."""


PROFILES: dict[str, FaultProfile] = {
    p.name: p
    for p in (
        FaultProfile("calm", max_delay=2, compact_every=25),
        FaultProfile("lossy", drop=0.2, dup=0.1, max_delay=8, straggler=0.02,
                     compact_every=20, small_messages=True, max_inflight=2),
        FaultProfile("partitions", drop=0.03, partition_rate=0.06, compact_every=15),
        FaultProfile("crashes", drop=0.03, crash_rate=0.04, compact_every=12, small_messages=True),
        FaultProfile("membership", drop=0.03, crash_rate=0.01, conf_change_rate=0.08,
                     compact_every=15),
        FaultProfile("transfers", drop=0.03, transfer_rate=0.06, partition_rate=0.02,
                     compact_every=20),
        FaultProfile("plain", drop=0.05, partition_rate=0.04, crash_rate=0.02,
                     compact_every=15, pre_vote=False, check_quorum=False),
        FaultProfile("figure8", drop=0.2, max_delay=6, partition_rate=0.15,
                     partition_ticks=(2, 12), crash_rate=0.12, down_ticks=(1, 12),
                     compact_every=0, small_messages=True, propose_rate=1.0, read_rate=0.2,
                     leader_bias=0.8, isolate_new_leader=0.3, isolate_after_commit=0.5),
        FaultProfile("lease", drop=0.05, max_delay=4, partition_rate=0.08, crash_rate=0.02,
                     transfer_rate=0.03, compact_every=20, read_rate=0.9, leader_bias=0.6,
                     lease_read=True),
        FaultProfile("failover", drop=0.03, max_delay=4, crash_rate=0.025, down_ticks=(1, 20),
                     partition_rate=0.02, compact_every=15, leader_bias=0.8, conn_loss=0.9,
                     spurious_loss_rate=0.1),
        FaultProfile("chaos", drop=0.08, dup=0.05, max_delay=6, straggler=0.01,
                     partition_rate=0.04,
                     crash_rate=0.03, conf_change_rate=0.04, transfer_rate=0.03,
                     compact_every=10, small_messages=True, max_inflight=4),
    )
}


@dataclass(slots=True)
class SimConfig:
    """The shape of one simulated run."""

    nodes: int = 3
    spare: int = 2
    ticks: int = 200
    liveness_ticks: int = 400
    election_tick: int = 10
    profile: FaultProfile = field(default_factory=lambda: PROFILES["calm"])


def parse_profile(spec: str) -> FaultProfile:
    """A named profile, optionally with numeric overrides: ``chaos+drop=0.2,dup=0.1``.

    The spec becomes the profile's name, so a replay command names it exactly.
    """
    base, _, overrides = spec.partition("+")
    if base not in PROFILES:
        raise ValueError(f"unknown profile {base!r}; choose one of {sorted(PROFILES)}")
    profile = PROFILES[base]
    changes: dict[str, Any] = {}  # values typed by the field they override
    for item in filter(None, overrides.split(",")):
        key, sep, text = item.partition("=")
        current = getattr(profile, key, None) if key != "name" else None
        if not sep or current is None or isinstance(current, tuple):
            raise ValueError(f"bad profile override {item!r}: expected KEY=NUMBER with KEY a "
                             "numeric or boolean field of FaultProfile")
        try:
            if isinstance(current, bool):
                if text not in ("true", "false"):
                    raise ValueError(text)
                changes[key] = text == "true"
            else:
                changes[key] = type(current)(text)
        except ValueError:
            raise ValueError(f"bad value in profile override {item!r}") from None
    return replace(profile, name=spec, **changes) if changes else profile
