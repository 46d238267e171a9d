"""A real 3-node cluster of `accord serve --workers 2` daemons (docs/workers.md).

What a user relies on: every endpoint serves put, get, delete and single-shard Txns
for keys of either worker's shards (the call forwarded inside the node when it lands
on the other worker), ranges over every shard are one snapshot, a kill -9 of one worker
process is repaired by the node's supervisor while the cluster keeps serving, and what
the workers cannot do yet is refused with an error that names ``--workers``, changing
nothing; all of it under mutual TLS on the client and peer ports, and the node's
``/metrics`` and health endpoints served by its supervisor from every worker.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from accord.client import AccordClient, ClientError, JobSpec
from accord.client.checkpoint_writer import CheckpointCoordinator
from accord.client.tls import sync_channel
from accord.node.grpc_server import CLOCK_METADATA
from accord.node.placement import WorkerPlan
from accord.node.server import SOCKETS_ENV
from accord.proto import rpc_pb2 as pb
from accord.proto import (
    rpc_pb2_grpc,
    v3election_pb2,
    v3election_pb2_grpc,
    v3lock_pb2,
    v3lock_pb2_grpc,
)
from accord.services.checkpoints.checksum import of_bytes
from accord.services.kv.sharding import shard_of
from accord.services.scheduling.servicer import node_to_pb
from accord.services.scheduling.topology import make_node
from tests.compat.etcdctl import etcdctl
from tests.integration.cluster import HOST, ClusterTLS, ProcCluster, ProcNode
from tests.integration.test_prometheus import Prometheus, needs_prometheus

SHARDS = 4
WORKERS = 2
PLAN = WorkerPlan(WORKERS, SHARDS)
RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
PROGRESS_NOTIFY_MS = 1000
"""``--watch-progress-notify-interval`` of the module's cluster (etcd's is 10 minutes)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    """Three nodes of two workers, clients and peers under mutual TLS (etcd's flags)."""
    root = tmp_path_factory.mktemp("workers")
    tls = ClusterTLS.make(root / "certs", ["n1", "n2", "n3"])
    with ProcCluster(root, 3, workers=WORKERS, tls=tls,
                     extra=("--shards", str(SHARDS), "--watch-progress-notify-interval",
                            str(PROGRESS_NOTIFY_MS))) as c:
        yield c


def keys_of_worker(worker: int, prefix: str, n: int) -> list[bytes]:
    """``n`` plain keys whose shards live in ``worker``."""
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}{i}".encode()
        if PLAN.worker_of_shard(shard_of(key, SHARDS)) == worker:
            out.append(key)
        i += 1
    return out


def fresh_kv(node: ProcNode) -> rpc_pb2_grpc.KVStub:
    """A KV stub on a new connection: the kernel may give it to either worker."""
    node.close_channel()
    return node.kv()


def retry(call: object, *args: object, attempts: int = 100) -> object:
    for _ in range(attempts):
        try:
            return call(*args, timeout=5)  # type: ignore[operator]
        except grpc.RpcError as e:
            if e.code() not in RETRY:
                raise
            time.sleep(0.1)
    raise AssertionError("cluster unavailable")


def test_worker_1_follows_worker_0s_meta_state(cluster: ProcCluster) -> None:
    """Once every member advertised the newest command format (worker 0's meta group),
    worker 1's writes too carry the clock-sized stamps of the one revision order: its
    copy of the meta state (metacopy.py) opened the same gate."""
    kv = fresh_kv(cluster.nodes[0])
    for w in range(WORKERS):
        key = keys_of_worker(w, "/gate/k", 1)[0]
        deadline = time.monotonic() + 30
        while True:
            rev = int(retry(kv.Put, pb.PutRequest(key=key, value=b"v")).header.revision)  # type: ignore[attr-defined]
            if rev > 10**12:
                break
            assert time.monotonic() < deadline, f"worker {w}'s writes stay unordered ({rev})"
            time.sleep(0.2)


