"""Leadership transfer, learners and membership changes (simple and joint)."""

from __future__ import annotations

import pytest

from accord.raft.core.confchange import (
    ConfChange,
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeType,
    is_joint,
)
from accord.raft.core.types import ConfState, EntryType, MessageType, ProposalDropped, Role
from tests.raft.core.core_net import Net

MT = MessageType
AV, AL, RM = ConfChangeType.ADD_VOTER, ConfChangeType.ADD_LEARNER, ConfChangeType.REMOVE_NODE


def cc(*changes: tuple[ConfChangeType, int], auto_leave: bool = True) -> ConfChange:
    return ConfChange(tuple(ConfChangeSingle(t, n) for t, n in changes), auto_leave)


# -- leadership transfer ------------------------------------------------------------
def test_transfer_to_caught_up_follower() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    lead.propose(b"a")
    net.stabilize()
    lead.transfer_leader(2)
    assert lead.lead_transferee == 2
    with pytest.raises(ProposalDropped, match="leadership transfer to 2 in progress"):
        lead.propose(b"b")
    net.stabilize()
    assert net.cores[2].role == Role.LEADER and net.cores[2].term == 2
    assert lead.role == Role.FOLLOWER and lead.leader_id == 2
    assert [m for m in net.sent if m.type == MT.TIMEOUT_NOW and m.to == 2]


def test_transfer_catches_lagging_target_up_first() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.isolate(3)
    for k in range(5):
        lead.propose(b"x%d" % k)
        net.stabilize()
    net.heal()
    lead.transfer_leader(3)
    net.stabilize()
    c3 = net.cores[3]
    assert c3.role == Role.LEADER
    assert c3.log.term(6) == 1 and c3.last_index == 7  # all old entries plus its no-op


def test_transfer_aborts_after_an_election_timeout() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.isolate(2)
    lead.transfer_leader(2)
    net.tick(9, nodes=[1, 3])
    assert lead.lead_transferee == 2
    net.tick(1, nodes=[1, 3])
    assert lead.lead_transferee == 0 and lead.role == Role.LEADER
    lead.propose(b"accepted again")


def test_transfer_request_checks_and_forwarding() -> None:
    net = Net([1, 2, 3], learners=[4])
    lead = net.elect(1)
    with pytest.raises(ValueError, match="not a voter"):
        lead.transfer_leader(4)
    with pytest.raises(ValueError, match="not a voter"):
        lead.transfer_leader(9)
    net.cores[3].transfer_leader(3)  # a follower asks the leader
    net.stabilize()
    assert net.cores[3].role == Role.LEADER


# -- learners -----------------------------------------------------------------------
def test_learner_is_replicated_but_does_not_count() -> None:
    net = Net([1, 2, 3], learners=[4])
    lead = net.elect(1)
    lead.propose(b"l")
    net.stabilize()
    assert net.applied[4] == net.applied[1]
    assert lead.progress[4].is_learner
    net.isolate(2)
    net.isolate(3)
    net.cut -= {(1, 4), (4, 1)}
    idx = lead.propose(b"only the learner has it")
    net.stabilize()
    assert lead.progress[4].match == idx
    assert lead.commit_index < idx


def test_add_learner_then_promote() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    lead.propose(b"before")
    net.stabilize()
    net.add_node(4, voters=[1, 2, 3], learners=[])
    lead.propose_conf_change(cc((AL, 4)))
    net.stabilize()
    for c in net.cores.values():
        assert c.conf_state == ConfState(voters=(1, 2, 3), learners=(4,))
    assert net.applied[4] == net.applied[1]
    lead.propose_conf_change(cc((AV, 4)))
    net.stabilize()
    assert all(c.conf_state.voters == (1, 2, 3, 4) for c in net.cores.values())
    assert not lead.progress[4].is_learner


def test_one_pending_conf_change_at_a_time_and_validation() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    lead.propose_conf_change(cc((AL, 4)))
    with pytest.raises(ProposalDropped, match="already pending"):
        lead.propose_conf_change(cc((AL, 5)))
    net.stabilize()
    with pytest.raises(ConfChangeError, match="not in a joint"):
        lead.propose_conf_change(ConfChange.leave())
    last = lead.last_index
    with pytest.raises(ConfChangeError, match="more than once"):
        lead.propose_conf_change(cc((AL, 5), (AV, 5)))
    assert lead.last_index == last


