"""A whole cluster comes back from one backup: real daemons, the real CLI, real etcdctl.

The old cluster (3 nodes, 2 shards) holds keys on both shards, a lease with a key, a
v3lock lock record and a scheduler job; a backup is saved with ``accord snapshot save``
while a writer keeps putting. Then every node is killed (-9) and its data deleted; each
member of a new cluster is restored from the one file (``accord snapshot restore``) and
started: it serves exactly the keys the old cluster held at the backup's revision (value,
create/mod revision, version, lease), the lease still lives with its key, the lock record
and the job are back, and new writes get revisions after the backup's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from accord.proto import (
    rpc_pb2,
    rpc_pb2_grpc,
    scheduling_pb2,
    scheduling_pb2_grpc,
    v3lock_pb2,
    v3lock_pb2_grpc,
)
from accord.services.cluster import snapfile
from tests.compat.servers import require_binary
from tests.integration.cluster import ProcCluster

SHARDS = ("--shards", "2")
Row = tuple[bytes, bytes, int, int, int, int]


def accord(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accord", *args], capture_output=True,
                          text=True, timeout=120)


def _all_keys(c: ProcCluster, revision: int = 0, patience: float = 40.0) -> list[Row]:
    """Every key (at ``revision``), read through the shard-0 leader. UNAVAILABLE is
    retried for ``patience`` seconds, as etcd's clientv3 retries a Range: a restored
    cluster's first read meets groups still electing (each shard restarts from its
    snapshot), and the tests here check what it restored, not how soon it serves."""
    deadline = time.monotonic() + patience
    while True:
        node = c.leader()
        try:
            r = node.kv().Range(rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\x00",
                                                     revision=revision), timeout=10)
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
            for kv in r.kvs]


def _writer(c: ProcCluster, stop: threading.Event, count: list[int]) -> None:
    node = c.nodes[0]
    for i in range(20_000):  # bounded; stopped by the event long before
        if stop.is_set():
            return
        key = b"/load/%d/k" % (i % 50) if i % 2 else b"plain-%d" % (i % 70)
        try:
            node.kv().Put(rpc_pb2.PutRequest(key=key, value=b"w%d" % i), timeout=5)
            count[0] += 1
        except grpc.RpcError:
            time.sleep(0.05)


def _save_while_writing(c: ProcCluster, writer: Any, backup: Path,
                        burst: int) -> subprocess.CompletedProcess[str]:
    """``accord snapshot save`` through ``c``'s second node while ``writer(c, stop,
    count)`` writes: ``burst`` writes before the save and ``burst`` after it."""
    stop, count = threading.Event(), [0]
    thread = threading.Thread(target=writer, args=(c, stop, count))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while count[0] < burst and time.monotonic() < deadline:
            time.sleep(0.05)
        saved = accord("snapshot", "save", str(backup), "--endpoints", c.nodes[1].endpoint)
        before = count[0]
        while count[0] < before + burst and time.monotonic() < deadline + 60:
            time.sleep(0.05)  # writes go on after the backup
    finally:
        stop.set()
        thread.join(30)
    return saved


def test_a_cluster_killed_and_wiped_comes_back_from_one_backup(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = ProcCluster(tmp_path / "old", 3, extra=SHARDS)
    backup = tmp_path / "backup.db"
    try:
        old.start_all()
        n1 = old.leader()
        lease_stub = rpc_pb2_grpc.LeaseStub(n1.channel())
        grant = lease_stub.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=600), timeout=10)
        n1.kv().Put(rpc_pb2.PutRequest(key=b"/svc/held", value=b"by-lease", lease=grant.ID),
                    timeout=10)
        lock = v3lock_pb2_grpc.LockStub(n1.channel()).Lock(
            v3lock_pb2.LockRequest(name=b"backup-lock", lease=grant.ID), timeout=10)
        sched = scheduling_pb2_grpc.SchedulerStub(n1.channel())
        sched.RegisterNode(scheduling_pb2.RegisterNodeRequest(node=scheduling_pb2.NodeSpec(
            name="gpu-1", cpu_milli=8000, memory_mib=16384, devices=[scheduling_pb2.Device(
                index=0, vendor="nvidia", model="H100", memory=80 << 30)])), timeout=10)
        job = sched.SubmitJob(scheduling_pb2.SubmitJobRequest(
            job=scheduling_pb2.JobSpec(id="job-before-backup", tenant="t1", tasks=1,
                                       devices_per_task=1)), timeout=10).job_id
        for i in range(200):
            old.put(b"/data/%d/x" % i, b"v%d" % i)
        saved = _save_while_writing(old, _writer, backup, 30)
        assert saved.returncode == 0, saved.stderr
        assert "Snapshot saved at" in saved.stdout
        snap = snapfile.decode(backup.read_bytes())
        expected = _all_keys(old, snap.revision)
        assert _all_keys(old) != expected  # the writer went on after the backup
        jobs_then = sorted(j.spec.id for j in sched.ListJobs(scheduling_pb2.ListJobsRequest(),
                                                              timeout=10).jobs)
    finally:
        for node in old.nodes:
            old.kill(node)
    for node in old.nodes:
        shutil.rmtree(node.data_dir)

    status = accord("snapshot", "status", str(backup), "--json")
    assert status.returncode == 0, status.stderr
    new = ProcCluster(tmp_path / "new", 3, extra=SHARDS)
    for node in new.nodes:
        out = accord("snapshot", "restore", str(backup), "--name", node.name,
                     "--data-dir", str(node.data_dir), "--initial-cluster", new.initial,
                     "--workers", str(new.workers))
        assert out.returncode == 0, out.stderr
        assert "2 shards" in out.stdout
    wrong = accord("snapshot", "restore", str(backup), "--name", "n1", "--shards", "4",
                   "--data-dir", str(tmp_path / "other"), "--initial-cluster", new.initial)
    assert wrong.returncode == 1 and "this backup holds 2 shards" in wrong.stderr
    assert not (tmp_path / "other").exists()
    again = accord("snapshot", "restore", str(backup), "--name", "n1",
                   "--data-dir", str(new.nodes[0].data_dir), "--initial-cluster", new.initial)
    assert again.returncode == 1 and "exists and is not empty" in again.stderr
    try:
        new.start_all()
        assert _all_keys(new) == expected
        leader = new.leader()
        ttl = rpc_pb2_grpc.LeaseStub(leader.channel()).LeaseTimeToLive(
            rpc_pb2.LeaseTimeToLiveRequest(ID=grant.ID, keys=True), timeout=10)
        assert 0 < ttl.TTL <= 600 and b"/svc/held" in list(ttl.keys)
        assert any(row[0] == lock.key for row in expected)
        stub = scheduling_pb2_grpc.SchedulerStub(leader.channel())
        jobs_now = sorted(j.spec.id for j in stub.ListJobs(scheduling_pb2.ListJobsRequest(),
                                                           timeout=10).jobs)
        assert jobs_now == jobs_then and job in jobs_now
        assert new.put(b"after-restore", b"x") > snap.revision
    finally:
        new.stop_all()


def test_etcdctl_saves_a_backup_from_accord_that_etcdctl_reads(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    with ProcCluster(tmp_path / "c", 1) as c:
        for i in range(50):
            c.put(b"k%d" % i, b"v%d" % i)
        path = tmp_path / "from-etcdctl.db"
        etcdctl = require_binary("etcdctl")
        subprocess.run([etcdctl, f"--endpoints={c.nodes[0].endpoint}", "snapshot", "save",
                        str(path)], capture_output=True, text=True, timeout=60, check=True)
        theirs = subprocess.run([etcdctl, "snapshot", "status", str(path), "-w", "json"],
                                capture_output=True, text=True, timeout=60, check=True)
        ours = accord("snapshot", "status", str(path), "--json")
        theirs_d, ours_d = json.loads(theirs.stdout), json.loads(ours.stdout)
        assert {k: ours_d[k] for k in theirs_d} == theirs_d
        assert ours_d["keys"] == 50 and ours_d["origin"] == "accord"
        table = accord("snapshot", "status", str(path))
        assert "REVISION" in table.stdout and str(theirs_d["revision"]) in table.stdout


def test_bad_backups_are_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    cut = tmp_path / "cut.db"
    cut.write_bytes(b"\x00" * 5000)
    out = accord("snapshot", "status", str(cut))
    assert out.returncode == 1 and "truncated or has no SHA-256 trailer" in out.stderr
    out = accord("snapshot", "restore", str(cut), "--name", "n1", "--data-dir",
                 str(tmp_path / "d"), "--initial-cluster", "n1=http://127.0.0.1:1")
    assert out.returncode == 1 and "truncated" in out.stderr
    assert not (tmp_path / "d").exists()


def test_an_etcd_backup_starts_an_accord_cluster(tmp_path: Path) -> None:
    from tests.compat.etcdctl import etcdctl
    from tests.compat.servers import etcd_server
    from tests.compat.test_snapshot_interchange import _etcd_keys

    path = tmp_path / "etcd.db"
    with etcd_server(tmp_path / "etcd") as etcd:
        for i in range(100):
            etcdctl(etcd.endpoint, "put", f"/reg/{i % 30}/x", f"value-{i}")
        lease = etcdctl(etcd.endpoint, "lease", "grant", "900").split()[1]
        etcdctl(etcd.endpoint, "put", "--lease", lease, "held", "by-lease")
        etcdctl(etcd.endpoint, "del", "/reg/4/x")
        etcdctl(etcd.endpoint, "snapshot", "save", str(path))
        served = _etcd_keys(etcd.endpoint)
    (tmp_path / "accord").mkdir()
    c = ProcCluster(tmp_path / "accord", 3, extra=SHARDS)
    for node in c.nodes:
        out = accord("snapshot", "restore", str(path), "--name", node.name, "--data-dir",
                     str(node.data_dir), "--initial-cluster", c.initial, *SHARDS,
                     "--workers", str(c.workers))
        assert out.returncode == 0, out.stderr
        assert "restored etcd backup" in out.stdout
    try:
        c.start_all()
        rows = _all_keys(c)
        assert {r[0]: (r[1], r[2], r[3], r[4], r[5]) for r in rows} == served
        ttl = rpc_pb2_grpc.LeaseStub(c.leader().channel()).LeaseTimeToLive(
            rpc_pb2.LeaseTimeToLiveRequest(ID=int(lease, 16), keys=True), timeout=10)
        assert 0 < ttl.TTL and list(ttl.keys) == [b"held"]
    finally:
        c.stop_all()


def test_a_backup_of_nodes_of_two_workers_restores_a_cluster_of_them(tmp_path: Path) -> None:
    """``accord snapshot save`` through a node of two worker processes (``--workers 2``,
    docs/workers.md) gathers every worker's groups at one cut, while Txns over both
    workers' shards go on; a new cluster of such nodes restored from the file (``accord
    snapshot restore --workers 2``: each worker's groups in its own directory) serves
    exactly the keys of the backup's revision, its lease, and new writes after it."""
    flags = ("--shards", "4")
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = ProcCluster(tmp_path / "old", 3, workers=2, extra=flags)
    backup = tmp_path / "backup.db"
    try:
        old.start_all()
        n1 = old.nodes[0]
        grant = rpc_pb2_grpc.LeaseStub(n1.channel()).LeaseGrant(
            rpc_pb2.LeaseGrantRequest(TTL=600), timeout=10)
        n1.kv().Put(rpc_pb2.PutRequest(key=b"/svc/held", value=b"by-lease", lease=grant.ID),
                    timeout=10)
        for i in range(40):
            old.put(b"/data/%d/x" % i, b"v%d" % i)
        saved = _save_while_writing(old, _txn_writer, backup, 10)
        assert saved.returncode == 0, saved.stderr
        snap = snapfile.decode(backup.read_bytes())
        expected = _all_keys(old, snap.revision)
        assert _all_keys(old) != expected
        pairs = {row[0]: row for row in expected if row[0].startswith(b"/pair/")}
        for i in range(4):  # each Txn whole: both its keys at one revision, or neither
            a, b = pairs.get(b"/pair/a%d" % i), pairs.get(b"/pair/b%d" % i)
            assert (a is None) == (b is None) and (a is None or a[3] == b[3]), (a, b)  # type: ignore[index]
    finally:
        for node in old.nodes:
            old.kill(node)
    new = ProcCluster(tmp_path / "new", 3, workers=2, extra=flags)
    for node in new.nodes:
        out = accord("snapshot", "restore", str(backup), "--name", node.name, "--workers", "2",
                     "--data-dir", str(node.data_dir), "--initial-cluster", new.initial)
        assert out.returncode == 0, out.stderr
        assert sorted(p.name for p in node.data_dir.iterdir()) == ["worker-0", "worker-1",
                                                                   "workers"]
    try:
        new.start_all()
        assert _all_keys(new) == expected
        ttl = rpc_pb2_grpc.LeaseStub(new.nodes[2].channel()).LeaseTimeToLive(
            rpc_pb2.LeaseTimeToLiveRequest(ID=grant.ID, keys=True), timeout=10)
        assert 0 < ttl.TTL <= 600 and b"/svc/held" in list(ttl.keys)
        assert new.put(b"after-restore", b"x") > snap.revision
    finally:
        new.stop_all()


def _txn_writer(c: ProcCluster, stop: threading.Event, count: list[int]) -> None:
    """Txns putting ``/pair/a<i>`` and ``/pair/b<i>`` together (keys of several shards)."""
    for i in range(20_000):  # bounded; stopped by the event long before
        if stop.is_set():
            return
        node = c.nodes[i % 3]
        j = i % 4
        try:
            node.kv().Txn(rpc_pb2.TxnRequest(success=[
                rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=k, value=b"t%d" % i))
                for k in (b"/pair/a%d" % j, b"/pair/b%d" % j)]), timeout=5)
            count[0] += 1
        except grpc.RpcError:
            time.sleep(0.05)