def test_every_endpoint_serves_both_workers_keys(cluster: ProcCluster) -> None:
    keys = {w: keys_of_worker(w, f"/ep/k{w}-", 3) for w in range(WORKERS)}
    written: dict[bytes, bytes] = {}
    for node in cluster.nodes:
        for _ in range(3):  # new connections, so that both workers of the node take some
            kv = fresh_kv(node)
            for w in range(WORKERS):
                for key in keys[w]:
                    value = f"{node.name}:{w}".encode()
                    resp = retry(kv.Put, pb.PutRequest(key=key, value=value, prev_kv=True))
                    assert resp.header.revision > 0  # type: ignore[attr-defined]
                    written[key] = value
            for key, value in written.items():
                got = retry(kv.Range, pb.RangeRequest(key=key))
                assert [(x.key, x.value) for x in got.kvs] == [(key, value)]  # type: ignore[attr-defined]
    # Deletes and single-shard Txns, through each endpoint, on both workers' shards.
    for i, node in enumerate(cluster.nodes):
        kv = fresh_kv(node)
        for w in range(WORKERS):
            key = keys[w][i]
            txn = pb.TxnRequest(
                compare=[pb.Compare(key=key, target=pb.Compare.VALUE,
                                    result=pb.Compare.EQUAL, value=written[key])],
                success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=b"txn"))],
                failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))])
            assert retry(kv.Txn, txn).succeeded  # type: ignore[attr-defined]
            assert not retry(kv.Txn, txn).succeeded  # type: ignore[attr-defined]
            written[key] = b"txn"
        gone = keys[i % WORKERS][i // WORKERS]  # one key of each worker's, over the nodes
        deleted = retry(kv.DeleteRange, pb.DeleteRangeRequest(key=gone))
        assert deleted.deleted == 1  # type: ignore[attr-defined]
        del written[gone]
    for node in cluster.nodes:
        kv = fresh_kv(node)
        got = retry(kv.Range, pb.RangeRequest(key=b"/ep/", range_end=b"/ep0"))
        assert {x.key: x.value for x in got.kvs} == written  # type: ignore[attr-defined]


def test_ranges_over_every_shard_are_one_snapshot(cluster: ProcCluster) -> None:
    keys = keys_of_worker(0, "r", 4) + keys_of_worker(1, "r", 4)
    assert {PLAN.worker_of_shard(shard_of(k, SHARDS)) for k in keys} == {0, 1}
    kv0 = fresh_kv(cluster.nodes[0])
    revs = {k: int(retry(kv0.Put, pb.PutRequest(key=k, value=b"1")).header.revision)  # type: ignore[attr-defined]
            for k in keys}
    for node in cluster.nodes:
        for _ in range(2):
            kv = fresh_kv(node)
            every = retry(kv.Range, pb.RangeRequest(key=b"r", range_end=b"s"))
            assert [x.key for x in every.kvs] == sorted(keys)  # type: ignore[attr-defined]
            rev = int(every.header.revision)  # type: ignore[attr-defined]
            assert rev >= max(revs.values())
            count = retry(kv.Range, pb.RangeRequest(key=b"r", range_end=b"s", count_only=True))
            assert count.count == len(keys)  # type: ignore[attr-defined]
            top2 = retry(kv.Range, pb.RangeRequest(key=b"r", range_end=b"s", limit=2,
                                                   sort_order=pb.RangeRequest.DESCEND))
            assert [x.key for x in top2.kvs] == sorted(keys)[::-1][:2]  # type: ignore[attr-defined]
            assert top2.more and top2.count == len(keys)  # type: ignore[attr-defined]
            ser = retry(kv.Range, pb.RangeRequest(key=b"r", range_end=b"s", serializable=True))
            assert len(ser.kvs) <= len(keys)  # type: ignore[attr-defined]
    # At a revision: the keys written up to it, whichever worker holds them, and a
    # single-shard read at a revision another shard made (readable once floored).
    ordered = sorted(keys, key=revs.__getitem__)
    mid = revs[ordered[3]]
    for node in cluster.nodes:
        kv = fresh_kv(node)
        at = retry(kv.Range, pb.RangeRequest(key=b"r", range_end=b"s", revision=mid))
        assert sorted(x.key for x in at.kvs) == sorted(ordered[:4])  # type: ignore[attr-defined]
        one = retry(kv.Range, pb.RangeRequest(key=ordered[0], revision=mid))
        assert [x.key for x in one.kvs] == [ordered[0]]  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as e:
            kv.Range(pb.RangeRequest(key=b"r", range_end=b"s", revision=rev + 10**15),
                     timeout=5)
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE


def _refused(call: object, req: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(req, timeout=5)  # type: ignore[operator]
    return e.value


def test_node_wide_calls_health_and_read_only_txns_from_either_worker(
        cluster: ProcCluster) -> None:
    a, b = keys_of_worker(0, "/x/", 1)[0], keys_of_worker(1, "/x/", 1)[0]
    kv0 = fresh_kv(cluster.nodes[0])
    puts = [retry(kv0.Put, pb.PutRequest(key=k, value=b"keep")) for k in (a, b)]
    for node in cluster.nodes:
        for _ in range(3):  # on fresh connections: the same answer from either worker
            kv = fresh_kv(node)
            ch = node.channel()
            # A read-only Txn over both workers' shards is read across them (txn_across).
            both = retry(kv.Txn, pb.TxnRequest(success=[
                pb.RequestOp(request_range=pb.RangeRequest(key=a)),
                pb.RequestOp(request_range=pb.RangeRequest(key=b))]))
            assert [kv.value for r in both.responses  # type: ignore[attr-defined]
                    for kv in r.response_range.kvs] == [b"keep", b"keep"]
            assert both.header.revision >= max(  # type: ignore[attr-defined]
                p.header.revision for p in puts)  # type: ignore[attr-defined]
            # Downgrade: refused as a node of one process refuses it, not for --workers.
            down = _refused(rpc_pb2_grpc.MaintenanceStub(ch).Downgrade, pb.DowngradeRequest())
            assert "downgrade is not supported" in (down.details() or "")
            assert "--workers" not in (down.details() or "")
            # Each worker answers gRPC health itself, with the node's clock for the peers'
            # clock guards (its groups have leaders, the health key reads at its owner).
            health = health_pb2_grpc.HealthStub(ch).Check.with_call(
                health_pb2.HealthCheckRequest(), timeout=5)
            assert health[0].status == health_pb2.HealthCheckResponse.SERVING
            assert any(k == CLOCK_METADATA for k, _v in health[1].initial_metadata())
            # The node-wide calls are served (by worker 0) from either worker.
            members = retry(rpc_pb2_grpc.ClusterStub(ch).MemberList, pb.MemberListRequest())
            assert len(members.members) == 3  # type: ignore[attr-defined]
            assert retry(rpc_pb2_grpc.MaintenanceStub(ch).Status, pb.StatusRequest()).leader  # type: ignore[attr-defined]
    kv0 = fresh_kv(cluster.nodes[0])
    for k in (a, b):
        got = retry(kv0.Range, pb.RangeRequest(key=k))
        assert [x.value for x in got.kvs] == [b"keep"]  # type: ignore[attr-defined]


def test_a_lease_spans_both_workers_shards_from_either_worker(cluster: ProcCluster) -> None:
    """Leases on a node of two workers: granted, kept alive, listed and revoked through
    either worker (shard 0's worker is their home; the grant and the revoke reach every
    worker's shards), its keys on both workers' shards going at one revision."""
    a, b = keys_of_worker(0, "/lease/", 1)[0], keys_of_worker(1, "/lease/", 1)[0]
    for node in cluster.nodes:
        for _ in range(2):  # on fresh connections: either worker
            node.close_channel()
            lease = rpc_pb2_grpc.LeaseStub(node.channel())
            kv = node.kv()
            lid = retry(lease.LeaseGrant, pb.LeaseGrantRequest(TTL=30)).ID  # type: ignore[attr-defined]
            for k in (a, b):
                retry(kv.Put, pb.PutRequest(key=k, value=b"leased", lease=lid))
            alive = list(lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lid)] * 3),
                                              timeout=10))
            assert [r.TTL for r in alive] == [30, 30, 30] and alive[0].ID == lid
            ttl = retry(lease.LeaseTimeToLive, pb.LeaseTimeToLiveRequest(ID=lid, keys=True))
            assert sorted(ttl.keys) == sorted([a, b]) and 0 < ttl.TTL <= 30  # type: ignore[attr-defined]
            assert lid in [x.ID for x in retry(lease.LeaseLeases,  # type: ignore[attr-defined]
                                               pb.LeaseLeasesRequest()).leases]
            retry(lease.LeaseRevoke, pb.LeaseRevokeRequest(ID=lid))
            for k in (a, b):
                assert retry(kv.Range, pb.RangeRequest(key=k)).count == 0  # type: ignore[attr-defined]
            gone = list(lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lid)]),
                                             timeout=10))
            assert [r.TTL for r in gone] == [0]
            with pytest.raises(grpc.RpcError) as e:
                kv.Put(pb.PutRequest(key=b, value=b"late", lease=lid), timeout=5)
            assert "requested lease not found" in (e.value.details() or "")


