"""``ClusterApi.leader`` while the members' statuses disagree: they are read one after
the other, and a leadership move (the leader balancer makes them routinely) that falls
between two reads made a one-shot answer fail ("no leader agreed") although the cluster
had a leader before and after. Seen in CI on the client guide's example of moving the
leader."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from accord.client import cluster as cluster_mod
from accord.client.cluster import ClusterApi, Member, MemberStatus, StatusReport
from accord.client.errors import ClientError

MEMBERS = [Member(i, f"n{i}", (), (f"http://127.0.0.1:{2378 + i}",), False) for i in (1, 2, 3)]


def _report(member: Member, leader: int | None) -> StatusReport:
    if leader is None:
        return StatusReport(member, None, ClientError(grpc.StatusCode.UNAVAILABLE, "down"))
    status = MemberStatus(member.endpoint or "", member.id, "3.5.0", 0, 0, leader, 2, 9, 9,
                          (), False)
    return StatusReport(member, status, None)


class Rounds:
    """Status rounds handed out one per call (the last one for ever)."""

    def __init__(self, rounds: list[list[int | None]]) -> None:
        self.rounds = rounds
        self.asked = 0

    async def __call__(self, *, timeout: float | None = None) -> list[StatusReport]:
        views = self.rounds[min(self.asked, len(self.rounds) - 1)]
        self.asked += 1
        return [_report(m, v) for m, v in zip(MEMBERS, views, strict=True)]


def _api(rounds: Rounds) -> ClusterApi:
    api = ClusterApi.__new__(ClusterApi)
    api.statuses = rounds  # type: ignore[method-assign]
    return api


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cluster_mod, "LEADER_RETRY_S", 0.01)
    monkeypatch.setattr(cluster_mod, "LEADER_AGREEMENT_S", 0.5)
    yield


async def test_a_move_between_two_status_reads_is_asked_again() -> None:
    rounds = Rounds([[1, 2, 2], [1, 1, 2], [2, 2, 2]])  # moving from n1 to n2
    assert (await _api(rounds).leader()).id == 2
    assert rounds.asked == 3


async def test_members_that_keep_disagreeing_are_an_error_after_the_bound() -> None:
    rounds = Rounds([[1, 2, 2]])
    with pytest.raises(ClientError, match="no leader agreed"):
        await _api(rounds).leader()
    assert rounds.asked > 2


async def test_no_member_answering_fails_at_once() -> None:
    rounds = Rounds([[None, None, None]])
    with pytest.raises(ClientError, match="none known"):
        await _api(rounds).leader()
    assert rounds.asked == 1


async def test_agreement_among_the_members_that_answer_is_enough() -> None:
    rounds = Rounds([[3, None, 3]])
    assert (await _api(rounds).leader()).id == 3
    assert rounds.asked == 1
