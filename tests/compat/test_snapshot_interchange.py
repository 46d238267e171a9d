"""Backups move between etcd and accord: files real etcd writes and reads.

* a snapshot saved from a real etcd (``etcdctl snapshot save``) is read by accord: the
  same status as ``etcdctl snapshot status`` and the same keys as etcd serves;
* a backup file accord writes is read by ``etcdctl snapshot status`` (same figures as
  accord's) and restored by ``etcdctl snapshot restore`` into an etcd that serves the
  same keys.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from accord.proto import rpc_pb2 as pb
from accord.services.cluster import snapfile
from accord.services.kv import etcdformat
from accord.services.kv.statemachine import KVStateMachine
from tests.compat.etcdctl import etcdctl, etcdctl_json
from tests.compat.servers import etcd_server, free_port, require_binary
from tests.kv.helpers import get

Live = dict[bytes, tuple[bytes, int, int, int, int]]


def _etcd_keys(endpoint: str) -> Live:
    import base64
    out = etcdctl_json(endpoint, "get", "", "--from-key")
    return {base64.b64decode(kv["key"]): (base64.b64decode(kv.get("value", "")),
                                          int(kv["create_revision"]), int(kv["mod_revision"]),
                                          int(kv["version"]), int(kv.get("lease", 0)))
            for kv in out.get("kvs", [])}


def _sm_keys(sm: KVStateMachine) -> Live:
    return {kv.key: (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
            for kv in get(sm, b"\x00", b"\x00").kvs}


def _etcdctl_status(path: Path) -> dict[str, Any]:
    out = subprocess.run([require_binary("etcdctl"), "snapshot", "status", str(path), "-w", "json"],
                         capture_output=True, text=True, timeout=30, check=True)
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def _same_status(path: Path) -> None:
    ours = snapfile.status(path.read_bytes()).as_dict()
    theirs = _etcdctl_status(path)
    assert {k: ours[k] for k in theirs} == theirs


def test_an_etcd_snapshot_reads_in_accord_as_etcd_reads_it(tmp_path: Path) -> None:
    with etcd_server(tmp_path / "etcd") as etcd:
        ep = etcd.endpoint
        for i in range(120):
            etcdctl(ep, "put", f"/reg/k{i % 40}", f"value-{i}")
        lease = etcdctl(ep, "lease", "grant", "900").split()[1]
        etcdctl(ep, "put", "--lease", lease, "held", "by-lease")
        etcdctl(ep, "put", "big", "x" * 20_000)
        etcdctl(ep, "del", "/reg/k3")
        etcdctl(ep, "compact", "60")
        etcdctl(ep, "put", "after", "compaction")
        snap = tmp_path / "etcd.snap"
        etcdctl(ep, "snapshot", "save", str(snap))
        served = _etcd_keys(ep)
    _same_status(snap)
    decoded = snapfile.decode(snap.read_bytes())
    assert decoded.origin == "etcd"
    rev, images = etcdformat.from_etcd(decoded.buckets, 1, [2])
    sm = KVStateMachine()
    sm.restore(images[0])
    assert _sm_keys(sm) == served
    assert sm.compact_revision == 60 and sm.revision == rev == decoded.revision
    assert sm.leases.leases[int(lease, 16)].keys == {b"held"}


def test_an_accord_backup_is_read_and_restored_by_etcd(tmp_path: Path) -> None:
    sm = KVStateMachine(lease_id_seed=2)
    lease = sm.apply(KVStateMachine.encode_lease_grant(pb.LeaseGrantRequest(TTL=900), 1000))
    assert isinstance(lease, pb.LeaseGrantResponse)
    for i in range(3000):
        sm.apply(KVStateMachine.encode_put(pb.PutRequest(
            key=b"/jobs/%d" % (i % 700), value=b"payload-%d" % i, lease=lease.ID if i % 9 == 0 else 0)))
    sm.apply(KVStateMachine.encode_delete_range(pb.DeleteRangeRequest(key=b"/jobs/1")))
    sm.apply(KVStateMachine.encode_compact(pb.CompactionRequest(revision=1500)))
    sm.apply(KVStateMachine.encode_put(pb.PutRequest(key=b"big", value=b"y" * 30_000)))
    path = tmp_path / "accord.snap"
    path.write_bytes(snapfile.encode(sm.revision, {1: b"members", 2: sm.snapshot()}, [2]))
    _same_status(path)
    peer = free_port()
    data = tmp_path / "restored"
    subprocess.run([require_binary("etcdctl"), "snapshot", "restore", str(path),
                    "--data-dir", str(data), "--name", "default",
                    "--initial-cluster", f"default=http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"],
                   capture_output=True, text=True, timeout=60, check=True)
    with etcd_server(data) as etcd:
        assert _etcd_keys(etcd.endpoint) == _sm_keys(sm)
        leases = etcdctl(etcd.endpoint, "lease", "list")
        assert f"{lease.ID:x}" in leases
        # the compaction came along: etcd refuses to read below it, as accord does
        old = etcdctl(etcd.endpoint, "get", "/jobs/5", "--rev", "100", check=False)
        assert "required revision has been compacted" in old