def _http(node: ProcNode, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}{path}",
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _series(text: str, name: str) -> dict[str, float]:
    """``worker`` label -> value of the series ``name`` (no other label) in ``text``."""
    return {s.labels["worker"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name and set(s.labels) == {"worker"}}


def test_the_supervisor_serves_every_workers_metrics_and_health(cluster: ProcCluster) -> None:
    """A node of two workers answers /metrics and the health paths on its metrics URL
    for both (``workermetrics.py``): each worker's series labelled with it; a worker
    stopped by SIGSTOP is reported down and makes the node unhealthy, naming it, until
    it resumes."""
    node = cluster.nodes[1]
    deadline = time.monotonic() + 30
    while True:
        status, text = _http(node, "/metrics")
        leaders = _series(text, "etcd_server_has_leader") if status == 200 else {}
        if leaders == {"0": 1.0, "1": 1.0}:
            break
        assert time.monotonic() < deadline, (status, leaders)
        time.sleep(0.5)
    assert _series(text, "accord_worker_up") == {"0": 1.0, "1": 1.0}
    assert text.count("# TYPE etcd_server_has_leader gauge") == 1
    groups = {s.labels["worker"] for fam in text_string_to_metric_families(text)
              for s in fam.samples if s.name == "accord_raft_groups"}
    assert groups == {"0", "1"}
    assert _http(node, "/health")[0] == 200
    assert _http(node, "/readyz")[0] == 200
    pid = cluster.worker_pids(node)[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        status, body = _http(node, "/health")
        assert (status, body) == (503, "worker 1: no answer\n")
        status, text = _http(node, "/metrics")
        assert status == 200 and _series(text, "accord_worker_up") == {"0": 1.0, "1": 0.0}
        assert set(_series(text, "etcd_server_has_leader")) == {"0"}
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while _http(node, "/health")[0] != 200:
        assert time.monotonic() < deadline, "the node stayed unhealthy after SIGCONT"
        time.sleep(0.5)


def test_a_compaction_through_any_endpoint_compacts_both_workers_shards(
        cluster: ProcCluster) -> None:
    """etcd's Compact on a node of two workers: every shard of every worker compacted at
    the revision (history below it gone for keys of either worker), and etcd's refusals
    when it is at or below the last compaction or above the store's revision."""
    keys = [keys_of_worker(w, "/compact/", 1)[0] for w in range(WORKERS)]
    kv = fresh_kv(cluster.nodes[0])
    first: dict[bytes, int] = {}
    last = 0
    for k in keys:
        for v in (b"old", b"new"):
            rev = int(retry(kv.Put, pb.PutRequest(key=k, value=v)).header.revision)  # type: ignore[attr-defined]
            first.setdefault(k, rev)
            last = max(last, rev)
    for k in keys:  # history readable before
        got = retry(kv.Range, pb.RangeRequest(key=k, revision=first[k]))
        assert [x.value for x in got.kvs] == [b"old"]  # type: ignore[attr-defined]
    other = fresh_kv(cluster.nodes[1])
    retry(other.Compact, pb.CompactionRequest(revision=last))
    for node in cluster.nodes:
        reader = fresh_kv(node)
        for k in keys:
            err = _refused(reader.Range, pb.RangeRequest(key=k, revision=first[k]))
            assert err.code() == grpc.StatusCode.OUT_OF_RANGE, (node.name, k)
            assert "compacted" in (err.details() or "")
            got = retry(reader.Range, pb.RangeRequest(key=k))
            assert [x.value for x in got.kvs] == [b"new"]  # type: ignore[attr-defined]
    kv = fresh_kv(cluster.nodes[2])
    again = _refused(kv.Compact, pb.CompactionRequest(revision=last))
    assert again.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (again.details() or "")
    future = _refused(kv.Compact, pb.CompactionRequest(revision=last + (1 << 60)))
    assert future.code() == grpc.StatusCode.OUT_OF_RANGE and "future" in (future.details() or "")


def test_hashkv_agrees_on_every_member_and_follows_the_contents(cluster: ProcCluster) -> None:
    """etcd's HashKV on nodes of two workers: every worker hashes its shards, combined in
    shard order, so every member answers one hash for one revision (what `etcdctl
    endpoint hashkv` compares), a later write changes the hash at its revision and not
    at the earlier one, and a revision above the store's is refused."""
    keys = [keys_of_worker(w, "/hash/", 1)[0] for w in range(WORKERS)]
    kv = fresh_kv(cluster.nodes[0])
    rev = max(int(retry(kv.Put, pb.PutRequest(key=k, value=b"v")).header.revision)  # type: ignore[attr-defined]
              for k in keys)

    def hashes(at: int) -> dict[str, int]:
        out = {}
        for node in cluster.nodes:
            resp = retry(node.maintenance().HashKV, pb.HashKVRequest(revision=at))
            out[node.name] = int(resp.hash)  # type: ignore[attr-defined]
        return out

    def agreed(at: int) -> int:
        deadline = time.monotonic() + 20
        while len(set((got := hashes(at)).values())) != 1:  # a member still applying
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        return next(iter(got.values()))

    before = agreed(rev)
    later = int(retry(kv.Put, pb.PutRequest(key=keys[1], value=b"w")).header.revision)  # type: ignore[attr-defined]
    assert agreed(later) != before
    assert agreed(rev) == before
    tls = cluster.tls
    assert tls is not None
    out = etcdctl(",".join(n.client_url for n in cluster.nodes), *tls.etcdctl_flags(),
                  "endpoint", "hashkv", f"--rev={rev}")
    assert out.count(f", {before}") == 3, out
    future = _refused(cluster.nodes[0].maintenance().HashKV,
                      pb.HashKVRequest(revision=later + (1 << 60)))
    assert future.code() == grpc.StatusCode.OUT_OF_RANGE and "future" in (future.details() or "")


def test_hash_and_move_leader_through_any_endpoint_cover_both_workers(
        cluster: ProcCluster) -> None:
    """etcd's Hash on nodes of two workers hashes every shard of the node, whichever
    worker answers (the same hash from both on a quiet store, another after a write to
    either worker's shard); MoveLeader through the leader hands every group it leads,
    in both workers, to the target (``etcdctl move-leader``; which groups move is
    ``test_workers_router.py``'s), and through a follower is refused as etcd refuses it."""
    tls = cluster.tls
    assert tls is not None
    node = cluster.nodes[0]
    for worker in range(WORKERS):
        key = keys_of_worker(worker, "/whole/", 1)[0]
        retry(fresh_kv(node).Put, pb.PutRequest(key=key, value=b"v"))
        seen = set()
        for _ in range(6):  # fresh connections: both workers answer
            node.close_channel()
            seen.add(int(retry(node.maintenance().Hash, pb.HashRequest()).hash))  # type: ignore[attr-defined]
        assert len(seen) == 1, seen
        retry(fresh_kv(node).Put, pb.PutRequest(key=key, value=b"changed"))
        node.close_channel()
        assert int(retry(node.maintenance().Hash, pb.HashRequest()).hash) not in seen  # type: ignore[attr-defined]
    endpoints = ",".join(n.client_url for n in cluster.nodes)
    status = {s["Endpoint"]: s["Status"] for s in json.loads(etcdctl(
        endpoints, *tls.etcdctl_flags(), "endpoint", "status", "-w", "json"))}
    leader_id = next(iter(status.values()))["leader"]
    leader = next(e for e, st in status.items() if st["header"]["member_id"] == leader_id)
    follower = next(e for e in status if e != leader)
    target = status[follower]["header"]["member_id"]
    by_url = {n.client_url: n for n in cluster.nodes}
    for _ in range(4):  # through either worker of a follower: etcd's refusal
        by_url[follower].close_channel()
        refused = _refused(by_url[follower].maintenance().MoveLeader,
                           pb.MoveLeaderRequest(targetID=target))
        assert "not leader" in (refused.details() or ""), refused
    etcdctl(leader, *tls.etcdctl_flags(), "move-leader", f"{target:x}")
    for n in cluster.nodes:  # every member sees the new leader
        assert int(retry(n.maintenance().Status, pb.StatusRequest()).leader) == target  # type: ignore[attr-defined]


@needs_prometheus
def test_a_real_prometheus_scrapes_nodes_of_two_workers(tmp_path: Path,
                                                         cluster: ProcCluster) -> None:
    """Debian's Prometheus takes the supervisors' merged exposition: every node's two
    workers up, and each worker's shards led (``etcd_server_has_leader``) per instance."""
    prom = Prometheus(tmp_path / "prometheus", [f"{HOST}:{n.metrics_port}" for n in cluster.nodes])
    prom.start()
    try:
        def per_node(expr: str, want: float) -> dict[str, float] | None:
            got = prom.query(expr)
            return got if len(got) == 3 and all(v == want for v in got.values()) else None

        prom.wait("every node's two workers up",
                  lambda: per_node("sum by (instance) (accord_worker_up)", 2))
        prom.wait("both workers of every node see their leaders",
                  lambda: per_node("count by (instance) (etcd_server_has_leader == 1)", 2))
        assert per_node("up", 1)
    finally:
        prom.stop()


def test_txns_and_deletes_over_both_workers_are_atomic_at_one_revision(
        cluster: ProcCluster) -> None:
    """A Txn or a DeleteRange over keys of both workers, through every endpoint: its
    record shard's worker coordinates it and commits the other worker's steps through
    that worker (``WorkerRouter.remote_commit``); the writes land at one revision on
    both, a failed compare on either takes the failure branch, and a DeleteRange over
    both workers' shards removes every key at one revision."""
    a, b = keys_of_worker(0, "/both/", 1)[0], keys_of_worker(1, "/both/", 1)[0]
    revs = {a: 0, b: 0}
    for node in cluster.nodes:
        for _ in range(2):  # on fresh connections: either worker receives it
            kv = fresh_kv(node)
            done = retry(kv.Txn, pb.TxnRequest(
                compare=[pb.Compare(key=k, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                                    mod_revision=r) for k, r in revs.items()],
                success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=node.name.encode()))
                         for k in revs],
                failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in revs]))
            assert done.succeeded, node.name  # type: ignore[attr-defined]
            rev = int(done.header.revision)  # type: ignore[attr-defined]
            got = retry(kv.Range, pb.RangeRequest(key=b"/both/", range_end=b"/both0"))
            assert {x.key: (x.value, x.mod_revision) for x in got.kvs} == {  # type: ignore[attr-defined]
                a: (node.name.encode(), rev), b: (node.name.encode(), rev)}
            revs = {a: rev, b: rev}
    stale = retry(fresh_kv(cluster.nodes[1]).Txn, pb.TxnRequest(
        compare=[pb.Compare(key=a, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                            mod_revision=revs[a]),
                 pb.Compare(key=b, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                            mod_revision=1)],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=a, value=b"lost"))],
        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in (a, b)]))
    assert not stale.succeeded  # type: ignore[attr-defined]
    assert [r.response_range.kvs[0].value for r in stale.responses] == [b"n3", b"n3"]  # type: ignore[attr-defined]
    gone = retry(fresh_kv(cluster.nodes[2]).DeleteRange,
                 pb.DeleteRangeRequest(key=b"/both/", range_end=b"/both0", prev_kv=True))
    assert gone.deleted == 2  # type: ignore[attr-defined]
    assert {x.mod_revision for x in gone.prev_kvs} == {revs[a]}  # type: ignore[attr-defined]
    for node in cluster.nodes:
        assert retry(fresh_kv(node).Range, pb.RangeRequest(
            key=b"/both/", range_end=b"/both0")).count == 0  # type: ignore[attr-defined]


