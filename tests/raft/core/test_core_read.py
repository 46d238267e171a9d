"""ReadIndex: refusal before a current-term commit, batching, forwarding, lease mode."""

from __future__ import annotations

import pytest

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.readonly import decode_round
from accord.raft.core.types import (
    Entry,
    HardState,
    Message,
    MessageType,
    PersistentState,
    ProposalDropped,
    ReadState,
    Role,
)
from tests.raft.core.core_net import Net

MT = MessageType


def test_read_refused_until_leader_commits_in_its_term() -> None:
    hs = HardState(1, 0, 1)
    core = RaftCore(Config(id=1, pre_vote=False),
                    PersistentState(hs, None, [Entry(1, 1)]), [1, 2, 3])
    core.campaign()
    core.step(Message(MT.VOTE_RESP, to=1, frm=2, term=2))
    assert core.role == Role.LEADER and core.commit_index == 1
    with pytest.raises(ProposalDropped, match="not yet committed an entry of its term"):
        core.read_index(b"r1")

    class Broken(RaftCore):
        def _read_index_allowed(self) -> bool:
            return True

    broken = Broken(Config(id=1, pre_vote=False),
                    PersistentState(hs, None, [Entry(1, 1)]), [1, 2, 3])
    broken.campaign()
    broken.step(Message(MT.VOTE_RESP, to=1, frm=2, term=2))
    broken.read_index(b"r1")  # the hook is what enforces the rule


def test_reads_in_one_cycle_share_one_heartbeat_round() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for k in range(3):
        lead.read_index(b"req%d" % k)
    assert lead.has_ready()
    rd = lead.ready()
    beats = [m for m in rd.messages if m.type == MT.HEARTBEAT]
    assert sorted(m.to for m in beats) == [2, 3]
    assert len({m.context for m in beats}) == 1
    assert not rd.read_states
    lead.advance(rd)
    # one follower's answer plus the leader is a quorum
    net.deliver(beats[0])
    net.process(beats[0].to)
    for m in list(net.queue):
        net.deliver(m)
    net.queue.clear()
    rd = lead.ready()
    assert rd.read_states == [ReadState(lead.commit_index, b"req%d" % k) for k in range(3)]


def test_read_waits_for_quorum_acks() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.isolate(1)
    lead.read_index(b"q")
    net.stabilize()
    assert net.read_states[1] == []
    net.heal()
    net.tick(1, nodes=[1])  # the next heartbeat round is acked and covers the batch
    assert net.read_states[1] == [ReadState(lead.commit_index, b"q")]


def test_round_ids_are_never_reused() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.tick(5)
    net.cores[1].transfer_leader(2)
    net.stabilize()
    assert net.cores[2].role == Role.LEADER
    net.tick(5)
    ids = [decode_round(m.context) for m in net.sent if m.type == MT.HEARTBEAT and m.to == 3]
    rounds = [(r[0], r[1]) for r in ids if r is not None]
    assert len(rounds) == len(ids) > 8
    assert len(set(rounds)) == len(rounds)
    assert len({r[0] for r in rounds}) == 2


def test_follower_read_is_forwarded_to_leader() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    lead.propose(b"x")
    net.stabilize()
    net.cores[3].read_index(b"f")
    net.stabilize()
    assert net.read_states[3] == [ReadState(lead.commit_index, b"f")]
    with pytest.raises(ProposalDropped, match="no leader known"):
        Net([1, 2, 3]).cores[2].read_index(b"x")


def test_single_voter_reads_at_once() -> None:
    net = Net([1])
    lead = net.elect(1)
    lead.read_index(b"s")
    rd = lead.ready()
    assert rd.read_states == [ReadState(lead.commit_index, b"s")]
    assert not rd.messages


def _lease_net() -> Net:
    return Net([1, 2, 3], lease_read=True, clock_drift_ticks=2)


