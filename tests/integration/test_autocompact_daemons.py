"""etcd's ``--auto-compaction-retention`` on real daemons (3 members, ``--shards 8``, one
process or two workers per node), seen through real ``etcdctl``: history older than the
retention is compacted by the members themselves on every shard (on a node of several
workers, worker 0 compacts every worker's shards), the latest stays readable, and after
shard 0's leader is killed -9 the new leader goes on compacting."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from accord.node.placement import WorkerPlan
from accord.services.kv.sharding import shard_of
from tests.compat.servers import require_binary
from tests.integration.cluster import ProcCluster, ProcNode

SHARDS = 8
PLAN = WorkerPlan(2, SHARDS)


def _key_of_worker(worker: int) -> bytes:
    """A key under ``/ac/`` on a shard that ``worker`` of a two-worker node hosts."""
    return next(k for k in (b"/ac/k%d" % i for i in range(1000))
                if PLAN.worker_of_shard(shard_of(k, SHARDS)) == worker)


KEYS = [_key_of_worker(0), _key_of_worker(1)]
KEY = KEYS[0]


def _get_at(etcdctl: str, node: ProcNode, key: bytes,
            rev: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([etcdctl, f"--endpoints={node.endpoint}", "get", key.decode(),
                           f"--rev={rev}"], capture_output=True, text=True, timeout=30)


def _wait_compacted(c: ProcCluster, etcdctl: str, node: ProcNode, rev: int) -> None:
    """Write on, until ``rev`` reads as compacted through ``node`` on the shards of both
    keys (at most 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        outs = [_get_at(etcdctl, node, key, rev) for key in KEYS]
        if all(out.returncode != 0 for out in outs):
            for out in outs:
                assert "required revision has been compacted" in out.stderr, out.stderr
            return
        c.put(KEY, b"more")
        time.sleep(0.3)
    raise AssertionError(f"revision {rev} was never compacted on both keys' shards")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_members_compact_by_themselves_and_a_new_leader_goes_on(tmp_path: Path,
                                                                 workers: int) -> None:
    etcdctl = require_binary("etcdctl")
    with ProcCluster(tmp_path, 3, workers=workers,
                     extra=("--shards", str(SHARDS), "--auto-compaction-retention", "2s")) as c:
        c.wait_published()
        first = max(c.put(key, b"0") for key in KEYS)
        _wait_compacted(c, etcdctl, c.nodes[1], first)

        leader = c.leader()
        c.kill(leader)
        survivors = [n for n in c.nodes if n is not leader]
        after = max(c.put(key, b"1", via=survivors) for key in KEYS)
        _wait_compacted(c, etcdctl, survivors[0], after)

        latest = c.put(KEY, b"2", via=survivors)
        out = _get_at(etcdctl, survivors[1], KEY, latest)
        assert out.returncode == 0 and out.stdout.split() == [KEY.decode(), "2"], out