def _watch_events(lines: list[str]) -> list[tuple[str, bytes, int]]:
    """``etcdctl watch -w json`` output as (type, key, mod revision) per event."""
    out = []
    for line in lines:
        for ev in json.loads(line).get("Events") or []:
            kind = "DELETE" if ev.get("type", 0) == 1 else "PUT"
            out.append((kind, base64.b64decode(ev["kv"]["key"]), int(ev["kv"]["mod_revision"])))
    return out


def test_a_real_etcdctl_watch_through_any_endpoint_sees_both_workers_in_revision_order(
        cluster: ProcCluster) -> None:
    """``etcdctl watch --prefix`` through each member (whichever worker takes its
    connection) gets the puts of keys on both workers' shards, a Txn over both as one
    revision in the Txn's order, and a DeleteRange over both at one revision in key
    order: exactly the events, in revision order, that one etcd would deliver."""
    tls = cluster.tls
    assert tls is not None
    a = keys_of_worker(0, "/watch/", 2)
    b = keys_of_worker(1, "/watch/", 2)
    kv = fresh_kv(cluster.nodes[0])
    start = int(retry(kv.Put, pb.PutRequest(key=b"/watch-start", value=b"")).header.revision)  # type: ignore[attr-defined]
    watchers = [subprocess.Popen(
        ["etcdctl", f"--endpoints={n.client_url}", *tls.etcdctl_flags(), "watch", "--prefix",
         "/watch/", f"--rev={start + 1}", "-w", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ETCDCTL_API": "3"}) for n in cluster.nodes]
    try:
        want: list[tuple[str, bytes, int]] = []
        for i, key in enumerate([a[0], b[0], a[1], b[1]]):
            put = retry(fresh_kv(cluster.nodes[i % 3]).Put, pb.PutRequest(key=key, value=b"v"))
            want.append(("PUT", key, int(put.header.revision)))  # type: ignore[attr-defined]
        both = retry(fresh_kv(cluster.nodes[1]).Txn, pb.TxnRequest(success=[
            pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"t")) for k in (b[1], a[0])]))
        rev = int(both.header.revision)  # type: ignore[attr-defined]
        want += [("PUT", b[1], rev), ("PUT", a[0], rev)]  # the Txn's operation order
        gone = retry(fresh_kv(cluster.nodes[2]).DeleteRange,
                     pb.DeleteRangeRequest(key=b"/watch/", range_end=b"/watch0"))
        rev = int(gone.header.revision)  # type: ignore[attr-defined]
        want += [("DELETE", k, rev) for k in sorted(a + b)]
        for n, proc in zip(cluster.nodes, watchers, strict=True):
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=lambda p=proc, q=lines: [q.put(x) for x in p.stdout],
                             daemon=True).start()
            got: list[str] = []
            deadline = time.monotonic() + 30
            while len(_watch_events(got)) < len(want) and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    got.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
            if _watch_events(got) != want:  # say what etcdctl said (a cancel, an error)
                proc.kill()
                _out, err = proc.communicate(timeout=10)
                raise AssertionError(f"{n.name}: {_watch_events(got)} != {want}; "
                                     f"etcdctl stderr: {err}")
    finally:
        for proc in watchers:
            proc.kill()
            proc.communicate(timeout=10)