def test_lease_read_served_without_heartbeat_while_lease_holds() -> None:
    net = _lease_net()
    net.cores[1].campaign()
    net.stabilize()
    # a (re)started node keeps any lease it may have promised: no votes yet
    assert net.leader() is None
    net.tick(30)
    lead = net.leader()
    assert lead is not None
    lead.read_index(b"lease")
    rd = lead.ready()
    assert rd.read_states == [ReadState(lead.commit_index, b"lease")]
    assert not [m for m in rd.messages if m.type == MT.HEARTBEAT]
    lead.advance(rd)
    # cut the followers off: the lease (election_tick - drift = 8 ticks) runs out
    net.isolate(lead.id)
    net.tick(7, nodes=[lead.id])
    lead.read_index(b"still")
    net.process(lead.id)
    assert net.read_states[lead.id][-1] == ReadState(lead.commit_index, b"still")
    net.tick(1, nodes=[lead.id])
    assert lead.role == Role.LEADER
    lead.read_index(b"late")
    rd = lead.ready()
    assert not rd.read_states
    assert [m for m in rd.messages if m.type == MT.HEARTBEAT]


def test_lease_off_by_default_always_uses_a_round() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.tick(1)
    lead.read_index(b"r")
    rd = lead.ready()
    assert not rd.read_states
    assert [m for m in rd.messages if m.type == MT.HEARTBEAT]


def test_no_lease_reads_once_a_transfer_was_started() -> None:
    net = _lease_net()
    net.tick(30)
    lead = net.leader()
    assert lead is not None
    net.msg_filter = lambda m: m.type != MT.TIMEOUT_NOW
    lead.transfer_leader(lead.id % 3 + 1)
    net.stabilize()
    net.tick(10, nodes=[lead.id])  # transfer aborted after an election timeout
    assert lead.lead_transferee == 0 and lead.role == Role.LEADER
    lead.read_index(b"r")
    rd = lead.ready()
    assert not rd.read_states, "a TIMEOUT_NOW was sent: followers may vote, no lease"


class _AlwaysLease(RaftCore):
    def _lease_valid(self) -> bool:
        return True


def _stale_lease_reads(core_cls: type[RaftCore]) -> int:
    """Partition a lease-reading leader away and count the reads it serves at once
    after another leader was elected (each one is potentially stale)."""
    net = _lease_net()
    net.tick(30)
    old = net.leader()
    assert old is not None
    # swap in the variant for the leader (same state: rebuild from its disk and re-elect)
    net.cores[old.id] = core_cls(old._cfg, net.disks[old.id].persistent_state(),
                                 net.ids)
    net.tick(40)
    old = net.leader()
    assert old is not None and isinstance(old, core_cls)
    net.isolate(old.id)
    stale = 0
    for k in range(40):
        net.tick(1)
        newer = [c for c in net.cores.values() if c.role == Role.LEADER and c.term > old.term]
        if old.role == Role.LEADER:
            old.read_index(b"k%d" % k)
            rd = old.ready()
            if rd.read_states and newer:
                stale += 1
            net.queue.extend(rd.messages + rd.persisted_messages)
            old.advance(rd)
    return stale


def test_lease_expires_before_another_leader_can_exist() -> None:
    assert _stale_lease_reads(RaftCore) == 0
    assert _stale_lease_reads(_AlwaysLease) > 0  # the scenario does catch a broken lease


def test_forwarded_read_to_fresh_leader_waits_for_its_first_commit() -> None:
    net = Net([1, 2, 3])
    net.msg_filter = lambda m: m.type != MT.APP_RESP  # the no-op cannot commit yet
    lead = net.elect(1)
    assert not lead._read_index_allowed()
    net.cores[2].read_index(b"early")
    net.stabilize()
    assert net.read_states[2] == []
    net.msg_filter = None
    net.tick(1, nodes=[1])
    assert lead.commit_index == 1
    assert net.read_states[2] == [ReadState(1, b"early")]


@pytest.mark.parametrize("appended", [False, True])
def test_a_fenced_leader_answers_reads_at_its_last_index_and_counts_them(appended: bool) -> None:
    """With ``read_index_appended`` (the KV shards' read fence) a read's index covers
    entries the leader appended but has not committed, for the reader here and for one
    forwarded by a follower; the host fences appends after each counted answer."""
    net = Net([1, 2, 3], read_index_appended=appended)
    lead = net.elect(1)
    net.msg_filter = lambda m: m.type != MT.APP  # appended entries stay uncommitted
    lead.propose(b"in flight")
    net.stabilize()
    assert lead.last_index == lead.commit_index + 1
    lead.read_index(b"here")
    net.cores[2].read_index(b"there")
    net.tick(1)
    want = lead.last_index if appended else lead.commit_index
    assert net.read_states[1] == [ReadState(want, b"here")]
    assert net.read_states[2] == [ReadState(want, b"there")]
    assert lead.reads_answered == (2 if appended else 0)
