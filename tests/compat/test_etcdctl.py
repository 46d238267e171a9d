"""The real ``etcdctl`` (Debian etcd-client) against ``python -m accord.node.grpc_server``.

Every command of ETCD_COMPAT.md's etcdctl table that needs no lock/election recipe,
except ``check perf`` (it runs for 60 s, too long for the suite). Each test runs against
accord and against a real etcd, so the expectations are etcd's own; the few places where
accord differs on purpose (version string, snapshot format, member add) are marked.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time
from pathlib import Path

from accord.proto import rpc_pb2
from accord.services.cluster import snapfile
from accord.services.kv.statemachine import KVStateMachine
from tests.compat.etcdctl import etcdctl, etcdctl_json
from tests.compat.servers import Server, require_binary


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def unb64(s: str) -> str:
    return base64.b64decode(s).decode()


def test_put_get_variants(server: Server) -> None:
    ep = server.endpoint
    assert etcdctl(ep, "put", "/pg/a", "1").strip() == "OK"
    etcdctl(ep, "put", "/pg/b", "2")
    etcdctl(ep, "put", "/pg/c", "3")
    out = etcdctl(ep, "put", "/pg/a", "1b", "--prev-kv")
    assert out.splitlines() == ["OK", "/pg/a", "1"]

    got = etcdctl_json(ep, "get", "/pg/a")
    (kv,) = got["kvs"]
    assert unb64(kv["value"]) == "1b" and kv["version"] == 2
    assert got["header"]["cluster_id"] and got["header"]["member_id"]
    assert got["header"]["revision"] == kv["mod_revision"]

    assert etcdctl(ep, "get", "/pg/", "--prefix", "--print-value-only").split() == ["1b", "2", "3"]
    limited = etcdctl_json(ep, "get", "/pg/", "--prefix", "--limit", "1")
    assert limited["more"] is True and limited["count"] == 3 and len(limited["kvs"]) == 1
    desc = etcdctl(ep, "get", "/pg/", "--prefix", "--sort-by=CREATE", "--order=DESCEND", "--keys-only")
    assert desc.split() == ["/pg/c", "/pg/b", "/pg/a"]
    keys = etcdctl_json(ep, "get", "/pg/", "--prefix", "--keys-only")
    assert all("value" not in kv for kv in keys["kvs"])
    old = etcdctl(ep, "get", "/pg/a", f"--rev={kv['create_revision']}", "--print-value-only")
    assert old.strip() == "1"
    from_key = etcdctl(ep, "get", "/pg/b", "--from-key", "--keys-only").split()
    assert from_key[:2] == ["/pg/b", "/pg/c"]


def test_count_only(server: Server) -> None:
    ep = server.endpoint
    for k in ("x", "y", "z"):
        etcdctl(ep, "put", f"/co/{k}", k)
    help_text = etcdctl(ep, "get", "--help")
    if "--count-only" in help_text:  # etcdctl 3.5+
        got = etcdctl_json(ep, "get", "/co/", "--prefix", "--count-only")
        assert got["count"] == 3 and "kvs" not in got
    else:  # etcdctl 3.4 has no such flag: check the server answers count_only over gRPC
        import grpc

        from accord.proto import rpc_pb2_grpc

        with grpc.insecure_channel(ep) as ch:
            resp = rpc_pb2_grpc.KVStub(ch).Range(
                rpc_pb2.RangeRequest(key=b"/co/", range_end=b"/co0", count_only=True), timeout=5
            )
        assert resp.count == 3 and len(resp.kvs) == 0


def test_del(server: Server) -> None:
    ep = server.endpoint
    for k in ("a", "b", "c"):
        etcdctl(ep, "put", f"/del/{k}", k)
    assert etcdctl(ep, "del", "/del/a").strip() == "1"
    assert etcdctl(ep, "del", "/del/zzz").strip() == "0"
    out = etcdctl(ep, "del", "/del/", "--prefix", "--prev-kv").splitlines()
    assert out == ["2", "/del/b", "b", "/del/c", "c"]
    assert etcdctl(ep, "get", "/del/", "--prefix").strip() == ""


def test_txn_from_stdin(server: Server) -> None:
    ep = server.endpoint
    script = 'value("/txn/k") = "v1"\n\nput /txn/k v2\n\nput /txn/k created\nput /txn/other x\n\n'
    out = etcdctl(ep, "txn", stdin=script)
    assert out.splitlines()[0] == "FAILURE"
    assert etcdctl(ep, "get", "/txn/k", "--print-value-only").strip() == "created"
    out = etcdctl(ep, "txn", stdin=script.replace('"v1"', '"created"'))
    assert out.splitlines()[0] == "SUCCESS"
    assert etcdctl(ep, "get", "/txn/k", "--print-value-only").strip() == "v2"
    multi = 'mod("/txn/k") > "0"\nversion("/txn/none") = "0"\n\nget /txn/other\ndel /txn/other\n\n\n'
    out = etcdctl(ep, "txn", stdin=multi).splitlines()
    assert out[0] == "SUCCESS" and "/txn/other" in out and "1" in out


def test_watch_background(server: Server) -> None:
    ep = server.endpoint
    first = etcdctl_json(ep, "put", "/w/0", "zero")["header"]["revision"]
    proc = subprocess.Popen(
        [require_binary("etcdctl"), f"--endpoints={ep}", "watch", "/w/", "--prefix",
         f"--rev={first}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )  # fmt: skip
    try:
        time.sleep(0.5)
        etcdctl(ep, "put", "/w/1", "one")
        etcdctl(ep, "del", "/w/0")
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 15
        want = ["PUT", "/w/0", "zero", "PUT", "/w/1", "one", "DELETE", "/w/0"]
        while len(lines) < len(want) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        assert lines == want
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)


def test_watch_interactive_progress(server: Server) -> None:
    ep = server.endpoint
    rev = etcdctl_json(ep, "put", "/wi/seed", "x")["header"]["revision"]
    proc = subprocess.Popen(
        [require_binary("etcdctl"), f"--endpoints={ep}", "watch", "-i"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("watch /wi/x\nprogress\n")
        proc.stdin.flush()
        line = ""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            line = proc.stdout.readline().strip()
            if not line or line.startswith("progress notify"):
                break
        # etcdctl prints the header revision of the watch_id=-1 progress response.
        assert line == f"progress notify: {rev}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)


def test_lease_lifecycle(server: Server) -> None:
    ep = server.endpoint
    out = etcdctl(ep, "lease", "grant", "30")
    assert "granted with TTL(30s)" in out
    lease_hex = out.split()[1]
    etcdctl(ep, "put", "/lease/k", "v", f"--lease={lease_hex}")
    ka = etcdctl(ep, "lease", "keep-alive", "--once", lease_hex)
    assert f"lease {lease_hex} keepalived with TTL(30)" in ka
    ttl = etcdctl(ep, "lease", "timetolive", lease_hex, "--keys")
    assert "granted with TTL(30s)" in ttl and "/lease/k" in ttl
    assert lease_hex in etcdctl(ep, "lease", "list")
    assert "revoked" in etcdctl(ep, "lease", "revoke", lease_hex)
    assert etcdctl(ep, "get", "/lease/k").strip() == ""
    gone = etcdctl(ep, "lease", "timetolive", lease_hex)
    assert "already expired" in gone
    bad = etcdctl(ep, "lease", "revoke", lease_hex, check=False)
    assert "requested lease not found" in bad
    once = etcdctl(ep, "lease", "keep-alive", "--once", lease_hex, check=False)
    assert "requested lease not found" in once


def test_cluster_and_maintenance(server: Server) -> None:
    ep = server.endpoint
    members = etcdctl_json(ep, "member", "list")["members"]
    assert len(members) == 1 and members[0]["clientURLs"] == [f"http://{ep}"]
    (status,) = etcdctl_json(ep, "endpoint", "status")
    st = status["Status"]
    assert st["leader"] == st["header"]["member_id"] == members[0]["ID"]
    assert st["raftTerm"] >= 1 and st["raftAppliedIndex"] >= 1
    assert "is healthy" in etcdctl(ep, "endpoint", "health", check=False)
    table = etcdctl(ep, "endpoint", "status", "--cluster", "-w", "table")
    assert "true" in table  # IS LEADER column
    (hkv,) = etcdctl_json(ep, "endpoint", "hashkv")
    assert hkv["HashKV"]["hash"] > 0
    assert etcdctl(ep, "alarm", "list").strip() == ""
    assert "Finished defragmenting" in etcdctl(ep, "defrag")
    assert etcdctl(ep, "user", "list").strip() == ""
    if server.kind == "accord":
        # accord reports >= 3.5.13 so Kubernetes enables watch progress requests.
        assert tuple(int(x) for x in st["version"].split(".")) >= (3, 5, 13)
        add = etcdctl(ep, "member", "add", "n2", "--peer-urls=http://127.0.0.1:1", check=False)
        assert "membership changes need a replicated accord node" in add
    bad = etcdctl(ep, "member", "remove", "1234", check=False)
    assert "member not found" in bad


def test_snapshot_save(server: Server, tmp_path: Path) -> None:
    ep = server.endpoint
    etcdctl(ep, "put", "/snap/k", "in the snapshot")
    path = tmp_path / "snap.db"
    etcdctl(ep, "snapshot", "save", str(path))
    data = path.read_bytes()
    assert len(data) % 512 == 32  # what etcd's clients check: data + sha256 trailer
    status = etcdctl_json(ep, "snapshot", "status", str(path))  # etcd's own tool reads it
    assert status["totalKey"] >= 1 and status["revision"] >= 1
    if server.kind == "accord":  # accord's backup: bbolt in etcd's layout + every group
        backup = snapfile.decode(data)
        assert backup.origin == "accord" and backup.kv_groups == (snapfile.KV_SHARD0_GROUP,)
        sm = KVStateMachine()
        sm.restore(backup.groups[snapfile.KV_SHARD0_GROUP])
        assert sm.revision == backup.revision == status["revision"]
        got = sm.range(rpc_pb2.RangeRequest(key=b"/snap/k"))
        assert got.kvs[0].value == b"in the snapshot"


def test_compaction(server: Server) -> None:
    ep = server.endpoint
    r1 = etcdctl_json(ep, "put", "/cmp/k", "a")["header"]["revision"]
    r2 = etcdctl_json(ep, "put", "/cmp/k", "b")["header"]["revision"]
    assert etcdctl(ep, "compaction", str(r2)).strip() == f"compacted revision {r2}"
    out = etcdctl(ep, "get", "/cmp/k", f"--rev={r1}", check=False)
    assert "required revision has been compacted" in out
    assert etcdctl(ep, "get", "/cmp/k", f"--rev={r2}", "--print-value-only").strip() == "b"
    again = etcdctl(ep, "compaction", str(r1), check=False)
    assert "required revision has been compacted" in again
    future = etcdctl(ep, "compaction", str(r2 + 1000), check=False)
    assert "required revision is a future revision" in future
    r3 = etcdctl_json(ep, "put", "/cmp/k", "c")["header"]["revision"]
    assert etcdctl(ep, "compaction", "--physical", str(r3)).strip() == f"compacted revision {r3}"