def test_periodic_progress_notifications_come_from_either_worker_at_the_current_revision(
        cluster: ProcCluster) -> None:
    """Watches created with ``progress_notify`` on connections that land on either
    worker get etcd's periodic progress notifications, and a notification names the
    store's current revision: at or above a write on another shard acknowledged after
    the watch was created, though the watched key's shard wrote nothing since."""
    idle = keys_of_worker(1, "/pn-idle/", 1)[0]
    busy = next(k for k in keys_of_worker(0, "/pn-busy/", 8)
                if shard_of(k, SHARDS) != shard_of(idle, SHARDS))
    done = threading.Event()

    def requests() -> Iterator[pb.WatchRequest]:
        yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=idle,
                                                                   progress_notify=True))
        done.wait(60)

    streams = []
    channels = [sync_channel(n.client_url, n.tls) for n in cluster.nodes for _ in range(3)]
    try:
        for ch in channels:  # new connections: the kernel spreads them over the workers
            call = rpc_pb2_grpc.WatchStub(ch).Watch(requests(), timeout=30)
            streams.append(call)
            assert next(call).created
        put = retry(fresh_kv(cluster.nodes[0]).Put, pb.PutRequest(key=busy, value=b"v"))
        rev = int(put.header.revision)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10 * PROGRESS_NOTIFY_MS / 1000
        for call in streams:
            told = 0
            while told < rev and time.monotonic() < deadline:
                resp = next(call)
                assert not resp.events and not resp.canceled
                told = int(resp.header.revision)
            assert told >= rev, f"last progress notification at {told}, below the put's {rev}"
    finally:
        done.set()
        for call in streams:
            call.cancel()
        for ch in channels:
            ch.close()


