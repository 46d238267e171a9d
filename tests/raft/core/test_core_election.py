"""Elections: pre-vote, check-quorum, leases against disruptive candidates, term bumps."""

from __future__ import annotations

import pytest

from accord.raft.core.raft import CAMPAIGN_TRANSFER, Config, RaftCore
from accord.raft.core.types import (
    NO_NODE,
    Entry,
    HardState,
    Message,
    MessageType,
    PersistentState,
    ProposalDropped,
    Role,
)
from tests.raft.core.core_net import Net

MT = MessageType


def test_three_nodes_elect_exactly_one_leader_by_ticks() -> None:
    net = Net([1, 2, 3])
    net.tick(25)
    leaders = [c for c in net.cores.values() if c.role == Role.LEADER]
    assert len(leaders) == 1
    lead = leaders[0]
    assert lead.term == 1
    for c in net.cores.values():
        assert c.leader_id == lead.id and c.term == 1
        assert c.commit_index == 1  # the leader's no-op is committed everywhere


def test_single_node_becomes_leader_and_commits() -> None:
    net = Net([1])
    lead = net.elect(1)
    idx = lead.propose(b"a")
    net.stabilize()
    assert lead.commit_index == idx
    assert net.applied[1] == [(idx, b"a")]


def test_pre_vote_keeps_term_of_isolated_node() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(3)
    net.tick(100)
    core3 = net.cores[3]
    assert core3.term == 1, "pre-vote must not bump the term of a partitioned node"
    assert core3.role == Role.PRE_CANDIDATE
    net.heal()
    net.tick(5)
    assert net.cores[1].role == Role.LEADER and net.cores[1].term == 1
    assert core3.role == Role.FOLLOWER and core3.leader_id == 1


def test_without_pre_vote_isolated_node_disrupts_on_return() -> None:
    net = Net([1, 2, 3], pre_vote=False, check_quorum=False)
    net.elect(1)
    net.isolate(3)
    net.tick(100, nodes=[3])
    assert net.cores[3].term > 5
    term3 = net.cores[3].term
    net.heal()
    net.tick(30)  # node 3's next VOTE carries its inflated term to everyone
    lead = net.leader()
    assert lead is not None and lead.term >= term3


def test_check_quorum_leader_steps_down_when_isolated() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(1)
    # Activity is checked every election timeout; the first check still sees the
    # responses from before the partition, the second sees none.
    net.tick(10, nodes=[1])
    assert net.cores[1].role == Role.LEADER
    net.tick(10, nodes=[1])
    assert net.cores[1].role == Role.FOLLOWER
    assert net.cores[1].term == 1
    with pytest.raises(ProposalDropped, match="no leader known"):
        net.cores[1].propose(b"x")


def test_check_quorum_leader_stays_while_it_hears_from_quorum() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(3)
    net.tick(50, nodes=[1, 2])
    assert net.cores[1].role == Role.LEADER


def test_follower_in_lease_ignores_higher_term_vote_unless_transfer() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    f = net.cores[2]
    vote = Message(MT.VOTE, to=2, frm=3, term=5, log_term=1, index=f.last_index)
    f.step(vote)
    assert f.term == 1 and f.vote == 1 and not f.ready().persisted_messages
    assert f.leader_id == 1
    vote.context = CAMPAIGN_TRANSFER
    f.step(vote)
    assert f.term == 5 and f.vote == 3
    rd = f.ready()
    assert [m.type for m in rd.persisted_messages] == [MT.VOTE_RESP]
    assert not rd.persisted_messages[0].reject
    assert rd.hard_state == HardState(5, 3, f.commit_index)


def test_vote_granted_only_to_up_to_date_log() -> None:
    ents = [Entry(1, 1), Entry(2, 2)]
    core = RaftCore(Config(id=1), PersistentState(HardState(2, 0, 1), None, ents), [1, 2, 3])
    stale = Message(MT.VOTE, to=1, frm=2, term=3, log_term=1, index=5)
    core.step(stale)
    rd = core.ready()
    assert rd.persisted_messages[0].reject and core.vote == NO_NODE and core.term == 3
    fresh = Message(MT.VOTE, to=1, frm=3, term=3, log_term=2, index=2)
    core.step(fresh)
    rd = core.ready()
    assert not rd.persisted_messages[0].reject and core.vote == 3
    # a second candidate of the same term is refused
    core.step(Message(MT.VOTE, to=1, frm=2, term=3, log_term=2, index=9))
    assert core.ready().persisted_messages[0].reject


