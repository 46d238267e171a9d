"""Real daemons killed, paused and restarted: leaders move, nothing acknowledged is lost.

Each test runs on nodes of one process and on nodes of two worker processes
(``--workers 2``, docs/workers.md): a kill or a pause takes a whole node, its supervisor
and both workers, and the keys (one partition each) lie on both workers' shards."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import ProcCluster


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def cluster(tmp_path: Path, workers: int) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path, 3, workers=workers) as c:
        yield c


def test_kill_9_leader_elects_a_new_one_and_the_old_one_catches_up(cluster: ProcCluster) -> None:
    for i in range(20):
        cluster.put(b"k%d" % i, b"before")
    old = cluster.leader()
    cluster.kill(old)
    rest = [n for n in cluster.nodes if n is not old]
    new = cluster.leader(rest)
    assert new is not old
    for i in range(20):
        cluster.put(b"k%d" % i, b"after", via=rest)
    cluster.start(old)
    cluster.wait_serving(old)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if cluster.get(old, b"k19", serializable=True) == b"after":
            break
        time.sleep(0.1)
    # a linearizable read on the restarted node sees every acknowledged write
    assert [cluster.get(old, b"k%d" % i) for i in range(20)] == [b"after"] * 20


def test_paused_leader_is_replaced_and_rejoins_without_disrupting(tmp_path: Path,
                                                                  workers: int) -> None:
    # Leader balancing would (rightly) hand leaderships back to the resumed node; it is
    # off here so that any change of leader or term could only come from a disruption.
    cluster = ProcCluster(tmp_path, 3, extra=("--leader-balance-interval", "0"),
                          workers=workers)
    try:
        cluster.start_all()
        _pause_the_leader_and_resume_it(cluster)
    finally:
        cluster.stop_all()


def _pause_the_leader_and_resume_it(cluster: ProcCluster) -> None:
    cluster.put(b"x", b"1")
    old = cluster.leader()
    term_before = cluster.status(old).raftTerm
    cluster.signal(old, signal.SIGSTOP)
    rest = [n for n in cluster.nodes if n is not old]
    new = cluster.leader(rest)
    cluster.put(b"x", b"2", via=rest)
    term_after_election = cluster.status(new).raftTerm
    assert term_after_election > term_before
    cluster.signal(old, signal.SIGCONT)
    # The resumed node steps down on hearing the higher term; PreVote keeps it from
    # forcing yet another election, so the new leader keeps its term.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if cluster.get(old, b"x", serializable=True) == b"2":
            break
        time.sleep(0.1)
    assert cluster.get(old, b"x") == b"2"
    assert cluster.leader() is new
    assert cluster.status(new).raftTerm == term_after_election


def test_whole_cluster_killed_at_once_loses_no_acknowledged_write(cluster: ProcCluster) -> None:
    acked = {}
    for i in range(50):
        key = b"acked/%d" % i
        cluster.put(key, b"v%d" % i)
        acked[key] = b"v%d" % i
    for n in cluster.nodes:
        cluster.kill(n)
    cluster.start_all()
    cluster.leader()
    for n in cluster.nodes:
        assert {k: cluster.get(n, k) for k in acked} == acked