# -- joint consensus ------------------------------------------------------------------
def test_joint_consensus_enter_and_auto_leave() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for i in (4, 5):
        net.add_node(i, voters=[1, 2, 3], learners=[])
    lead.propose_conf_change(cc((AV, 4), (AV, 5), (RM, 3)))
    seen_joint = False
    for _ in range(50):
        for i in list(net.cores):
            net.process(i)
        seen_joint |= is_joint(lead.conf_state)
        while net.queue:
            net.deliver(net.queue.popleft())
    net.stabilize()
    assert seen_joint
    for i in (1, 2, 4, 5):
        assert net.cores[i].conf_state == ConfState(voters=(1, 2, 4, 5))
    ccs = [lead.log.entry(i) for i in range(1, lead.last_index + 1)]
    kinds = [ConfChange.decode(e.data) for e in ccs if e.type == EntryType.CONF_CHANGE]
    assert len(kinds) == 2 and kinds[1].leave_joint
    assert 3 not in lead.progress
    lead.propose(b"after")
    net.stabilize()
    assert net.applied[5][-1][1] == b"after"


def test_joint_config_needs_both_majorities_and_explicit_leave() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for i in (4, 5):
        net.add_node(i, voters=[1, 2, 3], learners=[])
    lead.propose_conf_change(cc((AV, 4), (AV, 5), (RM, 2), (RM, 3), auto_leave=False))
    net.stabilize()
    assert lead.conf_state == ConfState(voters=(1, 4, 5), voters_outgoing=(1, 2, 3))
    with pytest.raises(ConfChangeError, match="leave it before"):
        lead.propose_conf_change(cc((AV, 6)))
    # new half cut off: old majority (1,2,3) alone cannot commit
    for i in (4, 5):
        net.isolate(i)
    idx = lead.propose(b"joint")
    net.stabilize()
    assert lead.commit_index < idx
    net.heal()
    net.tick(1, nodes=[1])
    assert lead.commit_index >= idx
    # and the new half alone cannot either
    for i in (2, 3):
        net.isolate(i)
    idx = lead.propose(b"joint2")
    net.stabilize()
    assert lead.commit_index < idx
    net.heal()
    net.tick(1, nodes=[1])
    lead.propose_conf_change(ConfChange.leave())
    net.stabilize()
    assert lead.conf_state == ConfState(voters=(1, 4, 5))


def test_removed_leader_steps_down_and_hands_off() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    lead.propose_conf_change(cc((RM, 1)))
    net.stabilize()
    assert lead.role == Role.FOLLOWER
    new = net.leader()
    assert new is not None and new.id in (2, 3)
    assert new.conf_state.voters == (2, 3)
    net.tick(50, nodes=[1])
    assert lead.role == Role.FOLLOWER  # a removed node never campaigns


def test_restart_replays_conf_changes() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.add_node(4, voters=[1, 2, 3], learners=[])
    lead.propose_conf_change(cc((AV, 4), (RM, 3)))
    net.stabilize()
    assert lead.conf_state == ConfState(voters=(1, 2, 4))
    c2 = net.restart(2)
    assert c2.conf_state == ConfState(voters=(1, 2, 3))  # as of the (empty) snapshot
    net.stabilize()
    assert c2.conf_state == ConfState(voters=(1, 2, 4))


def test_new_node_accepts_snapshot_that_predates_it() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for k in range(3):
        lead.propose(b"c%d" % k)
    net.stabilize()
    net.compact(1)  # the snapshot's membership is {1, 2, 3}
    c4 = net.add_node(4, voters=[], learners=[])  # joins knowing nothing
    lead.propose_conf_change(cc((AV, 4)))
    net.stabilize()
    assert c4.log.snapshot_index == 4
    assert c4.conf_state == ConfState(voters=(1, 2, 3, 4))
    assert net.applied[4] == net.applied[1]
    assert lead.progress[4].match == lead.last_index


def test_node_with_unknown_membership_never_invents_one() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    c4 = net.add_node(4, voters=[], learners=[])
    lead.propose_conf_change(cc((AL, 4)))  # replayed from index 1 on node 4
    net.stabilize()
    assert c4.conf_state == ConfState()  # skipped, not ConfState(learners=(4,)) alone
    net.tick(50, nodes=[4])
    assert c4.role == Role.FOLLOWER and c4.term == lead.term
