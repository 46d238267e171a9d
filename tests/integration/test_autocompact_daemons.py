"""etcd's ``--auto-compaction-retention`` on real daemons (3 members, ``--shards 8``), seen
through real ``etcdctl``: history older than the retention is compacted by the members
themselves, the latest stays readable, and after shard 0's leader is killed -9 the new
leader goes on compacting."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.compat.servers import require_binary
from tests.integration.cluster import ProcCluster, ProcNode

KEY = b"/ac/k"


def _get_at(etcdctl: str, node: ProcNode, rev: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([etcdctl, f"--endpoints={node.endpoint}", "get", KEY.decode(),
                           f"--rev={rev}"], capture_output=True, text=True, timeout=30)


def _wait_compacted(c: ProcCluster, etcdctl: str, node: ProcNode, rev: int) -> None:
    """Write on, until ``rev`` reads as compacted through ``node`` (at most 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = _get_at(etcdctl, node, rev)
        if out.returncode != 0:
            assert "required revision has been compacted" in out.stderr, out.stderr
            return
        c.put(KEY, b"more")
        time.sleep(0.3)
    raise AssertionError(f"revision {rev} was never compacted")


def test_members_compact_by_themselves_and_a_new_leader_goes_on(tmp_path: Path) -> None:
    etcdctl = require_binary("etcdctl")
    with ProcCluster(tmp_path, 3, extra=("--auto-compaction-retention", "2s")) as c:
        c.wait_published()
        first = c.put(KEY, b"0")
        _wait_compacted(c, etcdctl, c.nodes[1], first)

        leader = c.leader()
        c.kill(leader)
        survivors = [n for n in c.nodes if n is not leader]
        after = c.put(KEY, b"1", via=survivors)
        _wait_compacted(c, etcdctl, survivors[0], after)

        latest = c.put(KEY, b"2", via=survivors)
        out = _get_at(etcdctl, survivors[1], latest)
        assert out.returncode == 0 and out.stdout.split() == [KEY.decode(), "2"], out