def _name_on_worker(worker: int, prefix: str) -> bytes:
    """A lock or election name whose keys (``name/...``) live on ``worker``'s shard."""
    i = 0
    while PLAN.worker_of_shard(shard_of(f"{prefix}{i}/x".encode(), SHARDS)) != worker:
        i += 1
    return f"{prefix}{i}".encode()


def test_locks_and_elections_through_any_endpoint_of_two_workers(cluster: ProcCluster) -> None:
    """v3lock and v3election through every member, whichever worker takes the call, for
    names on either worker's shards (the recipes' Txns, Ranges and lease grants routed
    as a client's, their waits watching across workers): a second Lock waits for the
    first's Unlock, real ``etcdctl lock`` (etcd's client-side recipe: Txns, a watch,
    a lease) queues behind a holder from another member, and an election's leader,
    value, proclamation and resignation agree on every member."""
    tls = cluster.tls
    assert tls is not None
    nodes = cluster.nodes
    for worker in range(WORKERS):
        for n in nodes:
            n.close_channel()  # new connections: either worker may take them
        name = _name_on_worker(worker, "lock")
        leases = rpc_pb2_grpc.LeaseStub(nodes[0].channel())
        lids = [int(retry(leases.LeaseGrant, pb.LeaseGrantRequest(TTL=60)).ID)  # type: ignore[attr-defined]
                for _ in range(3)]
        first = retry(v3lock_pb2_grpc.LockStub(nodes[1].channel()).Lock,
                      v3lock_pb2.LockRequest(name=name, lease=lids[0]))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            second = pool.submit(v3lock_pb2_grpc.LockStub(nodes[2].channel()).Lock,
                                 v3lock_pb2.LockRequest(name=name, lease=lids[1]), timeout=30)
            time.sleep(1.0)
            assert not second.done(), "a second Lock was granted while the first was held"
            retry(v3lock_pb2_grpc.LockStub(nodes[0].channel()).Unlock,
                  v3lock_pb2.UnlockRequest(key=first.key))  # type: ignore[attr-defined]
            held = second.result(timeout=20)
        assert held.key != first.key  # type: ignore[attr-defined]
        # etcd's own client-side recipe queues behind the server-side holder.
        proc = subprocess.Popen(
            ["etcdctl", f"--endpoints={nodes[1].client_url}", *tls.etcdctl_flags(), "lock",
             name.decode(), "echo", "got-it"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "ETCDCTL_API": "3"})
        try:
            time.sleep(1.5)
            assert proc.poll() is None, proc.communicate()
            retry(v3lock_pb2_grpc.LockStub(nodes[2].channel()).Unlock,
                  v3lock_pb2.UnlockRequest(key=held.key))
            out, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
            assert out.split()[-1] == "got-it"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        # An election on the same worker's shard.
        ename = _name_on_worker(worker, "elect")
        won = retry(v3election_pb2_grpc.ElectionStub(nodes[0].channel()).Campaign,
                    v3election_pb2.CampaignRequest(name=ename, lease=lids[2], value=b"a"))
        leader = won.leader  # type: ignore[attr-defined]
        retry(v3election_pb2_grpc.ElectionStub(nodes[1].channel()).Proclaim,
              v3election_pb2.ProclaimRequest(leader=leader, value=b"b"))
        for n in nodes:
            got = retry(v3election_pb2_grpc.ElectionStub(n.channel()).Leader,
                        v3election_pb2.LeaderRequest(name=ename))
            assert got.kv.value == b"b" and got.kv.key == leader.key, n.name  # type: ignore[attr-defined]
        retry(v3election_pb2_grpc.ElectionStub(nodes[2].channel()).Resign,
              v3election_pb2.ResignRequest(leader=leader))
        with pytest.raises(grpc.RpcError):
            v3election_pb2_grpc.ElectionStub(nodes[1].channel()).Leader(
                v3election_pb2.LeaderRequest(name=ename), timeout=5)


