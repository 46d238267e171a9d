"""Quiescence: idle groups stop ticking, so thousands of them cost almost nothing.

A Raft group ticks every heartbeat interval: the leader sends heartbeats, the
followers count toward an election timeout. With thousands of groups per node
that is most of an idle node's CPU. As CockroachDB does, a leader whose group is
fully caught up (every replica's log matches, everything committed and handed
out for apply, no transfer under way) sends its followers one last heartbeat
marked ``QUIESCE_CONTEXT`` and stops ticking the group; a follower that is caught
up with that leader stops ticking it too. Any message, proposal or read for the
group wakes it.

What replaces the per-group heartbeats while quiet is one node-level ping per
pair of nodes per tick (``PeerLiveness``, a Phi accrual detector per peer): when a
peer's silence becomes suspicious, every quiesced group whose leader lives there wakes up,
its election timer runs again, and a new leader is elected as usual. A leader quiesces
only while a quorum of its voters is reachable (``quorum_reachable``): one cut off from
them keeps ticking until CheckQuorum steps it down.

The rules here are pure functions of a core's state; the host applies them.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from accord.membership.phi import HeartbeatMonitor
from accord.raft.core.raft import RaftCore
from accord.raft.core.types import Role

QUIESCE_CONTEXT = b"quiesce"
"""Context of the HEARTBEAT a leader sends when it quiesces a group."""


def leader_can_quiesce(core: RaftCore) -> bool:
    """Whether a leader may stop ticking: nothing left to replicate, commit or hand out."""
    if core.role != Role.LEADER or core.lead_transferee:
        return False
    last = core.last_index
    if core.commit_index != last or core.applied_index != last or core.has_ready():
        return False
    return all(pr.match == last for pr in core.progress.values())


def quorum_reachable(core: RaftCore, unreachable: AbstractSet[int]) -> bool:
    """Whether the voters not in ``unreachable`` (peers gone silent or whose link was
    lost, not heard from since) make a quorum of the group, in each half of a joint
    configuration. A leader without one must keep ticking, so that CheckQuorum steps it
    down if it is the one cut off: woken because its voters went silent, and quiesced
    again three ticks later as "caught up", a leader cut off from every follower would
    believe it leads for ever (its Status and its watches' ``hasleader`` would say so)."""
    cs = core.conf_state
    for voters in (cs.voters, cs.voters_outgoing):
        if voters and 2 * sum(1 for v in voters if v not in unreachable) <= len(voters):
            return False
    return True


def follower_can_quiesce(core: RaftCore, leader: int) -> bool:
    """Whether a follower told to quiesce by ``leader`` may stop ticking."""
    return (
        core.role == Role.FOLLOWER
        and core.leader_id == leader
        and core.commit_index == core.last_index
        and not core.has_ready()
    )


class PeerLiveness:
    """Which peer nodes have gone quiet, from node-level pings (time is passed in).

    Each peer has a Phi accrual detector (``accord.membership.phi``) fed by its pings,
    so detection adapts to each link's rhythm; ``acceptable_pause`` (half an election
    timeout by default) absorbs a busy event loop on either side.
    """

    def __init__(self, ping_interval: float, election_timeout: float,
                 threshold: float = 8.0) -> None:
        self._monitor = HeartbeatMonitor(
            threshold=threshold,
            min_std_deviation=ping_interval,
            acceptable_pause=election_timeout / 2,
            first_heartbeat_estimate=ping_interval,
        )
        self.down: set[int] = set()

    def heard(self, node: int, now: float) -> bool:
        """Record traffic from ``node``; True if it was down until now."""
        self._monitor.heartbeat(node, now)
        if node in self.down:
            self.down.discard(node)
            return True
        return False

    def phi(self, node: int, now: float) -> float:
        """How suspicious ``node``'s silence is (0 if never heard from)."""
        return self._monitor.phi(node, now)

    def newly_down(self, now: float) -> list[int]:
        """Peers whose suspicion crossed the threshold since the last call."""
        out = []
        for node in self._monitor.suspects(now):
            assert isinstance(node, int)
            if node not in self.down:
                self.down.add(node)
                out.append(node)
        return out
