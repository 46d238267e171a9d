"""Replication: conflict resolution, the commit rule, pipelining, progress states,
snapshots after compaction, the uncommitted bound and restarts."""

from __future__ import annotations

import pytest

from accord.raft.core.confchange import ConfChange
from accord.raft.core.progress import Progress, ProgressState
from accord.raft.core.raft import COMMIT_ONLY, Config, RaftCore
from accord.raft.core.types import (
    Entry,
    HardState,
    Message,
    MessageType,
    PersistentState,
    ProposalDropped,
    Role,
)
from tests.raft.core.core_net import Disk, Net

MT = MessageType


def _terms_log(terms: list[int]) -> list[Entry]:
    return [Entry(t, i + 1, data=b"t%d" % t) for i, t in enumerate(terms)]


def _install(net: Net, i: int, terms: list[int], term: int, commit: int) -> None:
    ents = _terms_log(terms)
    hs = HardState(term, 0, commit)
    net.disks[i] = Disk(hs, None, list(ents))
    net.cores[i] = RaftCore(Config(id=i, seed=i), PersistentState(hs, None, ents), net.ids)


def test_figure7_logs_converge_with_few_round_trips() -> None:
    leader_terms = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
    followers = {
        2: [1, 1, 1, 4, 4, 5, 5, 6, 6],
        3: [1, 1, 1, 4],
        4: [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
        5: [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
        6: [1, 1, 1, 4, 4, 4, 4],
        7: [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
    }
    net = Net(range(1, 8))
    _install(net, 1, leader_terms, 7, 3)
    for i, terms in followers.items():
        _install(net, i, terms, 7, 3)
    lead = net.elect(1)
    assert lead.term == 8
    expected = [*leader_terms, 8]
    for c in net.cores.values():
        assert [c.log.term(i) for i in range(1, c.last_index + 1)] == expected
        assert c.commit_index == 11
    # fast backtracking: node 7 diverges from index 4 over 8 entries of 2 terms
    rejects_from_7 = [m for m in net.sent if m.frm == 7 and m.type == MT.APP_RESP and m.reject]
    assert 1 <= len(rejects_from_7) <= 2


def test_follower_truncates_uncommitted_conflicting_suffix() -> None:
    net = Net([1, 2, 3])
    _install(net, 1, [1, 1, 2], 2, 1)
    _install(net, 2, [1, 1, 2], 2, 1)
    _install(net, 3, [1, 1, 1, 1, 1], 2, 1)
    net.elect(1)
    c3 = net.cores[3]
    assert [c3.log.term(i) for i in range(1, c3.last_index + 1)] == [1, 1, 2, 3]
    assert net.disks[3].entries == net.disks[1].entries


def test_old_term_entries_commit_only_through_current_term_entry() -> None:
    hs = HardState(2, 0, 1)
    ents = _terms_log([1, 2])

    def make(cls: type[RaftCore]) -> RaftCore:
        core = cls(Config(id=1, pre_vote=False), PersistentState(hs, None, ents), [1, 2, 3])
        core.campaign()
        core.step(Message(MT.VOTE_RESP, to=1, frm=2, term=3))
        assert core.role == Role.LEADER and core.last_index == 3
        # node 2 holds index 2 (term 2): with the leader that is a majority for index 2
        core.step(Message(MT.APP_RESP, to=1, frm=2, term=3, index=2))
        return core

    core = make(RaftCore)
    assert core.commit_index == 1, "a term-2 entry must not commit by counting in term 3"

    class Broken(RaftCore):
        def _can_commit_by_counting(self, index: int) -> bool:
            return True

    assert make(Broken).commit_index == 2  # the hook is what enforces the rule
    # once the leader's own no-op (term 3) is durable and acked, everything commits
    rd = core.ready()
    core.advance(rd)
    core.step(Message(MT.APP_RESP, to=1, frm=2, term=3, index=3))
    assert core.commit_index == 3


def test_proposals_between_readies_travel_in_one_append() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for k in range(5):
        lead.propose(b"p%d" % k)
    rd = lead.ready()
    apps = [m for m in rd.messages if m.type == MT.APP]
    assert sorted(m.to for m in apps) == [2, 3]
    assert all(len(m.entries) == 5 for m in apps)
    net.queue.extend(rd.messages)
    lead.advance(rd)
    net.stabilize()
    assert [d for _, d in net.applied[3]] == [b"p%d" % k for k in range(5)]


@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({"max_inflight_msgs": 3, "max_size_per_msg": 1}, 3),
        ({"max_inflight_msgs": 100, "max_inflight_bytes": 250, "max_size_per_msg": 1}, 3),
        ({"max_inflight_msgs": 100, "max_inflight_bytes": 1000, "max_size_per_msg": 350}, 4),
    ],
)
def test_pipelining_window_bounds_messages_and_bytes(cfg: dict[str, int], expected: int) -> None:
    net = Net([1, 2, 3], **cfg)
    lead = net.elect(1)
    assert lead.progress[2].state == ProgressState.REPLICATE
    for k in range(10):
        lead.propose(bytes([k]) * 100)
    rd = lead.ready()
    to2 = [m for m in rd.messages if m.type == MT.APP and m.to == 2]
    assert len(to2) == expected
    assert lead.progress[2].inflights.full()
    # acks open the window again and the rest streams
    lead.advance(rd)
    net.queue.extend(rd.messages)
    net.stabilize()
    assert net.cores[2].commit_index == lead.last_index == 11
    assert len(net.applied[2]) == 10


def test_probe_then_replicate() -> None:
    net = Net([1, 2, 3])
    lead = net.cores[1]
    lead.campaign()
    net.stabilize()
    assert lead.role == Role.LEADER
    # new leader: peers start in probe; after the first ack they replicate
    assert all(lead.progress[i].state == ProgressState.REPLICATE for i in (2, 3))
    lead.report_unreachable(2)
    assert lead.progress[2].state == ProgressState.PROBE
    lead.propose(b"x")
    rd = lead.ready()
    assert len([m for m in rd.messages if m.to == 2 and m.type == MT.APP]) == 1
    assert lead.progress[2].msg_app_flow_paused
    net.queue.extend(rd.messages)
    lead.advance(rd)
    net.stabilize()
    assert lead.progress[2].state == ProgressState.REPLICATE
    assert lead.progress[2].match == lead.last_index


def test_compaction_then_snapshot_to_lagging_follower() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.isolate(3)
    for k in range(20):
        lead.propose(b"v%d" % k)
        net.stabilize()
    assert lead.commit_index == 21 and lead.applied_index == 21
    net.compact(1)
    assert lead.log.first_index() == 22
    lead.compact(lead.log.snapshot_meta)  # compacting again is a no-op
    assert lead.log.first_index() == 22
    net.heal()
    net.tick(2, nodes=[1])
    snaps = [m for m in net.sent if m.type == MT.SNAP and m.to == 3]
    assert len(snaps) == 1 and snaps[0].snapshot is not None
    assert snaps[0].snapshot.meta.index == 21
    assert snaps[0].snapshot.meta.conf_state.voters == (1, 2, 3)
    c3 = net.cores[3]
    assert c3.log.snapshot_index == 21 and c3.applied_index == 21
    assert lead.progress[3].state == ProgressState.REPLICATE
    lead.propose(b"after")
    net.stabilize()
    assert net.applied[3] == net.applied[1]
    assert net.applied[3][-1] == (22, b"after")
    assert net.disks[3].snapshot is not None and net.disks[3].snapshot.index == 21


def test_failed_snapshot_report_goes_back_to_probe() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.isolate(3)
    lead.propose(b"a")
    net.stabilize()
    net.compact(1)
    net.heal()
    net.msg_filter = lambda m: m.type != MT.SNAP  # the snapshot is lost
    net.tick(1, nodes=[1])
    assert lead.progress[3].state == ProgressState.SNAPSHOT
    lead.report_snapshot(3, ok=False)
    assert lead.progress[3].state == ProgressState.PROBE
    net.msg_filter = None
    net.tick(3, nodes=[1])
    assert net.cores[3].commit_index == lead.commit_index


def test_uncommitted_size_bound() -> None:
    net = Net([1, 2, 3], max_uncommitted_entries_size=1000)
    lead = net.elect(1)
    net.isolate(1)
    lead.propose(b"a" * 600)
    lead.propose(b"b" * 300)
    with pytest.raises(ProposalDropped, match="too many uncommitted entries"):
        lead.propose(b"c" * 200)
    last = lead.last_index
    lead.propose(b"")  # empty proposals never count
    assert lead.last_index == last + 1
    net.heal()
    net.stabilize()
    net.tick(1, nodes=[1])
    assert lead.commit_index == lead.last_index
    lead.propose(b"c" * 200)  # committed entries no longer count


def test_an_oversized_single_proposal_is_accepted_when_nothing_is_pending() -> None:
    net = Net([1], max_uncommitted_entries_size=10)
    lead = net.elect(1)
    lead.propose(b"x" * 100)


def test_proposal_refusals_name_the_reason() -> None:
    net = Net([1, 2, 3])
    with pytest.raises(ProposalDropped, match="no leader known"):
        net.cores[2].propose(b"x")
    net.elect(1)
    with pytest.raises(ProposalDropped, match="not leader; leader is 1"):
        net.cores[2].propose(b"x")
    with pytest.raises(ProposalDropped, match="not leader; leader is 1"):
        net.cores[2].propose_conf_change(ConfChange.leave())


def test_restart_from_persistent_state() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for k in range(5):
        lead.propose(b"r%d" % k)
    net.stabilize()
    before = {i: list(net.applied[i]) for i in net.cores}
    terms = {i: c.term for i, c in net.cores.items()}
    for i in list(net.cores):
        c = net.restart(i)
        assert c.term == terms[i] and c.role == Role.FOLLOWER
        assert c.commit_index == 6 and c.applied_index == 0
    net.stabilize()  # replays the committed entries to the (lost) application state
    assert {i: net.applied[i] for i in net.cores} == before
    net.tick(40)
    lead2 = net.leader()
    assert lead2 is not None and lead2.term > terms[1]
    lead2.propose(b"new")
    net.stabilize()
    assert all(net.applied[i][-1][1] == b"new" for i in net.cores)
    assert all(len(net.applied[i]) == 6 for i in net.cores)


def test_restart_from_snapshot() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    for k in range(4):
        lead.propose(b"s%d" % k)
    net.stabilize()
    net.compact(2)
    c2 = net.restart(2)
    assert c2.log.first_index() == 6 and c2.applied_index == 5
    assert c2.conf_state.voters == (1, 2, 3)
    assert net.applied[2] == net.applied[1]
    lead.propose(b"more")
    net.stabilize()
    assert net.applied[2] == net.applied[1]


def test_bad_persistent_state_is_rejected() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        RaftCore(Config(id=1), PersistentState(HardState(1, 0, 0), None,
                                               [Entry(1, 1), Entry(1, 3)]), [1])
    with pytest.raises(ValueError, match="beyond the last log index"):
        RaftCore(Config(id=1), PersistentState(HardState(1, 0, 5), None, [Entry(1, 1)]), [1])


def test_lost_snapshot_ack_is_recovered_through_heartbeats() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.isolate(3)
    for k in range(3):
        lead.propose(b"k%d" % k)
        net.stabilize()
    net.compact(1)
    net.heal()
    # the follower installs the snapshot but its acknowledgement is lost
    c3 = net.cores[3]
    net.msg_filter = lambda m: not (
        m.type == MT.APP_RESP and m.frm == 3 and c3.log.snapshot_index > 0
    )
    net.tick(1, nodes=[1])
    assert net.cores[3].log.snapshot_index == 4
    assert lead.progress[3].state == ProgressState.SNAPSHOT
    net.msg_filter = None
    net.tick(2, nodes=[1])  # the heartbeat answer carries the follower's commit
    assert lead.progress[3].state == ProgressState.REPLICATE
    assert lead.progress[3].match == lead.last_index


def _commit_notices(net: Net, frm: int) -> list[Message]:
    return [m for m in net.sent if m.type == MT.APP and m.frm == frm and not m.entries]


def test_a_caught_up_follower_leaves_a_commit_only_append_unanswered() -> None:
    net = Net([1, 2, 3])
    lead = net.elect(1)
    net.sent.clear()
    lead.propose(b"x")
    net.stabilize()
    notices = _commit_notices(net, 1)
    assert sorted(m.to for m in notices) == [2, 3]
    assert all(m.context == COMMIT_ONLY and m.commit == lead.last_index for m in notices)
    # one answer per APP that carried the entry, none for the commit notices
    answers = [m for m in net.sent if m.type == MT.APP_RESP]
    assert sorted(m.frm for m in answers) == [2, 3]
    for i in (2, 3):
        assert net.cores[i].commit_index == lead.last_index
        assert net.applied[i][-1][1] == b"x"
        assert lead.progress[i].match == lead.last_index


class _QuietToEveryone(RaftCore):
    """Broken: marks every APP without entries unanswerable, even to a follower whose
    acknowledgement of earlier entries the leader has not received."""

    def _answer_teaches_nothing(self, pr: Progress, prev: int, ents: list[Entry]) -> bool:
        return not ents


def _lost_ack_then_heartbeats(core_class: type[RaftCore]) -> int:
    """The leader's ``match`` for follower 3 after its only acknowledgement was lost
    and a few heartbeat rounds passed."""
    net = Net([1, 2, 3])
    net.cores[1] = core_class(Config(id=1, seed=1), PersistentState(), [1, 2, 3])
    lead = net.elect(1)
    net.msg_filter = lambda m: not (m.type == MT.APP_RESP and m.frm == 3)
    lead.propose(b"x")
    net.stabilize()  # committed through node 2; node 3 holds it, its answer was lost
    assert net.cores[3].log.last_index() == lead.last_index
    net.msg_filter = None
    net.tick(3, nodes=[1])
    return lead.progress[3].match


def test_a_lost_acknowledgement_is_still_recovered_by_an_answered_empty_append() -> None:
    assert _lost_ack_then_heartbeats(RaftCore) == 2
    # the broken variant's empty APPs go unanswered: node 3's progress never moves
    assert _lost_ack_then_heartbeats(_QuietToEveryone) == 1
