"""A real cluster whose key space is split over several shards (Raft groups).

What a user relies on: a range over every shard is one snapshot at its header
revision R and a watch from R+1 then delivers every later change exactly once; a
Txn across shards commits at one revision on each (docs/txn.md); a lease's keys on several shards
all go when it is revoked; the shard count is fixed once a member's data exists.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.proto import rpc_pb2_grpc
from accord.services.kv.sharding import shard_of
from tests.integration.cluster import ProcCluster

SHARDS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("shards"), 3, extra=("--shards", str(SHARDS))) as c:
        c.wait_published()
        yield c


def _keys_on_every_shard(prefix: str) -> list[bytes]:
    seen: dict[int, bytes] = {}
    i = 0
    while len(seen) < SHARDS:
        key = f"{prefix}{i}".encode()
        seen.setdefault(shard_of(key, SHARDS), key)
        i += 1
    return sorted(seen.values())


def _retry(call: object, *args: object, attempts: int = 50) -> object:
    for _ in range(attempts):
        try:
            return call(*args, timeout=5)  # type: ignore[operator]
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            time.sleep(0.1)
    raise AssertionError("cluster unavailable")


def test_a_range_over_all_shards_then_a_watch_misses_nothing(cluster: ProcCluster) -> None:
    a, b = cluster.nodes[0].kv(), cluster.nodes[1].kv()
    keys = _keys_on_every_shard("w")
    for k in keys:
        _retry(a.Put, pb.PutRequest(key=k, value=b"0"))
    listing = _retry(b.Range, pb.RangeRequest(key=b"w", range_end=b"x"))
    assert isinstance(listing, pb.RangeResponse)
    assert [kv.key for kv in listing.kvs] == keys and listing.count == len(keys)
    r = listing.header.revision

    # Watch the whole prefix from R+1 on a third member while writes go to every shard.
    events: list[tuple[bytes, bytes, int]] = []
    expected = len(keys) * 3
    done = threading.Event()
    watch = rpc_pb2_grpc.WatchStub(cluster.nodes[2].channel())

    def requests() -> Iterator[pb.WatchRequest]:
        yield pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=b"w", range_end=b"x", start_revision=r + 1))
        done.wait(30)

    def consume() -> None:
        for resp in watch.Watch(requests(), timeout=30):
            for ev in resp.events:
                events.append((ev.kv.key, ev.kv.value, ev.kv.mod_revision))
            if len(events) >= expected:
                done.set()
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for round_ in (1, 2, 3):
        for k in keys:
            resp = _retry(a.Put, pb.PutRequest(key=k, value=str(round_).encode()))
            assert isinstance(resp, pb.PutResponse) and resp.header.revision > r
    assert done.wait(30), f"watch delivered {len(events)} of {expected} events"
    t.join(5)
    assert sorted((k, v) for k, v, _ in events) == sorted(
        (k, str(n).encode()) for k in keys for n in (1, 2, 3))
    for k in keys:  # per key, in revision order
        revs = [rev for key, _, rev in events if key == k]
        assert revs == sorted(revs) and all(rev > r for rev in revs)

    # The same range at R is still the same snapshot.
    again = _retry(b.Range, pb.RangeRequest(key=b"w", range_end=b"x", revision=r))
    assert isinstance(again, pb.RangeResponse)
    assert [(kv.key, kv.value) for kv in again.kvs] == [(k, b"0") for k in keys]


def test_a_read_of_one_shard_answers_above_writes_acknowledged_on_others(
    cluster: ProcCluster,
) -> None:
    """As on one etcd, a read's header.revision is the store's: above every write
    acknowledged before it, on any shard, through any member (and a write that writes
    nothing answers there too); a Range at that revision
    answers the same later, after the shard was written again; and a Compact there is
    no future revision (``docs/txn.md``, "The revision of a read")."""
    keys = _keys_on_every_shard("fence")
    stubs = [n.kv() for n in cluster.nodes]
    for k in keys:
        _retry(stubs[0].Put, pb.PutRequest(key=k, value=b"0"))
    for i in range(40):
        wrote, read = keys[i % SHARDS], keys[(i + 1 + i // SHARDS % (SHARDS - 1)) % SHARDS]
        assert wrote != read
        put = _retry(stubs[i % 3].Put, pb.PutRequest(key=wrote, value=b"%d" % i))
        got = _retry(stubs[(i + 1) % 3].Range, pb.RangeRequest(key=read))
        acked, at = put.header.revision, got.header.revision  # type: ignore[attr-defined]
        assert at >= acked, (i, at, acked)
        (kv,) = got.kvs  # type: ignore[attr-defined]
        # Writes that write nothing answer at the store's revision too.
        lost = _retry(stubs[(i + 2) % 3].Txn, pb.TxnRequest(
            compare=[pb.Compare(key=read, target=pb.Compare.VALUE,
                                result=pb.Compare.EQUAL, value=b"no such value")],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=read, value=b"x"))]))
        assert not lost.succeeded and lost.header.revision >= acked  # type: ignore[attr-defined]
        none = _retry(stubs[(i + 1) % 3].DeleteRange, pb.DeleteRangeRequest(key=read + b"-absent"))
        assert none.deleted == 0 and none.header.revision >= acked  # type: ignore[attr-defined]
        _retry(stubs[2].Put, pb.PutRequest(key=read, value=b"later"))
        again = _retry(stubs[i % 3].Range, pb.RangeRequest(key=read, revision=at))
        assert [(x.value, x.mod_revision) for x in again.kvs] == [  # type: ignore[attr-defined]
            (kv.value, kv.mod_revision)]
    both = _retry(stubs[1].Range, pb.RangeRequest(key=keys[0], range_end=keys[-1] + b"\0"))
    _retry(stubs[0].Compact, pb.CompactionRequest(revision=both.header.revision))  # type: ignore[attr-defined]


def test_txn_across_shards_commits_at_one_revision_and_a_lease_spans_them(
    cluster: ProcCluster,
) -> None:
    kv = cluster.nodes[0].kv()
    k1, k2 = _keys_on_every_shard("t")[:2]
    resp = _retry(kv.Txn, pb.TxnRequest(
        compare=[pb.Compare(key=k1, target=pb.Compare.VERSION, result=pb.Compare.EQUAL,
                            version=0)],
        success=[
            pb.RequestOp(request_put=pb.PutRequest(key=k1, value=b"x")),
            pb.RequestOp(request_put=pb.PutRequest(key=k2, value=b"x")),
        ]))
    assert isinstance(resp, pb.TxnResponse) and resp.succeeded
    other = cluster.nodes[2].kv()
    for k in (k1, k2):
        (kv1,) = other.Range(pb.RangeRequest(key=k), timeout=10).kvs
        assert kv1.mod_revision == resp.header.revision and kv1.value == b"x"

    lease_stub = rpc_pb2_grpc.LeaseStub(cluster.nodes[1].channel())
    lease = _retry(lease_stub.LeaseGrant, pb.LeaseGrantRequest(TTL=60))
    assert isinstance(lease, pb.LeaseGrantResponse)
    keys = _keys_on_every_shard("l")
    for k in keys:
        _retry(kv.Put, pb.PutRequest(key=k, value=b"v", lease=lease.ID))
    ttl = lease_stub.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease.ID, keys=True), timeout=5)
    assert sorted(ttl.keys) == keys
    lease_stub.LeaseRevoke(pb.LeaseRevokeRequest(ID=lease.ID), timeout=5)
    left = cluster.nodes[2].kv().Range(pb.RangeRequest(key=b"l", range_end=b"m"), timeout=5)
    assert left.count == 0


def test_a_member_refuses_another_shard_count_for_its_data(
    cluster: ProcCluster, tmp_path: Path
) -> None:
    # The member recorded its shard count when it created its data directory; a copy
    # of that record (not the live directory) is enough to be refused.
    recorded = cluster.nodes[0].data_dir  # with workers, each worker's directory has it
    if cluster.workers > 1:
        recorded = recorded / "worker-0"
    (tmp_path / "shards").write_bytes((recorded / "shards").read_bytes())
    out = subprocess.run(
        [sys.executable, "-m", "accord", "serve", "--name", "x", "--data-dir", str(tmp_path),
         "--shards", str(SHARDS + 1), "--listen-client-urls", "http://127.0.0.1:1",
         "--listen-peer-urls", "http://127.0.0.1:2",
         "--initial-cluster", "x=http://127.0.0.1:2"],
        capture_output=True, text=True, timeout=30, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 2
    assert f"created with --shards {SHARDS}" in out.stderr
