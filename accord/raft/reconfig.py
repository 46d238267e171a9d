"""Membership in force on one core: switching configs, applying committed changes.

``RaftCore`` (``core.py``) inherits this mixin. Committed CONF_CHANGE entries
take effect in ``advance()`` (once the application applied them), a snapshot's
membership when it is installed. A leader tracks a ``Progress`` for every
member; a leader that is no longer a voter hands off to its most caught-up
voter (TIMEOUT_NOW) and steps down; with ``auto_leave`` the leader proposes
the leave-joint change itself once the joint entry is applied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accord.raft.confchange import (
    ConfChange,
    ConfChangeError,
    apply_conf_change,
    is_joint,
    members,
)
from accord.raft.leader import LeaderMixin
from accord.raft.quorum import VoteResult, joint_vote_result
from accord.raft.types import NO_NODE, ConfState, Entry, EntryType, ProposalDropped, Role


class MembershipMixin(LeaderMixin):
    """Config switching for ``RaftCore`` (state is owned and initialised there)."""

    _conf: ConfState
    _conf_index: int
    _pending_conf_index: int
    _promotable: bool

    if TYPE_CHECKING:

        def _become_follower(self, term: int, lead: int) -> None: ...

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
