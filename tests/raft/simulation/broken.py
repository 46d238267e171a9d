"""Deliberately broken variants of the Raft core: the simulator must catch each of them.

Each variant overrides exactly one of the core's test hooks (the "test hooks"
section of ``accord/raft/core/raft.py``) so that one safety rule of Raft is
switched off:

* ``old-term-commit``: the leader commits entries of earlier terms by counting
  replicas (the bug of Figure 8 in the Raft paper);
* ``read-no-term-check``: ReadIndex is served before the leader has committed
  an entry of its own term, so its commit index may be stale;
* ``vote-no-log-check``: votes are granted without the "candidate's log is at
  least as up to date" check, so a leader may lack committed entries.

More show the other checkers can fail: ``lease-forever`` (a leader lease that
never expires: stale lease reads), ``acks-before-persist`` (votes and append
acks sent before the fsync they promise) and ``never-ticks`` (no election ever
starts: the liveness check must fire).

``VARIANTS`` maps the names used by ``python -m accord.raft.simulation --variant``.
"""

from __future__ import annotations

from collections.abc import Sequence

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.types import PersistentState, Ready
from accord.raft.simulation import CoreFactory


class CountsOldTermEntries(RaftCore):
    """Commits any entry a quorum holds, whatever its term."""

    def _can_commit_by_counting(self, index: int) -> bool:
        return True


class ReadIndexWithoutTermCheck(RaftCore):
    """Answers ReadIndex as soon as it leads, before committing in its own term."""

    def _read_index_allowed(self) -> bool:
        return True


class VotesWithoutLogCheck(RaftCore):
    """Grants votes to candidates whose log is behind."""

    def _log_is_up_to_date(self, last_term: int, last_index: int) -> bool:
        return True


class LeaseNeverExpires(RaftCore):
    """Serves lease reads whatever the clock says (overrides the private ``_lease_valid``)."""

    def _lease_valid(self) -> bool:
        return True


class AcksBeforePersisting(RaftCore):
    """Sends votes and append acks with the messages that need no fsync (order of duty)."""

    def ready(self) -> Ready:
        rd = super().ready()
        rd.messages = rd.messages + rd.persisted_messages
        rd.persisted_messages = []
        return rd


class NeverTicks(RaftCore):
    """Ignores its clock: no election ever starts, so liveness must fail."""

    def tick(self) -> None:
        return None


def _factory(cls: type[RaftCore]) -> CoreFactory:
    def make(config: Config, state: PersistentState, voters: Sequence[int],
             learners: Sequence[int]) -> RaftCore:
        return cls(config, state, voters, learners)

    return make


VARIANTS: dict[str, CoreFactory] = {
    "old-term-commit": _factory(CountsOldTermEntries),
    "read-no-term-check": _factory(ReadIndexWithoutTermCheck),
    "vote-no-log-check": _factory(VotesWithoutLogCheck),
    "lease-forever": _factory(LeaseNeverExpires),
    "acks-before-persist": _factory(AcksBeforePersisting),
    "never-ticks": _factory(NeverTicks),
}