async def test_accords_own_services_through_any_endpoint_of_two_workers(
        cluster: ProcCluster) -> None:
    """The GPU scheduler, checkpoint manifests and SWIM membership, whose groups and SWIM
    live in worker 0, through every member and either worker (the other forwards their
    unary calls to worker 0 and pulls their streams from it, ``forwardstream.py``): a
    GPU node registered and a job placed on it, its placement and finish seen on a
    ``WatchPlacements`` stream; a checkpoint committed by a fenced coordinator (its lock
    taken through the KV, the fence checked through the routed lock store) and seen on a
    ``WatchLatest`` stream; the SWIM members listed."""
    tls = cluster.tls
    assert tls is not None
    for i, node in enumerate(cluster.nodes):
        for attempt in range(2):  # new clients, new connections: either worker
            tag = f"{node.name}-{attempt}"
            async with AccordClient([node.endpoint], tls=tls.client_options) as c:
                name = await c.scheduler.register_node(node_to_pb(make_node(f"gpu-{tag}", gpus=2)))
                await c.scheduler.heartbeat(name)
                async with c.scheduler.watch_placements() as events:
                    job_id = await c.scheduler.submit(JobSpec(tasks=1, devices_per_task=1))

                    async def next_of(kind: str, events: Any = events, job_id: str = job_id) -> Any:
                        async for ev in events:
                            if ev.job_id == job_id and ev.kind == kind:
                                return ev
                        raise AssertionError("placement stream ended")

                    placed = await asyncio.wait_for(next_of("placed"), 30)
                    assert placed.tasks and placed.tasks[0].devices
                    await c.scheduler.job_finished(job_id)
                    await asyncio.wait_for(next_of("finished"), 30)
                assert (await c.scheduler.get(job_id)).status == "succeeded"
                await c.scheduler.drain(name)
                job = f"ckpt-{tag}"
                async with CheckpointCoordinator(c, job, ttl=30) as coord:
                    latest = c.checkpoints.watch_latest(job)
                    assert await asyncio.wait_for(anext(latest), 30) is None  # nothing yet
                    await coord.begin(7, layout={"world_size": 1}, expected=[("rank-0", 0)])
                    await c.checkpoints.register_shards(job, 7, coord.token, [_ckpt_shard(job)])
                    await coord.commit(7)
                    seen = await asyncio.wait_for(anext(latest), 30)
                    assert seen == 7
                    await latest.aclose()
                    with pytest.raises(ClientError):  # a stale token is refused
                        await c.checkpoints.commit(job, 7, coord.token - 1)
                view = await c.membership.members()
                assert len(view.members) >= 3, (i, view)


def _ckpt_shard(job: str) -> dict[str, object]:
    body = f"{job}/rank-0".encode()
    return {"shard_id": "rank-0", "rank": 0, "size": len(body),
            "checksum": list(of_bytes(body).to_wire()), "uri": f"file:///ckpt/{job}/rank-0",
            "tensors": [["w", [8], [0], [8], "float32"]]}


def test_nodes_of_two_workers_under_mutual_tls(cluster: ProcCluster) -> None:
    """The module's cluster runs with etcd's TLS flags: the shared client port and every
    worker's peer links under mutual TLS. Real etcdctl writes keys of both workers through
    every endpoint and reads each back from every member; a client without a certificate
    is refused."""
    tls = cluster.tls
    assert tls is not None
    keys = [k.decode() for w in range(WORKERS) for k in keys_of_worker(w, "/tls/", 2)]
    flags = tls.etcdctl_flags()
    for node in cluster.nodes:
        for key in keys:
            assert etcdctl(node.client_url, *flags, "put", key, node.name).strip() == "OK"
    for node in cluster.nodes:
        out = etcdctl(node.client_url, *flags, "get", "/tls/", "--prefix")
        assert out.split() == [x for key in sorted(keys) for x in (key, "n3")], node.name
    status = etcdctl(",".join(n.client_url for n in cluster.nodes), *flags, "endpoint",
                     "status", "-w", "table")
    assert status.count("https://127.0.0.1:") == 3
    refused = etcdctl(cluster.nodes[0].client_url, f"--cacert={tls.client.ca}",
                      "--dial-timeout=2s", "--command-timeout=4s", "put", "/tls/x", "y",
                      check=False)
    assert "OK" not in refused.split(), refused


