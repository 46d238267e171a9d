"""`accord status` and `accord kv` against a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import ProcCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("cli"), 3) as c:
        c.leader()
        yield c


def accord(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accord", *args], capture_output=True,
                          text=True, timeout=60)


def test_status_lists_every_member_and_one_leader(cluster: ProcCluster) -> None:
    eps = cluster.endpoints
    out = accord("status", "--endpoints", eps, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert sorted(r["name"] for r in rows) == ["n1", "n2", "n3"]
    assert sum(1 for r in rows if r["leader"]) == 1
    table = accord("status", "--endpoints", eps)
    assert table.returncode == 0 and "LEADER" in table.stdout


def test_status_groups_lists_every_raft_group_with_its_voters(cluster: ProcCluster) -> None:
    eps = cluster.nodes[0].endpoint
    out = accord("status", "--groups", "--endpoints", eps)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    groups = lines[1:-1]
    assert [g.split()[0] for g in groups[:3]] == ["meta", "kv", "scheduler"]
    assert sum(g.startswith("kv shard ") for g in groups) == 8  # the default --shards
    for line in groups:
        assert "n1,n2,n3" in line  # every member votes in every group
    report = json.loads(accord("status", "--groups", "--json", "--endpoints", eps).stdout)
    assert len(report["groups"]) == len(lines) - 2


def test_kv_put_get_delete(cluster: ProcCluster) -> None:
    eps = f"http://{cluster.nodes[1].endpoint}"
    assert accord("kv", "put", "/cli/a", "1", "--endpoints", eps).returncode == 0
    assert accord("kv", "put", "/cli/b", "2", "--endpoints", eps).returncode == 0
    got = accord("kv", "get", "/cli/", "--prefix", "--endpoints", eps)
    assert got.stdout.splitlines() == ["/cli/a\t1", "/cli/b\t2"]
    assert accord("kv", "del", "/cli/a", "--endpoints", eps).stdout.strip() == "1"
    missing = accord("kv", "get", "/cli/a", "--endpoints", eps)
    assert missing.returncode == 1 and missing.stdout == ""


def test_unreachable_endpoint_is_a_clear_error(tmp_path: Path) -> None:
    """A cluster nobody answers for: UNAVAILABLE once ``--command-timeout`` (etcdctl's
    flag) is spent; a bad timeout is refused before any call."""
    out = accord("kv", "get", "x", "--endpoints", "127.0.0.1:1", "--command-timeout", "1s")
    assert out.returncode == 1 and "UNAVAILABLE" in out.stderr
    assert "within 1s" in out.stderr, out.stderr
    for bad in ("0s", "soon"):
        refused = accord("kv", "get", "x", "--endpoints", "127.0.0.1:1",
                         "--command-timeout", bad)
        assert refused.returncode == 2 and "--command-timeout" in refused.stderr
