"""The real ``etcdctl`` against a 3-node accord cluster (`accord serve` subprocesses).

Requests enter through followers as well as the leader, so forwarding, ReadIndex on
followers, lease expiry decided by the leader, and the lock and election recipes
(LeaseGrant + KeepAlive + Txn + Watch) are all exercised across real processes.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.etcdctl import etcdctl, etcdctl_json
from tests.compat.servers import require_binary
from tests.integration.cluster import ProcCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("etcdctl-cluster"), 3) as c:
        c.leader()
        yield c


def follower(c: ProcCluster) -> str:
    lead = c.leader()
    return next(n.endpoint for n in c.nodes if n is not lead)


def test_kv_through_a_follower(cluster: ProcCluster) -> None:
    ep = follower(cluster)
    assert etcdctl(ep, "put", "/c/x/a", "1").strip() == "OK"
    etcdctl(ep, "put", "/c/x/b", "2")
    assert etcdctl(ep, "put", "/c/x/a", "1b", "--prev-kv").splitlines() == ["OK", "/c/x/a", "1"]
    got = etcdctl_json(ep, "get", "/c/", "--prefix", "--limit", "1", "--sort-by=KEY",
                       "--order=DESCEND")
    assert got["count"] == 2 and got["more"] is True
    assert base64.b64decode(got["kvs"][0]["key"]) == b"/c/x/b"
    rev = got["kvs"][0]["create_revision"]
    assert etcdctl(ep, "get", "/c/x/b", f"--rev={rev}", "--print-value-only").strip() == "2"
    assert etcdctl(ep, "get", "/c/", "--prefix", "--keys-only").split() == ["/c/x/a", "/c/x/b"]
    assert etcdctl(ep, "del", "/c/x/a").strip() == "1"
    txn = "value(\"/c/x/b\") = \"2\"\n\nput /c/x/t yes\n\nput /c/x/t no\n\n"
    assert etcdctl(ep, "txn", stdin=txn).splitlines()[:2] == ["SUCCESS", ""]
    assert etcdctl(cluster.endpoints, "get", "/c/x/t", "--print-value-only").strip() == "yes"


def test_watch_sees_writes_made_through_another_member(cluster: ProcCluster) -> None:
    binary = require_binary("etcdctl")
    a, b = cluster.nodes[0].endpoint, cluster.nodes[2].endpoint
    proc = subprocess.Popen([binary, f"--endpoints={a}", "watch", "/w/", "--prefix"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"ETCDCTL_API": "3"})
    try:
        time.sleep(0.7)
        etcdctl(b, "put", "/w/1", "x")
        etcdctl(b, "del", "/w/1")
        time.sleep(0.7)
    finally:
        # SIGTERM, not SIGINT: `etcdctl watch` sets no handler of its own, so a SIGINT
        # ignored by whatever started the suite (a background job) would be ignored here.
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert out.split() == ["PUT", "/w/1", "x", "DELETE", "/w/1"]


def test_leases_expire_on_the_leaders_decision(cluster: ProcCluster) -> None:
    ep = follower(cluster)
    lease = etcdctl(ep, "lease", "grant", "2").split()[1]
    etcdctl(ep, "put", "/l/k", "v", f"--lease={lease}")
    assert "/l/k" in etcdctl(ep, "lease", "timetolive", lease, "--keys")
    assert lease in etcdctl(ep, "lease", "list")
    assert "keepalived with TTL" in etcdctl(ep, "lease", "keep-alive", "--once", lease)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and etcdctl(ep, "get", "/l/k").strip():
        time.sleep(0.2)
    assert etcdctl(ep, "get", "/l/k").strip() == ""
    assert "already expired" in etcdctl(ep, "lease", "timetolive", lease)
    other = etcdctl(ep, "lease", "grant", "60").split()[1]
    assert "revoked" in etcdctl(ep, "lease", "revoke", other)


def test_lock_and_elect_recipes(cluster: ProcCluster) -> None:
    out = etcdctl(cluster.endpoints, "lock", "job-lock", "echo", "held")
    assert out.strip().splitlines()[-1] == "held"
    binary = require_binary("etcdctl")
    proc = subprocess.Popen([binary, f"--endpoints={cluster.endpoints}", "elect", "el", "proposal-1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"ETCDCTL_API": "3"})
    try:
        deadline = time.monotonic() + 10
        leader_line = ""
        while time.monotonic() < deadline:
            leader_line = etcdctl(cluster.endpoints, "get", "el", "--prefix", "--print-value-only")
            if "proposal-1" in leader_line:
                break
            time.sleep(0.2)
        assert "proposal-1" in leader_line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


def test_cluster_views_and_maintenance(cluster: ProcCluster, tmp_path: Path) -> None:
    members = etcdctl_json(cluster.endpoints, "member", "list")["members"]
    assert sorted(m["name"] for m in members) == ["n1", "n2", "n3"]
    assert all(m["clientURLs"] for m in members)
    # Each member answers for itself: across an election (a loaded machine, a leader
    # moved for balance) they may name different leaders for a moment. Ask again until
    # they agree, as an operator would; members that never agree fail the test.
    deadline = time.monotonic() + 15
    while True:
        statuses = etcdctl_json(cluster.endpoints, "endpoint", "status", "--cluster")
        leaders = {s["Status"]["leader"] for s in statuses}
        if len(leaders) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(statuses) == 3 and len(leaders) == 1
    assert sum(s["Status"]["leader"] == s["Status"]["header"]["member_id"] for s in statuses) == 1
    health = etcdctl(cluster.endpoints, "endpoint", "health", "--cluster", check=False)
    assert health.count("is healthy") == 3
    snap = tmp_path / "s.db"
    etcdctl(cluster.nodes[1].endpoint, "snapshot", "save", str(snap))
    assert snap.stat().st_size % 512 == 32
    r = etcdctl_json(cluster.endpoints, "put", "/cmp/k", "v")["header"]["revision"]
    assert etcdctl(cluster.endpoints, "compaction", str(r)).strip() == f"compacted revision {r}"