def test_pre_vote_response_goes_unpersisted_and_keeps_term() -> None:
    core = RaftCore(Config(id=1), PersistentState(), [1, 2, 3])
    core.step(Message(MT.PRE_VOTE, to=1, frm=2, term=1, log_term=0, index=0))
    rd = core.ready()
    assert core.term == 0 and core.vote == NO_NODE
    assert [m.type for m in rd.messages] == [MT.PRE_VOTE_RESP]
    assert not rd.messages[0].reject and rd.messages[0].term == 1
    assert not rd.persisted_messages


def test_candidate_vote_requests_wait_for_persistence() -> None:
    core = RaftCore(Config(id=1, pre_vote=False), PersistentState(), [1, 2, 3])
    core.campaign()
    rd = core.ready()
    assert core.role == Role.CANDIDATE and core.term == 1
    assert rd.hard_state == HardState(1, 1, 0)
    assert sorted(m.to for m in rd.persisted_messages) == [2, 3]
    assert all(m.type == MT.VOTE for m in rd.persisted_messages)
    assert not rd.messages


def test_higher_term_append_makes_candidate_follow() -> None:
    core = RaftCore(Config(id=1, pre_vote=False), PersistentState(), [1, 2, 3])
    core.campaign()
    core.step(Message(MT.APP, to=1, frm=2, term=4, index=0, log_term=0, commit=0))
    assert core.role == Role.FOLLOWER and core.term == 4 and core.leader_id == 2


def test_stale_leader_is_told_the_new_term() -> None:
    core = RaftCore(Config(id=1), PersistentState(HardState(5, 0, 0)), [1, 2, 3])
    core.step(Message(MT.HEARTBEAT, to=1, frm=2, term=3))
    rd = core.ready()
    assert [(m.type, m.term) for m in rd.messages] == [(MT.APP_RESP, 5)]


def test_learner_and_removed_node_never_campaign() -> None:
    learner = RaftCore(Config(id=4), PersistentState(), [1, 2, 3], [4])
    outsider = RaftCore(Config(id=9), PersistentState(), [1, 2, 3])
    for core in (learner, outsider):
        for _ in range(100):
            core.tick()
        core.campaign()
        assert core.role == Role.FOLLOWER and core.term == 0
        assert not core.ready().messages


def test_lost_election_returns_to_follower() -> None:
    core = RaftCore(Config(id=1, pre_vote=False), PersistentState(), [1, 2, 3])
    core.campaign()
    core.step(Message(MT.VOTE_RESP, to=1, frm=2, term=1, reject=True))
    assert core.role == Role.CANDIDATE
    core.step(Message(MT.VOTE_RESP, to=1, frm=3, term=1, reject=True))
    assert core.role == Role.FOLLOWER and core.term == 1


def test_randomized_timeouts_are_deterministic_per_seed() -> None:
    def first_campaign_tick(seed: int) -> int:
        core = RaftCore(Config(id=1, seed=seed), PersistentState(), [1, 2, 3])
        for t in range(1, 100):
            core.tick()
            if core.role != Role.FOLLOWER:
                return t
        raise AssertionError("never campaigned")

    ticks = {first_campaign_tick(s) for s in range(20)}
    assert ticks <= set(range(10, 20)) and len(ticks) > 1
    assert first_campaign_tick(7) == first_campaign_tick(7)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="node id"):
        Config(id=0).validate()
    with pytest.raises(ValueError, match="election_tick"):
        Config(id=1, election_tick=1, heartbeat_tick=1).validate()
    with pytest.raises(ValueError, match="requires check_quorum"):
        Config(id=1, lease_read=True, check_quorum=False, clock_drift_ticks=1).validate()
    with pytest.raises(ValueError, match="clock_drift_ticks"):
        Config(id=1, lease_read=True).validate()


def test_malformed_messages_are_refused_without_effect() -> None:
    core = RaftCore(Config(id=1), PersistentState(), [1, 2, 3])
    with pytest.raises(ValueError, match="delivered to node 1"):
        core.step(Message(MT.HEARTBEAT, to=2, frm=3, term=1))
    with pytest.raises(ValueError, match="APP message from node 2 carries no term"):
        core.step(Message(MT.APP, to=1, frm=2, term=0, entries=[Entry(0, 1)]))
    assert core.last_index == 0 and core.term == 0 and not core.has_ready()
