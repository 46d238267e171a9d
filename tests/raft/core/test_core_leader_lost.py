"""``RaftCore.leader_unreachable``: a follower whose link to a dead leader closed
campaigns within a few ticks instead of an election timeout, without ever
unseating a live leader (the pre-vote in-lease rejection still holds)."""

from __future__ import annotations

from typing import Any

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.types import NO_NODE, Message, MessageType, PersistentState, Role
from tests.raft.core.core_net import Net

MT = MessageType
ELECTION = 10  # Config.election_tick default
FAST = ELECTION // 3  # the largest remainder leader_unreachable may draw


def _stable(n: int = 3, **cfg: Any) -> Net:
    net = Net(range(1, n + 1), **cfg)
    net.elect(1)
    return net


def test_followers_of_a_dead_leader_elect_within_a_few_ticks() -> None:
    net = _stable()
    net.cores.pop(1)  # killed: its messages stop, its links close
    for i in (2, 3):
        assert net.cores[i].leader_unreachable(1)
    ticks = 0
    while net.leader() is None and ticks < ELECTION:
        net.tick(1)
        ticks += 1
    lead = net.leader()
    assert lead is not None and lead.id in (2, 3)
    assert ticks <= FAST < ELECTION
    assert lead.term == 2
    idx = lead.propose(b"after")
    net.stabilize()
    assert lead.commit_index >= idx


def test_without_the_report_the_followers_wait_an_election_timeout() -> None:
    net = _stable()
    net.cores.pop(1)
    net.tick(ELECTION - 1)
    assert net.leader() is None
    assert all(c.role == Role.FOLLOWER and c.leader_id == 1 for c in net.cores.values())


def test_only_a_follower_of_that_leader_reacts() -> None:
    net = _stable()
    f = net.cores[2]
    assert not f.leader_unreachable(3), "node 3 is not node 2's leader"
    assert not f.leader_unreachable(NO_NODE)
    assert not net.cores[1].leader_unreachable(2), "a leader has no leader to lose"
    net.tick(ELECTION - 1)
    assert f.role == Role.FOLLOWER and f.term == 1 and f.leader_id == 1


def test_learner_never_campaigns() -> None:
    net = Net([1, 2, 3], learners=[4])
    net.elect(1)
    assert not net.cores[4].leader_unreachable(1)


def test_off_without_pre_vote_or_check_quorum_or_with_lease_reads() -> None:
    for cfg in ({"pre_vote": False}, {"check_quorum": False},
                {"lease_read": True, "clock_drift_ticks": 2}):
        net = Net([1, 2, 3], **cfg)
        net.tick(3 * ELECTION)  # (lease-read nodes refuse votes for a timeout after start)
        lead = net.leader()
        assert lead is not None, cfg
        f = next(c for c in net.cores.values() if c is not lead)
        term = f.term
        assert not f.leader_unreachable(lead.id), cfg
        net.tick(ELECTION - 1)
        assert f.role == Role.FOLLOWER and f.term == term and f.leader_id == lead.id, cfg


def test_peer_inside_its_lease_still_rejects_the_pre_vote() -> None:
    net = _stable()
    f = net.cores[2]
    assert f.leader_unreachable(1)
    net.tick(FAST + 1, nodes=[2])  # only node 2 ticks: it campaigns
    assert f.role == Role.PRE_CANDIDATE and f.term == 1
    # Node 3 heard from the leader recently: it ignores the pre-vote, and so
    # does the live leader; nobody changes term.
    pre_votes = [m for m in net.sent if m.type == MT.PRE_VOTE and m.frm == 2]
    assert {m.to for m in pre_votes} == {1, 3}
    assert not [m for m in net.sent if m.type == MT.PRE_VOTE_RESP and m.to == 2
                and not m.reject]
    assert net.cores[3].term == 1 and net.cores[3].leader_id == 1
    assert net.cores[1].role == Role.LEADER and net.cores[1].term == 1