@pytest.mark.parametrize("index, node", [(1, 1), (0, 2)])
def test_a_worker_killed_9_is_restarted_and_the_cluster_keeps_serving(
        cluster: ProcCluster, index: int, node: int) -> None:
    """Worker 1 (KV shards only), then worker 0 of another node (shard 0, the meta group
    and the feed its worker 1 follows, which reconnects to the restarted one)."""
    victim = cluster.nodes[node]
    before = cluster.worker_pids(victim)
    assert sorted(before) == [0, 1]
    other = 1 - index
    mine = keys_of_worker(index, f"/kill{index}/k", 4)
    prefix = f"/kill{index}/".encode()
    for k in mine:
        cluster.put(k, b"before")
    os.kill(before[index], signal.SIGKILL)
    # The other members serve every key meanwhile (and so the cluster's writes go on).
    others = [n for n in cluster.nodes if n is not victim]
    for i, k in enumerate(mine):
        cluster.put(k, f"during{i}".encode(), via=others)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = cluster.worker_pids(victim)
        if index in now and now[index] != before[index]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"worker {index} was not restarted; log:\n{cluster.log(victim)}")
    assert now[other] == before[other]  # the other worker went on serving
    assert victim.proc is not None and victim.proc.poll() is None
    # The restarted worker recovers its shards from its own log and catches up.
    deadline = time.monotonic() + 60
    while True:
        try:
            kv = fresh_kv(victim)
            got = {x.key: x.value for x in kv.Range(pb.RangeRequest(
                key=prefix, range_end=prefix[:-1] + b"0"), timeout=5).kvs}
            if got == {k: f"during{i}".encode() for i, k in enumerate(mine)}:
                break
        except grpc.RpcError as e:
            if e.code() not in RETRY or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the restarted worker did not catch up: {got}")
        time.sleep(0.2)
    for k in mine:
        cluster.put(k, b"after", via=[victim])
        assert cluster.get(victim, k) == b"after"
    # Worker 1's copy of the meta state follows the restarted worker 0: an alarm raised
    # now refuses the puts worker 1 owns, and clearing it lets them through again.
    theirs = keys_of_worker(1, f"/alarm{index}/k", 1)[0]
    def alarm(action: pb.AlarmRequest.AlarmAction) -> None:
        stub = rpc_pb2_grpc.MaintenanceStub(victim.channel())
        retry(stub.Alarm, pb.AlarmRequest(action=action, alarm=pb.NOSPACE))

    alarm(pb.AlarmRequest.ACTIVATE)
    try:
        _until_put(victim, theirs, refused=True)
    finally:
        alarm(pb.AlarmRequest.DEACTIVATE)
    _until_put(victim, theirs, refused=False)


def _until_put(node: ProcNode, key: bytes, *, refused: bool) -> None:
    """Until a put of ``key`` through ``node`` is refused for space (or goes through)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            fresh_kv(node).Put(pb.PutRequest(key=key, value=b"v"), timeout=5)
            if not refused:
                return
            why = "went through"
        except grpc.RpcError as e:
            if refused and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return
            if e.code() not in RETRY and not refused:
                raise
            why = f"{e.code().name}: {e.details()}"
        assert time.monotonic() < deadline, f"a put of {key!r} still {why}"
        time.sleep(0.2)


def test_a_data_directory_keeps_its_worker_count(tmp_path: Path,
                                                  cluster: ProcCluster) -> None:
    """A member made with --workers 2 refuses --workers 1 (and 3), naming both; nothing
    in its directory changes."""
    node = cluster.nodes[2]
    listing = sorted(p.name for p in node.data_dir.iterdir())
    for n in (1, 3):
        out = subprocess.run(
            [sys.executable, "-m", "accord", "serve", "--name", node.name, "--data-dir",
             str(node.data_dir), "--workers", str(n), "--shards", str(SHARDS),
             "--listen-metrics-urls", "off"],
            capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert "created with --workers 2" in out.stderr and f"--workers {n}" in out.stderr
    assert sorted(p.name for p in node.data_dir.iterdir()) == listing


def test_workers_keep_their_sockets_out_of_the_data_directory(cluster: ProcCluster) -> None:
    """The forwarding and metrics sockets live in a private directory the supervisor
    made (the data directory may be on a file system without Unix sockets), which it
    removes when the node stops."""
    node = cluster.nodes[1]
    pids = cluster.worker_pids(node)
    dirs = {_environ(pid).get(SOCKETS_ENV) for pid in pids.values()}
    assert len(dirs) == 1 and None not in dirs, dirs
    sockets = Path(str(dirs.pop()))
    assert sorted(p.name for p in sockets.iterdir()) == [
        "worker-0.metrics.sock", "worker-0.sock", "worker-1.metrics.sock", "worker-1.sock"]
    assert sockets.stat().st_mode & 0o777 == 0o700
    assert not list(node.data_dir.rglob("*.sock"))
    assert cluster.stop(node) == 0
    assert not sockets.exists()
    cluster.start(node)
    cluster.wait_serving(node)
    cluster.put(b"/sockets/k", b"v", via=[node])
    assert cluster.get(node, b"/sockets/k") == b"v"


def test_a_node_of_two_workers_serves_from_a_data_directory_too_long_for_a_socket_path(
        tmp_path: Path) -> None:
    """A data directory deeper than a Unix socket path may be (108 bytes) holds a node
    of two workers (its sockets are elsewhere)."""
    root = tmp_path / ("deep-" * 22)
    root.mkdir()
    with ProcCluster(root, 1, workers=WORKERS, extra=("--shards", str(SHARDS))) as c:
        node = c.nodes[0]
        assert len(str(node.data_dir / "worker-0.metrics.sock")) > 108
        c.wait_serving(node)
        keys = keys_of_worker(0, "/deep/a", 1) + keys_of_worker(1, "/deep/b", 1)
        for key in keys:
            c.put(key, b"v", via=[node])
        assert [c.get(node, k) for k in keys] == [b"v", b"v"]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k: v for k, v in pairs}


def test_a_supervisor_killed_9_takes_its_workers_with_it(cluster: ProcCluster) -> None:
    """No orphan keeps serving a node's shards (or holding its ports) once the node's
    supervisor is gone; the node then restarts from its workers' data directories."""
    node = cluster.nodes[0]
    pids = cluster.worker_pids(node)
    assert len(pids) == WORKERS
    cluster.kill(node)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() and "zombie" not in _state(p) for p in pids.values()):
        assert time.monotonic() < deadline, f"workers {pids} outlived their supervisor"
        time.sleep(0.05)
    cluster.start(node)
    cluster.wait_serving(node)
    cluster.put(b"/back/k", b"v", via=[node])
    assert cluster.get(node, b"/back/k") == b"v"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0]
    except (OSError, IndexError):
        return "zombie"
