"""The Raft state machine: pure, deterministic, no I/O, no clock.

Inputs are ``tick()`` (the only notion of time), ``step(message)``, proposals
and requests; outputs are collected in a ``Ready`` (see ``types.Ready`` for the
caller's order of duty) and acknowledged with ``advance()``. The structure
follows etcd's raft library: one step function per role, per-peer ``Progress``
(``progress.py``), quorum arithmetic as pure functions (``quorum.py``), joint
consensus transitions (``confchange.py``) and ReadIndex bookkeeping
(``readonly.py``). Those pieces each hold one idea; this module holds the
protocol itself, every role's step function and the config in force, and it is
long because the protocol is (as etcd's ``raft.go``): the follower, candidate and
leader halves read together, and splitting them would only spread one class over
files. Sections: the public API, role transitions and elections, the follower's
handlers, then the leader's half (replication, commit, heartbeats, reads, transfer;
sends are lazy: steps mark peers in ``_send_pending`` / ``_probe_pending`` and
``_flush_leader`` builds the APP/SNAP messages in ``ready()``), and last the
membership in force (committed CONF_CHANGE entries take effect in ``advance()``; a
leader that is no longer a voter hands off to its most caught-up voter and steps
down; with ``auto_leave`` the leader proposes leaving the joint config itself).

Choices worth knowing:

* Sends are lazy: proposals, acks and commit advances mark peers as needing an
  APP, and ``ready()`` builds the messages, so many proposals between two
  ``ready()`` calls travel in one APP per follower.
* An APP that carries only the commit index to a follower whose progress already
  matches it is marked ``COMMIT_ONLY`` and goes unanswered: its acknowledgement
  would not move ``match``, and heartbeats keep the follower counted as active.
  A follower that cannot append it (a gap: an APP was lost) still answers.
* Reads requested between two ``ready()`` calls share one heartbeat round.
* Committed CONF_CHANGE entries take effect in ``advance()``, i.e. once the
  caller has applied the ``committed_entries`` that carried them.
  ``conf_state`` is therefore always the membership as of ``applied_index``.
  A change that no longer applies (a replay after a restart whose
  ``PersistentState.conf_state`` already includes it) is skipped.
* The leader counts its own log toward commit only for entries an ``advance()``
  confirmed durable.
* On restart ``applied_index`` starts at the snapshot index, so committed
  entries after it are handed out again; the initial membership is
  ``PersistentState.conf_state``, else the snapshot's, else ``voters``/``learners``.
* A node joining an existing group must be started with the group's
  membership (or get a snapshot): a core whose membership is empty never
  applies a change to it, so it cannot invent a config in which it is alone.
* A follower forwards ``transfer_leader`` as TRANSFER_LEADER with the target in
  ``Message.index``; reads as READ_INDEX with the caller's ctx in ``context``.
  A leader holds forwarded reads that arrive before its no-op commits and
  serves them once it does; reads lost to a leader change are simply never
  answered (the caller times out and retries).
* ``leader_unreachable(peer)`` lets the transport say a dead leader's link
  closed: the follower campaigns within a few ticks instead of an election
  timeout (PreVote + CheckQuorum keep that from disrupting a live leader).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from accord.raft.core.confchange import (
    ConfChange,
    ConfChangeError,
    apply_conf_change,
    is_joint,
    members,
)
from accord.raft.core.log import RaftLog
from accord.raft.core.progress import Inflights, Progress, ProgressState
from accord.raft.core.quorum import VoteResult, joint_committed_index, joint_vote_result
from accord.raft.core.readonly import ReadOnly, decode_round, encode_round
from accord.raft.core.types import (
    NO_NODE,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    PersistentState,
    ProposalDropped,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
)

CAMPAIGN_TRANSFER = b"transfer"
"""Context of VOTE messages of a leadership-transfer campaign (bypasses leases)."""

COMMIT_ONLY = b"commit"
"""Context of an APP that only tells a caught-up follower the commit index: its
acknowledgement would teach the leader nothing, so the follower sends none."""

MT = MessageType

_NEEDS_TERM = frozenset({MT.APP, MT.HEARTBEAT, MT.SNAP, MT.TIMEOUT_NOW, MT.VOTE, MT.PRE_VOTE,
                         MT.READ_INDEX_RESP})
"""Messages only a node with a term sends (a term of 0 there is a malformed message)."""


@dataclass(slots=True)
class Config:
    """Tuning and feature switches of one core (see raft_api.md)."""

    id: int
    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_size_per_msg: int = 1 << 20
    max_inflight_msgs: int = 256
    max_inflight_bytes: int = 8 << 20
    max_uncommitted_entries_size: int = 64 << 20
    lease_read: bool = False
    clock_drift_ticks: int = 0
    seed: int | None = None
    read_index_appended: bool = False
    """A leader answers a ReadIndex with its *last* index when it answers, not its
    commit index, and counts the answers (:attr:`RaftCore.reads_answered`): every entry
    appended before the answer is then applied before the read is served, so the host
    can fence what is appended after it (the KV shards' read fence, ``docs/txn.md``)."""

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent setting."""
        if self.id <= 0:
            raise ValueError(f"node id must be > 0, got {self.id}")
        if self.heartbeat_tick <= 0:
            raise ValueError(f"heartbeat_tick must be > 0, got {self.heartbeat_tick}")
        if self.election_tick <= self.heartbeat_tick:
            raise ValueError(f"election_tick ({self.election_tick}) must be greater than "
                             f"heartbeat_tick ({self.heartbeat_tick})")
        if self.max_size_per_msg < 0 or self.max_inflight_bytes < 0:
            raise ValueError("max_size_per_msg and max_inflight_bytes must be >= 0")
        if self.max_inflight_msgs <= 0:
            raise ValueError(f"max_inflight_msgs must be > 0, got {self.max_inflight_msgs}")
        if self.max_uncommitted_entries_size <= 0:
            raise ValueError("max_uncommitted_entries_size must be > 0")
        if self.clock_drift_ticks < 0:
            raise ValueError(f"clock_drift_ticks must be >= 0, got {self.clock_drift_ticks}")
        if self.lease_read:
            if not self.check_quorum:
                raise ValueError("lease_read requires check_quorum")
            if not 0 < self.clock_drift_ticks < self.election_tick:
                raise ValueError("lease_read requires 0 < clock_drift_ticks < election_tick, "
                                 f"got clock_drift_ticks={self.clock_drift_ticks}")


class RaftCore:
    """One member of one Raft group (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        state: PersistentState,
        voters: Sequence[int] = (),
        learners: Sequence[int] = (),
    ) -> None:
        config.validate()
        self._cfg = config
        self._id = config.id
        hs = state.hard_state
        self._log = RaftLog(state.snapshot, state.entries, hs.commit)
        self._term = hs.term
        self._vote = hs.vote
        if state.conf_state is not None:
            cs = state.conf_state
        elif state.snapshot is not None and state.snapshot.conf_state.voters:
            cs = state.snapshot.conf_state
        else:
            cs = ConfState(voters=tuple(sorted(set(voters))), learners=tuple(sorted(set(learners))))
        if set(cs.voters) & set(cs.learners):
            raise ValueError(f"nodes {sorted(set(cs.voters) & set(cs.learners))} are both "
                             "voters and learners")
        self._conf_index = self._log.snapshot_index
        self._rand = random.Random(config.seed if config.seed is not None else config.id)
        self._role = Role.FOLLOWER
        self._lead = NO_NODE
        self._prs: dict[int, Progress] = {}
        self._votes: dict[int, bool] = {}
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = config.election_tick
        self._now = 0
        self._msgs: list[Message] = []
        self._pmsgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._readonly = ReadOnly()
        self._early_reads: list[tuple[int, bytes]] = []
        self._round_seq = 0
        self.reads_answered = 0
        """ReadIndex requests this node answered as leader with
        ``Config.read_index_appended`` on (the host fences appends after each change)."""
        self._lead_transferee = NO_NODE
        self._pending_conf_index = 0
        self._uncommitted_size = 0
        self._bcast_pending = False
        self._send_pending: set[int] = set()
        self._probe_pending: set[int] = set()
        self._lease_broken = False
        self._leader_lost = False
        """Set by ``leader_unreachable``: this node's early campaign is under way."""
        self._prev_hs = hs
        self._prev_soft = SoftState()
        self._incoming: tuple[int, ...] = ()
        self._outgoing: tuple[int, ...] = ()
        self._voter_set: frozenset[int] = frozenset()
        self._promotable = False
        self._self_quorum = False
        self._conf = cs
        self._set_conf(cs)
        self._become_follower(self._term, NO_NODE)

    # ------------------------------------------------------------------ properties
    @property
    def id(self) -> int:
        """This node's id."""
        return self._id

    @property
    def term(self) -> int:
        """The current term."""
        return self._term

    @property
    def vote(self) -> int:
        """Whom this node voted for in the current term (NO_NODE: nobody)."""
        return self._vote

    @property
    def role(self) -> Role:
        """The current role."""
        return self._role

    @property
    def leader_id(self) -> int:
        """The known leader of the current term (NO_NODE when unknown)."""
        return self._lead

    @property
    def commit_index(self) -> int:
        """The highest index known committed."""
        return self._log.committed

    @property
    def applied_index(self) -> int:
        """The highest index the application confirmed applied (via ``advance``)."""
        return self._log.applied

    @property
    def last_index(self) -> int:
        """The index of the last entry in the log."""
        return self._log.last_index()

    @property
    def conf_state(self) -> ConfState:
        """The membership in force (as of ``applied_index``)."""
        return self._conf

    @property
    def progress(self) -> dict[int, Progress]:
        """Per-peer replication progress (leader only; empty otherwise). Do not mutate."""
        return self._prs if self._role == Role.LEADER else {}

    @property
    def lead_transferee(self) -> int:
        """The target of a leadership transfer in progress (NO_NODE: none)."""
        return self._lead_transferee

    @property
    def log(self) -> RaftLog:
        """The in-memory log, for inspection (tests, simulator invariants). Do not mutate."""
        return self._log

    @property
    def hard_state(self) -> HardState:
        """The current (possibly not yet persisted) hard state."""
        return HardState(self._term, self._vote, self._log.committed)

    # ------------------------------------------------------------------ test hooks
    # (_can_commit_by_counting, _answer_teaches_nothing and _read_index_allowed are in
    # the leader section below)
    def _log_is_up_to_date(self, last_term: int, last_index: int) -> bool:
        """Grant a vote only to a candidate whose log is at least as up to date (§5.4.1)."""
        return self._log.is_up_to_date(last_term, last_index)

    # ------------------------------------------------------------------ inputs
    def tick(self) -> None:
        """Advance logical time by one tick."""
        self._now += 1
        if self._role == Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def campaign(self) -> None:
        """Start an election now (pre-vote first if enabled).

        Does nothing on a leader or on a node that may not campaign (a learner,
        a removed node, or one with unapplied committed membership changes).
        """
        self._hup(transfer=False)

    def propose(self, data: bytes) -> int:
        """Append a command to the log (leader only); returns the index it got."""
        self._check_can_propose()
        return self._append_proposal(EntryType.NORMAL, bytes(data))

    def propose_conf_change(self, cc: ConfChange) -> int:
        """Propose a membership change (leader only, one pending at a time)."""
        self._check_can_propose()
        if self._pending_conf_index > self._log.applied:
            raise ProposalDropped(
                f"a configuration change is already pending (index {self._pending_conf_index}, "
                f"applied {self._log.applied}); retry once it is applied"
            )
        apply_conf_change(self._conf, cc)  # validates; raises ConfChangeError
        index = self._append_proposal(EntryType.CONF_CHANGE, cc.encode())
        self._pending_conf_index = index
        return index

    def read_index(self, ctx: bytes) -> None:
        """Request a ReadIndex; the answer is ``ReadState(index, ctx)`` in a later Ready."""
        if self._role == Role.LEADER:
            reason = self._leader_read(self._id, ctx)
            if reason:
                raise ProposalDropped(reason)
            return
        if self._lead == NO_NODE:
            raise ProposalDropped("no leader known; retry after an election")
        self._send(Message(MT.READ_INDEX, to=self._lead, frm=self._id, context=ctx))

    def answer_reads_at_last_index(self) -> None:
        """Turn on ``Config.read_index_appended`` (the host's read fence needs it)."""
        self._cfg.read_index_appended = True

    def transfer_leader(self, target: int) -> None:
        """Hand leadership to ``target`` (TimeoutNow); followers forward the request."""
        if self._role != Role.LEADER:
            if self._lead == NO_NODE:
                raise ProposalDropped("no leader known; retry after an election")
            self._send(Message(MT.TRANSFER_LEADER, to=self._lead, frm=self._id, index=target))
            return
        self._handle_transfer(target, strict=True)

    def report_unreachable(self, peer: int) -> None:
        """The transport failed to deliver to ``peer``: stop streaming, probe again."""
        pr = self._prs.get(peer) if self._role == Role.LEADER else None
        if pr is not None and pr.state == ProgressState.REPLICATE:
            pr.become_probe()

    def leader_unreachable(self, peer: int) -> bool:
        """The transport lost its link to ``peer`` and could not re-establish it.

        If ``peer`` is this follower's leader, the leader is presumed dead (its
        process died and its connections closed): the follower gives up its lease
        and campaigns after a short random remainder (1..election_tick//3 ticks,
        so followers rarely collide) instead of a whole randomized timeout. Only
        with PreVote and CheckQuorum on and lease reads off: a pre-vote is still
        refused by every peer that heard from a leader within the election
        timeout, so a follower that merely lost its own link cannot unseat a live
        leader, while the other followers, which saw the same link close, grant
        it. Lease reads count on followers keeping their lease for the full
        timeout, so they keep it. Returns whether the timer was fast-forwarded.

        Followers that lost the same leader tend to campaign at once and split
        the vote, so the first pre-vote wins: a node that grants another's
        pre-vote gives up its own early campaign (a pre-candidate only for a
        higher id, so that two colliding ones don't both step back) and falls
        back to a normal election timeout, should that campaign fail.
        """
        cfg = self._cfg
        if (not (cfg.pre_vote and cfg.check_quorum) or cfg.lease_read or peer == NO_NODE
                or self._role != Role.FOLLOWER or self._lead != peer or not self._promotable):
            return False
        self._leader_lost = True
        self._election_elapsed = max(self._election_elapsed, cfg.election_tick)
        soon = self._election_elapsed + 1 + self._rand.randrange(max(1, cfg.election_tick // 3))
        self._randomized_timeout = min(self._randomized_timeout, soon)
        return True

    def report_snapshot(self, peer: int, ok: bool) -> None:
        """The snapshot sent to ``peer`` was delivered (``ok``) or failed."""
        pr = self._prs.get(peer) if self._role == Role.LEADER else None
        if pr is None or pr.state != ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        # Wait for the follower's answer (or a heartbeat response) before probing.
        pr.msg_app_flow_paused = True

    def compact(self, snapshot: SnapshotMeta) -> None:
        """The application snapshotted at ``snapshot.index`` (<= applied): drop entries.

        ``snapshot.conf_state`` must be the membership at that index; an empty one
        is filled in with ``conf_state`` when ``snapshot.index == applied_index``.
        """
        if not snapshot.conf_state.voters:
            if snapshot.index != self._log.applied:
                raise ValueError("snapshot meta has no conf_state and is not at the applied "
                                 "index, so the membership at its index is unknown")
            snapshot = SnapshotMeta(snapshot.index, snapshot.term, self._conf)
        self._log.compact(snapshot)

    def step(self, m: Message) -> None:
        """Feed one message from a peer."""
        if m.to != self._id:
            raise ValueError(f"message for node {m.to} delivered to node {self._id}")
        if m.term == 0:
            if m.type in _NEEDS_TERM:
                raise ValueError(f"{m.type.name} message from node {m.frm} carries no term")
        elif m.term > self._term:
            if m.type in (MT.VOTE, MT.PRE_VOTE):
                if m.context != CAMPAIGN_TRANSFER and self._in_lease():
                    return  # a leader we heard from recently is alive: ignore
            if m.type == MT.PRE_VOTE or (m.type == MT.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change terms
            elif m.type in (MT.APP, MT.HEARTBEAT, MT.SNAP):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, NO_NODE)
        elif m.term < self._term:
            if m.type in (MT.APP, MT.HEARTBEAT) and (self._cfg.check_quorum or self._cfg.pre_vote):
                # A stale leader (e.g. back from a partition): our term makes it step down.
                self._send(Message(MT.APP_RESP, to=m.frm, frm=self._id, term=self._term))
            elif m.type == MT.PRE_VOTE:
                self._send(Message(MT.PRE_VOTE_RESP, to=m.frm, frm=self._id, term=self._term,
                                   reject=True))
            return

        if m.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote(m)
        elif self._role == Role.LEADER:
            self._step_leader(m)
        elif self._role == Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    # ------------------------------------------------------------------ outputs
    def has_ready(self) -> bool:
        """Whether ``ready()`` has anything to hand out (O(1))."""
        if (
            self._msgs
            or self._pmsgs
            or self._read_states
            or self._bcast_pending
            or self._send_pending
            or self._probe_pending
            or self._readonly.waiting
        ):
            return True
        log = self._log
        if log.has_unstable() or log.has_committed_to_apply():
            return True
        hs = self._prev_hs
        if hs.term != self._term or hs.vote != self._vote or hs.commit != log.committed:
            return True
        soft = self._prev_soft
        return soft.leader != self._lead or soft.role != self._role

    def ready(self) -> Ready:
        """Collect everything to persist, send and apply since the last call."""
        if self._role == Role.LEADER:
            self._flush_leader()
        soft: SoftState | None = None
        prev_soft = self._prev_soft
        if prev_soft.leader != self._lead or prev_soft.role != self._role:
            soft = self._prev_soft = SoftState(self._lead, self._role)
        log = self._log
        hs: HardState | None = None
        prev_hs = self._prev_hs
        if prev_hs.term != self._term or prev_hs.vote != self._vote or (
            prev_hs.commit != log.committed
        ):
            hs = self._prev_hs = HardState(self._term, self._vote, log.committed)
        msgs, self._msgs = self._msgs, []
        pmsgs, self._pmsgs = self._pmsgs, []
        reads, self._read_states = self._read_states, []
        return Ready(soft, hs, log.take_unstable(), log.take_snapshot(), log.take_committed(),
                     msgs, pmsgs, reads)

    def advance(self, rd: Ready) -> None:
        """The caller did its duty for ``rd`` (persisted, sent, applied)."""
        log = self._log
        if rd.snapshot is not None:
            log.snapshot_persisted(rd.snapshot)
        if rd.entries:
            last = rd.entries[-1]
            log.stable_to(last.index, last.term)
        if rd.committed_entries:
            size = 0
            for e in rd.committed_entries:
                size += len(e.data)
                if e.type == EntryType.CONF_CHANGE and e.index > self._conf_index:
                    self._apply_conf_entry(e)
            log.applied_to(rd.committed_entries[-1].index)
            self._uncommitted_size = max(0, self._uncommitted_size - size)
        if self._role == Role.LEADER:
            pr = self._prs.get(self._id)
            if pr is not None and pr.maybe_update(log.stable_index()) and self._maybe_commit():
                self._bcast_pending = True
            self._maybe_auto_leave()

    # ------------------------------------------------------------------ roles
    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = NO_NODE
        self._lead = NO_NODE
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = self._cfg.election_tick + self._rand.randrange(
            self._cfg.election_tick
        )
        self._lead_transferee = NO_NODE
        self._votes = {}
        self._prs = {}
        self._readonly.reset()
        self._early_reads = []
        self._bcast_pending = False
        self._send_pending.clear()
        self._probe_pending.clear()
        self._uncommitted_size = 0
        self._lease_broken = False
        self._leader_lost = False

    def _become_follower(self, term: int, lead: int) -> None:
        self._reset(term)
        self._role = Role.FOLLOWER
        self._lead = lead

    def _become_pre_candidate(self) -> None:
        # Unlike a candidate, a pre-candidate keeps its term and vote.
        self._votes = {}
        self._prs = {}
        self._readonly.reset()
        self._lead_transferee = NO_NODE
        self._role = Role.PRE_CANDIDATE
        self._lead = NO_NODE
        self._election_elapsed = 0

    def _become_candidate(self) -> None:
        self._reset(self._term + 1)
        self._vote = self._id
        self._role = Role.CANDIDATE

    def _become_leader(self) -> None:
        self._reset(self._term)
        self._role = Role.LEADER
        self._lead = self._id
        last = self._log.last_index()
        for node in members(self._conf):
            self._prs[node] = self._new_progress(node, last + 1)
        me = self._prs.get(self._id)
        if me is not None:
            me.match = self._log.stable_index()
            me.become_replicate()
            me.recent_active = True
        # Any membership change in the uncommitted tail counts as pending.
        self._pending_conf_index = last
        self._log.append_one(Entry(self._term, last + 1))  # the no-op of this term
        self._bcast_pending = True

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._promotable and self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._hup(transfer=False)

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._cfg.election_tick:
            self._election_elapsed = 0
            if self._cfg.check_quorum:
                votes = {node: pr.recent_active for node, pr in self._prs.items()}
                votes[self._id] = True
                if joint_vote_result(self._incoming, self._outgoing, votes) != VoteResult.WON:
                    self._become_follower(self._term, NO_NODE)
                    return
                for node, pr in self._prs.items():
                    if node != self._id:
                        pr.recent_active = False
            if self._lead_transferee != NO_NODE:
                self._lead_transferee = NO_NODE  # transfer did not finish in time: abort
        if self._heartbeat_elapsed >= self._cfg.heartbeat_tick:
            self._heartbeat_elapsed = 0
            self._bcast_heartbeat()

    def _in_lease(self) -> bool:
        """Whether a leader was heard from within the election timeout (check-quorum)."""
        if not self._cfg.check_quorum:
            return False
        if self._lead != NO_NODE and self._election_elapsed < self._cfg.election_tick:
            return True
        # With lease reads a node that just (re)started may have promised a lease
        # before it went down: keep that promise for one election timeout.
        return self._cfg.lease_read and self._now < self._cfg.election_tick

    # ------------------------------------------------------------------ elections
    def _hup(self, transfer: bool) -> None:
        if self._role == Role.LEADER or not self._promotable:
            return
        if self._has_unapplied_conf_change():
            return
        if self._cfg.pre_vote and not transfer:
            self._campaign(pre=True, transfer=False)
        else:
            self._campaign(pre=False, transfer=transfer)

    def _campaign(self, pre: bool, transfer: bool) -> None:
        if pre:
            self._become_pre_candidate()
            vote_term = self._term + 1
            mtype = MT.PRE_VOTE
        else:
            self._become_candidate()
            vote_term = self._term
            mtype = MT.VOTE
        if self._poll(self._id, True) == VoteResult.WON:
            if pre:
                self._campaign(pre=False, transfer=transfer)
            else:
                self._become_leader()
            return
        ctx = CAMPAIGN_TRANSFER if transfer else b""
        last_index = self._log.last_index()
        last_term = self._log.last_term()
        for peer in sorted(self._voter_set):
            if peer == self._id:
                continue
            msg = Message(mtype, to=peer, frm=self._id, term=vote_term, log_term=last_term,
                          index=last_index, context=ctx)
            # A VOTE depends on the persisted self-vote; a PRE_VOTE promises nothing.
            self._send(msg, persisted=not pre)

    def _poll(self, node: int, granted: bool) -> VoteResult:
        self._votes.setdefault(node, granted)
        return joint_vote_result(self._incoming, self._outgoing, self._votes)

    def _handle_vote(self, m: Message) -> None:
        pre = m.type == MT.PRE_VOTE
        can_vote = (
            self._vote == m.frm
            or (self._vote == NO_NODE and self._lead == NO_NODE)
            or (pre and m.term > self._term)
        )
        resp = MT.PRE_VOTE_RESP if pre else MT.VOTE_RESP
        if can_vote and self._log_is_up_to_date(m.log_term, m.index):
            self._send(Message(resp, to=m.frm, frm=self._id, term=m.term), persisted=not pre)
            if not pre:
                self._election_elapsed = 0
                self._vote = m.frm
            elif self._leader_lost:
                self._yield_early_campaign(m.frm)
        else:
            self._send(Message(resp, to=m.frm, frm=self._id, term=self._term, reject=True),
                       persisted=not pre)

    def _yield_early_campaign(self, candidate: int) -> None:
        """We granted ``candidate``'s pre-vote after losing our leader: let it go first."""
        tick = self._cfg.election_tick
        if self._role == Role.FOLLOWER:
            self._leader_lost = False
            self._randomized_timeout = self._election_elapsed + tick + self._rand.randrange(tick)
        elif self._role == Role.PRE_CANDIDATE and candidate > self._id:
            self._become_follower(self._term, NO_NODE)

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t in (MT.APP, MT.HEARTBEAT, MT.SNAP):
            self._become_follower(m.term, m.frm)
            self._step_follower(m)
            return
        mine = MT.PRE_VOTE_RESP if self._role == Role.PRE_CANDIDATE else MT.VOTE_RESP
        if t != mine:
            return
        result = self._poll(m.frm, not m.reject)
        if result == VoteResult.WON:
            if self._role == Role.PRE_CANDIDATE:
                self._campaign(pre=False, transfer=False)
            else:
                self._become_leader()
        elif result == VoteResult.LOST:
            self._become_follower(self._term, NO_NODE)

    # ------------------------------------------------------------------ follower
    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MT.APP:
            self._election_elapsed = 0
            self._lead = m.frm
            self._leader_lost = False
            self._handle_append(m)
        elif t == MT.HEARTBEAT:
            self._election_elapsed = 0
            self._lead = m.frm
            self._leader_lost = False
            self._log.commit_to(min(m.commit, self._log.last_index()))
            # ``commit`` tells the leader how far we are (it unsticks a snapshot
            # whose acknowledgement was lost).
            self._send(Message(MT.HEARTBEAT_RESP, to=m.frm, frm=self._id, term=self._term,
                               commit=self._log.committed, context=m.context))
        elif t == MT.SNAP:
            self._election_elapsed = 0
            self._lead = m.frm
            self._handle_snapshot(m)
        elif t == MT.TIMEOUT_NOW:
            self._hup(transfer=True)
        elif t == MT.READ_INDEX_RESP:
            if not m.reject:
                self._read_states.append(ReadState(m.index, m.context))
        elif t == MT.TRANSFER_LEADER and self._lead != NO_NODE:
            self._send(Message(MT.TRANSFER_LEADER, to=self._lead, frm=self._id, index=m.index))

    def _handle_append(self, m: Message) -> None:
        log = self._log
        if m.index < log.committed:
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self._id, term=self._term,
                               index=log.committed), persisted=True)
            return
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            if m.context == COMMIT_ONLY and not m.entries:
                return  # the leader already knows we hold everything up to m.index
            self._send(Message(MT.APP_RESP, to=m.frm, frm=self._id, term=self._term,
                               index=last_new), persisted=True)
            return
        hint_index, hint_term = log.find_conflict_by_term(min(m.index, log.last_index()),
                                                          m.log_term)
        self._send(Message(MT.APP_RESP, to=m.frm, frm=self._id, term=self._term, index=m.index,
                           reject=True, reject_hint=hint_index, hint_term=hint_term),
                   persisted=True)

    def _handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot
        if snap is None:
            return
        log = self._log
        index = log.committed
        meta = snap.meta
        # A snapshot taken before this node was added does not list it; it is
        # still the right base (the entries after it add the node), so no
        # membership check here (this core never assumes it is in its config).
        if meta.index > log.committed:
            if log.match_term(meta.index, meta.term):
                log.commit_to(meta.index)  # we already have it: just fast-forward commit
                index = log.committed
            else:
                log.restore(snap)
                self._conf_index = meta.index
                self._set_conf(meta.conf_state)
                index = log.last_index()
        self._send(Message(MT.APP_RESP, to=m.frm, frm=self._id, term=self._term, index=index),
                   persisted=True)

    # ------------------------------------------------------------------ plumbing

    # ================================================================== leader
    # ------------------------------------------------------------------ test hooks
    def _can_commit_by_counting(self, index: int) -> bool:
        """Only entries of the leader's own term commit by counting replicas (§5.4.2)."""
        return self._log.term(index) == self._term

    def _answer_teaches_nothing(self, pr: Progress, prev: int, ents: list[Entry]) -> bool:
        """Whether the follower's answer to an APP after ``prev`` carrying ``ents`` could
        not move its progress: nothing new, sent to a follower known to hold ``prev``
        (so the APP only carries the commit index). Heartbeats still report it alive."""
        return not ents and pr.state == ProgressState.REPLICATE and pr.match >= prev

    def _read_index_allowed(self) -> bool:
        """A leader serves reads only once it has committed an entry of its own term."""
        return self._log.term(self._log.committed) == self._term

    # ------------------------------------------------------------------ leader
    def _step_leader(self, m: Message) -> None:
        t = m.type
        if t == MT.APP_RESP:
            self._handle_app_resp(m)
        elif t == MT.HEARTBEAT_RESP:
            self._handle_heartbeat_resp(m)
        elif t == MT.READ_INDEX:
            if not self._read_index_allowed():
                # A fresh leader: hold the forwarded read until its no-op commits
                # (the requester cannot be told to retry; it would only time out).
                self._early_reads.append((m.frm, m.context))
                return
            self._leader_read(m.frm, m.context)
        elif t == MT.TRANSFER_LEADER:
            self._handle_transfer(m.index, strict=False)

    def _check_can_propose(self) -> None:
        if self._role != Role.LEADER:
            if self._lead == NO_NODE:
                raise ProposalDropped("no leader known; retry after an election")
            raise ProposalDropped(f"not leader; leader is {self._lead}")
        if self._lead_transferee != NO_NODE:
            raise ProposalDropped(f"leadership transfer to {self._lead_transferee} in progress")

    def _append_proposal(self, etype: EntryType, data: bytes) -> int:
        size = len(data)
        if (
            size > 0
            and self._uncommitted_size > 0
            and self._uncommitted_size + size > self._cfg.max_uncommitted_entries_size
        ):
            raise ProposalDropped("too many uncommitted entries")
        self._uncommitted_size += size
        index = self._log.last_index() + 1
        self._log.append_one(Entry(self._term, index, etype, data))
        self._bcast_pending = True
        return index

    def _maybe_commit(self) -> bool:
        acked = {node: pr.match for node, pr in self._prs.items()}
        mci = joint_committed_index(self._incoming, self._outgoing, acked)
        if mci > self._log.committed and self._can_commit_by_counting(mci):
            self._log.commit_to(mci)
            if self._early_reads and self._read_index_allowed():
                early, self._early_reads = self._early_reads, []
                for requester, ctx in early:
                    self._leader_read(requester, ctx)
            return True
        return False

    def _new_progress(self, node: int, next_index: int) -> Progress:
        return Progress(
            match=0,
            next=next_index,
            is_learner=node not in self._voter_set,
            inflights=Inflights(self._cfg.max_inflight_msgs, self._cfg.max_inflight_bytes),
        )

    def _flush_leader(self) -> None:
        if self._readonly.waiting:
            self._bcast_heartbeat()
        if self._bcast_pending:
            targets: Sequence[int] = list(self._prs)
        elif self._send_pending or self._probe_pending:
            targets = sorted(self._send_pending | self._probe_pending)
        else:
            return
        probe = self._probe_pending
        self._bcast_pending = False
        self._send_pending = set()
        self._probe_pending = set()
        committed = self._log.committed
        for node in targets:
            if node == self._id:
                continue
            pr = self._prs.get(node)
            if pr is None:
                continue
            sent = False
            while self._send_append(node, pr, send_if_empty=False):
                sent = True
            if not sent and (pr.sent_commit < committed or node in probe):
                self._send_append(node, pr, send_if_empty=True)

    def _send_append(self, node: int, pr: Progress, send_if_empty: bool) -> bool:
        """Send one APP (or a SNAP) to ``node`` if its progress allows. Returns whether sent."""
        if pr.is_paused():
            return False
        log = self._log
        prev = pr.next - 1
        prev_term = log.term(prev)
        if prev_term is None:
            return self._send_snapshot(node, pr)
        last = log.last_index()
        if pr.next <= last:
            ents = log.slice(pr.next, last + 1, self._cfg.max_size_per_msg)
        elif send_if_empty:
            ents = []
        else:
            return False
        nbytes = 0
        for e in ents:
            nbytes += len(e.data)
        committed = log.committed
        self._send(Message(MT.APP, to=node, frm=self._id, term=self._term, log_term=prev_term,
                           index=prev, entries=ents, commit=committed,
                           context=COMMIT_ONLY if self._answer_teaches_nothing(pr, prev, ents)
                           else b""))
        told = min(committed, prev + len(ents))
        if told > pr.sent_commit:
            pr.sent_commit = told
        pr.sent_entries(prev + len(ents), len(ents), nbytes)
        return True

    def _send_snapshot(self, node: int, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # do not ship a snapshot to a peer that may be down
        meta = self._log.snapshot_meta
        self._send(Message(MT.SNAP, to=node, frm=self._id, term=self._term,
                           snapshot=Snapshot(meta, b"")))
        pr.become_snapshot(meta.index)
        return True

    def _handle_app_resp(self, m: Message) -> None:
        pr = self._prs.get(m.frm)
        if pr is None:
            return
        pr.recent_active = True
        if m.reject:
            hint = m.reject_hint
            if m.hint_term > 0:
                hint, _ = self._log.find_conflict_by_term(m.reject_hint, m.hint_term)
            if pr.maybe_decr_to(m.index, hint):
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_pending.add(m.frm)
            return
        if not pr.maybe_update(m.index):
            return
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT:
            if pr.match + 1 >= self._log.first_index():
                pr.become_probe()
                pr.become_replicate()
        else:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._bcast_pending = True
        elif pr.next <= self._log.last_index():
            self._send_pending.add(m.frm)  # more entries to send (the window opened)
        if m.frm == self._lead_transferee and pr.match == self._log.last_index():
            self._send_timeout_now(m.frm)

    def _bcast_heartbeat(self) -> None:
        self._round_seq += 1
        seq = self._round_seq
        committed = self._log.committed
        self._readonly.start_round(seq, committed)
        ctx = encode_round(self._term, seq, self._now)
        for node, pr in self._prs.items():
            if node == self._id:
                continue
            commit = min(pr.match, committed)
            if commit > pr.sent_commit:
                pr.sent_commit = commit
            self._send(Message(MT.HEARTBEAT, to=node, frm=self._id, term=self._term,
                               commit=commit, context=ctx))
        if self._readonly.pending_batches():
            self._release_reads()

    def _handle_heartbeat_resp(self, m: Message) -> None:
        pr = self._prs.get(m.frm)
        if pr is None:
            return
        pr.recent_active = True
        pr.msg_app_flow_paused = False
        if pr.state == ProgressState.SNAPSHOT:
            # The snapshot's outcome was not reported: the follower's commit says
            # whether it arrived; after an election timeout of silence assume not.
            pr.snapshot_wait += 1
            if m.commit >= pr.pending_snapshot or pr.snapshot_wait > self._cfg.election_tick:
                pr.become_probe()
        if pr.state == ProgressState.REPLICATE and pr.inflights.full():
            pr.inflights.free_first_one()  # unstick a window whose APPs were lost
        if pr.match < self._log.last_index() or pr.state == ProgressState.PROBE:
            # Even an empty APP checks where the follower stands (lost APPs, a
            # follower that needs a snapshot).
            self._probe_pending.add(m.frm)
        r = decode_round(m.context)
        if r is not None and r[0] == self._term:
            self._readonly.ack(m.frm, r[1], r[2])
            if self._readonly.pending_batches():
                self._release_reads()

    # ------------------------------------------------------------------ reads
    def _leader_read(self, requester: int, ctx: bytes) -> str | None:
        """Serve or queue a read on the leader; returns a refusal reason or None."""
        if not self._read_index_allowed():
            return ("leader has not yet committed an entry of its term; retry shortly")
        if self._self_quorum or self._lease_valid():
            self._respond_read(requester, ctx, self._log.committed)
        else:
            self._readonly.queue(requester, ctx)
        return None

    def _lease_valid(self) -> bool:
        cfg = self._cfg
        if not cfg.lease_read or self._lease_broken or self._lead_transferee != NO_NODE:
            return False
        start = self._readonly.quorum_tick(self._incoming, self._outgoing, self._id, self._now)
        return start >= 0 and self._now - start < cfg.election_tick - cfg.clock_drift_ticks

    def _respond_read(self, requester: int, ctx: bytes, index: int) -> None:
        if self._cfg.read_index_appended:
            index = self._log.last_index()
            self.reads_answered += 1
        if requester == self._id:
            self._read_states.append(ReadState(index, ctx))
        else:
            self._send(Message(MT.READ_INDEX_RESP, to=requester, frm=self._id, term=self._term,
                               index=index, context=ctx))

    def _release_reads(self) -> None:
        for batch in self._readonly.release(self._incoming, self._outgoing, self._id,
                                            self._round_seq):
            for requester, ctx in batch.requests:
                self._respond_read(requester, ctx, batch.index)

    # ------------------------------------------------------------------ transfer
    def _handle_transfer(self, target: int, strict: bool) -> None:
        pr = self._prs.get(target)
        if pr is None or target not in self._voter_set:
            if strict:
                raise ValueError(f"node {target} is not a voter of this group; cannot transfer "
                                 "leadership to it")
            return
        if target == self._id:
            return
        if self._lead_transferee != NO_NODE:
            if self._lead_transferee == target:
                return
            self._lead_transferee = NO_NODE
        self._election_elapsed = 0  # the transfer must finish within one election timeout
        self._lead_transferee = target
        if pr.match == self._log.last_index():
            self._send_timeout_now(target)
        else:
            self._probe_pending.add(target)

    def _send_timeout_now(self, target: int) -> None:
        self._lease_broken = True  # the transferee's campaign overrides followers' leases
        self._send(Message(MT.TIMEOUT_NOW, to=target, frm=self._id, term=self._term))

    # ------------------------------------------------------------------ plumbing
    def _send(self, m: Message, persisted: bool = False) -> None:
        if persisted:
            self._pmsgs.append(m)
        else:
            self._msgs.append(m)

    # ================================================================== membership in force
    def _set_conf(self, cs: ConfState) -> None:
        self._conf = cs
        self._incoming = cs.voters
        self._outgoing = cs.voters_outgoing
        self._voter_set = frozenset(cs.voters) | frozenset(cs.voters_outgoing)
        self._promotable = self._id in self._voter_set
        self._self_quorum = (
            joint_vote_result(self._incoming, self._outgoing, {self._id: True}) == VoteResult.WON
        )
        if self._role != Role.LEADER:
            return
        everyone = members(cs)
        for node in list(self._prs):
            if node not in everyone:
                del self._prs[node]
                self._send_pending.discard(node)
                self._probe_pending.discard(node)
        next_index = self._log.last_index() + 1
        for node in everyone:
            pr = self._prs.get(node)
            if pr is None:
                pr = self._new_progress(node, next_index)
                pr.recent_active = True
                self._prs[node] = pr
                self._send_pending.add(node)
            pr.is_learner = node not in self._voter_set
        if not self._promotable:
            self._step_down_removed()
            return
        if self._lead_transferee not in self._voter_set:
            self._lead_transferee = NO_NODE
        if self._maybe_commit():
            self._bcast_pending = True
        if self._readonly.pending_batches():
            self._release_reads()

    def _step_down_removed(self) -> None:
        """This leader is no longer a voter: hand off to the most caught-up voter, step down."""
        best = NO_NODE
        best_match = -1
        for node in sorted(self._voter_set):
            pr = self._prs.get(node)
            if pr is not None and pr.match > best_match:
                best, best_match = node, pr.match
        if best != NO_NODE and best_match == self._log.last_index():
            self._send_timeout_now(best)
        self._become_follower(self._term, NO_NODE)

    def _apply_conf_entry(self, e: Entry) -> None:
        self._conf_index = e.index
        try:
            cc = ConfChange.decode(e.data)
            cs = apply_conf_change(self._conf, cc)
        except ConfChangeError:
            return  # no longer applicable (see module docstring); identical on every node
        self._set_conf(cs)

    def _maybe_auto_leave(self) -> None:
        conf = self._conf
        if (
            self._role == Role.LEADER
            and is_joint(conf)
            and conf.auto_leave
            and self._pending_conf_index <= self._log.applied
            and self._lead_transferee == NO_NODE
        ):
            try:
                self._pending_conf_index = self._append_proposal(
                    EntryType.CONF_CHANGE, ConfChange.leave().encode()
                )
            except ProposalDropped:
                pass  # uncommitted bound reached: retried at the next advance

    def _has_unapplied_conf_change(self) -> bool:
        log = self._log
        lo = max(log.applied + 1, log.first_index())
        if lo > log.committed:
            return False
        return any(e.type == EntryType.CONF_CHANGE for e in log.slice(lo, log.committed + 1))