def test_a_live_leader_is_not_disrupted_by_a_spurious_report() -> None:
    net = _stable(5)
    lead = net.cores[1]
    for _ in range(5):  # a flapping link: reported lost again and again
        for i in (2, 3):
            net.cores[i].leader_unreachable(1)
        net.tick(ELECTION)
    assert lead.role == Role.LEADER and lead.term == 1
    for c in net.cores.values():
        assert c.term == 1 and c.leader_id == 1 and c.role in (Role.FOLLOWER, Role.LEADER)
    idx = lead.propose(b"still here")
    net.stabilize()
    assert all(c.commit_index >= idx for c in net.cores.values())


def test_a_heartbeat_after_the_report_keeps_the_follower() -> None:
    net = _stable()
    f = net.cores[2]
    assert f.leader_unreachable(1)
    hb = Message(MT.HEARTBEAT, to=2, frm=1, term=1, commit=f.commit_index)
    f.step(hb)  # the leader was alive after all: the lease is back
    net.stabilize()
    vote = Message(MT.PRE_VOTE, to=2, frm=3, term=2, log_term=1, index=f.last_index)
    f.step(vote)
    assert not f.ready().messages, "back in its lease, node 2 ignores the pre-vote"


def test_a_reported_follower_grants_the_other_ones_pre_vote() -> None:
    net = _stable()
    f = net.cores[3]
    assert f.leader_unreachable(1)
    vote = Message(MT.PRE_VOTE, to=3, frm=2, term=2, log_term=1, index=f.last_index)
    f.step(vote)
    resps = f.ready().messages
    assert [(m.type, m.reject) for m in resps] == [(MT.PRE_VOTE_RESP, False)]
    assert f.term == 1, "a pre-vote never changes the term"


def test_remainders_are_random_short_and_deterministic_per_seed() -> None:
    def ticks_to_campaign(seed: int) -> int:
        core = RaftCore(Config(id=2, seed=seed), PersistentState(), [1, 2, 3])
        core.step(Message(MT.HEARTBEAT, to=2, frm=1, term=1))
        core.tick()
        assert core.leader_id == 1
        assert core.leader_unreachable(1)
        for t in range(1, ELECTION):
            core.tick()
            if core.role != Role.FOLLOWER:
                assert core.role == Role.PRE_CANDIDATE and core.term == 1
                return t
        raise AssertionError("did not campaign within an election timeout")

    seen = {ticks_to_campaign(s) for s in range(30)}
    assert seen <= set(range(1, FAST + 1)) and len(seen) > 1
    assert ticks_to_campaign(5) == ticks_to_campaign(5)


def test_granting_a_pre_vote_hands_the_early_campaign_to_that_node() -> None:
    net = _stable()
    net.cores.pop(1)
    f3 = net.cores[3]
    assert f3.leader_unreachable(1)
    vote = Message(MT.PRE_VOTE, to=3, frm=2, term=2, log_term=1, index=f3.last_index)
    f3.step(vote)  # node 2 asked first: node 3 lets it go and waits a normal timeout
    assert [m.reject for m in f3.ready().messages] == [False]
    for _ in range(ELECTION):
        f3.tick()
    assert f3.role == Role.FOLLOWER, "node 3 must not compete with node 2's campaign"


def test_colliding_pre_candidates_leave_the_campaign_to_the_higher_id() -> None:
    net = _stable()
    net.cores.pop(1)
    low, high = net.cores[2], net.cores[3]
    for c in (low, high):
        assert c.leader_unreachable(1)
        while c.role == Role.FOLLOWER:
            c.tick()
    assert [low.role, high.role] == [Role.PRE_CANDIDATE, Role.PRE_CANDIDATE]
    net.stabilize()  # both pre-votes cross: node 2 steps back, node 3 goes on and wins
    assert (high.role, high.term) == (Role.LEADER, 2)
    assert (low.role, low.leader_id, low.vote) == (Role.FOLLOWER, 3, 3)
