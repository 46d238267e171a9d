"""The leader's half of the Raft core: replication, commit, heartbeats, reads, transfer.

``RaftCore`` (``core.py``) inherits this mixin; it is split out only to keep
each module readable. Everything here runs while the core is leader, except
``_send`` (shared plumbing). Sends are lazy: steps mark peers in
``_send_pending`` / ``_probe_pending`` (or set ``_bcast_pending``) and
``_flush_leader`` builds the APP/SNAP messages when ``ready()`` is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from accord.raft.log import RaftLog
from accord.raft.progress import Inflights, Progress, ProgressState
from accord.raft.quorum import joint_committed_index
from accord.raft.readonly import ReadOnly, decode_round, encode_round
from accord.raft.types import (
    NO_NODE,
    Entry,
    EntryType,
    Message,
    MessageType,
    ProposalDropped,
    ReadState,
    Role,
    Snapshot,
)

if TYPE_CHECKING:
    from accord.raft.core import Config

MT = MessageType


class LeaderMixin:
    """Leader-side behaviour of ``RaftCore`` (state is owned and initialised there)."""

    _cfg: Config
    _id: int
    _term: int
    _role: Role
    _lead: int
    _log: RaftLog
    _prs: dict[int, Progress]
    _incoming: tuple[int, ...]
    _outgoing: tuple[int, ...]
    _voter_set: frozenset[int]
    _self_quorum: bool
    _lead_transferee: int
    _uncommitted_size: int
    _bcast_pending: bool
    _send_pending: set[int]
    _probe_pending: set[int]
    _readonly: ReadOnly
    _round_seq: int
    _now: int
    _lease_broken: bool
    _election_elapsed: int
    _msgs: list[Message]
    _pmsgs: list[Message]
    _read_states: list[ReadState]
    _early_reads: list[tuple[int, bytes]]

    # ------------------------------------------------------------------ test hooks
    def _can_commit_by_counting(self, index: int) -> bool:
        """Only entries of the leader's own term commit by counting replicas (§5.4.2)."""
        return self._log.term(index) == self._term

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
                           index=prev, entries=ents, commit=committed))
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
