"""A lease whose keys lie on several shards, on real daemons (3 members, ``--shards 8``).

Keys on at least four shards under one lease: a revoke through real ``etcdctl`` deletes
them all at one revision R (a watch over every shard, opened before, sees every delete at
R; a Range at R-1 sees every key, at R none), and a Put with the revoked lease fails with
etcd's "requested lease not found". Then the same by TTL: the leader's expiry pass
deletes another lease's keys at one revision.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from accord.proto import kv_pb2, rpc_pb2_grpc
from accord.proto import rpc_pb2 as pb
from accord.services.kv.sharding import shard_of
from tests.compat.servers import require_binary
from tests.integration.cluster import ProcCluster

SHARDS = 8
PREFIX = b"/lr/"


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def cluster(tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    """Three members; with two workers, the keys' shards lie in both workers of a node,
    and the revoke's steps on the other worker's shards go through it."""
    c = ProcCluster(tmp_path_factory.mktemp("xlease"), 3, workers=request.param,
                    extra=("--shards", str(SHARDS)))
    c.start_all()
    try:
        c.wait_published()
        yield c
    finally:
        c.stop_all()


def _keys(tag: str) -> list[bytes]:
    """Keys under :data:`PREFIX` on five different shards."""
    seen: dict[int, bytes] = {}
    i = 0
    while len(seen) < 5 and i < 10_000:
        k = PREFIX + f"{tag}{i}/k".encode()
        seen.setdefault(shard_of(k, SHARDS), k)
        i += 1
    return sorted(seen.values())


def _call(fn: object, req: object, timeout: float = 5.0) -> object:
    """A call retried while the cluster elects leaders (UNAVAILABLE, deadline)."""
    last: Exception | None = None
    for _ in range(100):
        try:
            return fn(req, timeout=timeout)  # type: ignore[operator]
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            last = e
            time.sleep(0.2)
    raise AssertionError(f"no answer: {last}")


class _Watch:
    """A watch over every key under a prefix on a raw gRPC stream; events in a queue."""

    def __init__(self, channel: grpc.Channel, key: bytes, start: int) -> None:
        self._stop = threading.Event()
        self.events: queue.Queue[tuple[int, int, bytes, int]] = queue.Queue()
        create = pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=key, range_end=key[:-1] + bytes([key[-1] + 1]), start_revision=start))

        def requests() -> Iterator[pb.WatchRequest]:
            yield create
            self._stop.wait(60)

        self._stream = rpc_pb2_grpc.WatchStub(channel).Watch(requests())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for resp in self._stream:
                for ev in resp.events:
                    self.events.put((resp.header.revision, ev.type, ev.kv.key,
                                     ev.kv.mod_revision))
        except grpc.RpcError:
            pass

    def take(self, n: int, timeout: float = 30.0) -> list[tuple[int, int, bytes, int]]:
        out = []
        for _ in range(n):
            out.append(self.events.get(timeout=timeout))
        return out

    def close(self) -> None:
        self._stop.set()
        self._stream.cancel()


def _deletes(w: _Watch, keys: list[bytes]) -> int:
    """The one revision every key's DELETE event carries (asserted one)."""
    got = w.take(len(keys))
    assert all(e[1] == kv_pb2.Event.DELETE for e in got)
    assert sorted(e[2] for e in got) == keys
    revs = {e[3] for e in got}
    assert len(revs) == 1, f"deletes at several revisions: {revs}"
    return revs.pop()


def _seen(kv: rpc_pb2_grpc.KVStub, rev: int) -> int:
    end = PREFIX[:-1] + bytes([PREFIX[-1] + 1])
    return int(_call(kv.Range, pb.RangeRequest(key=PREFIX, range_end=end, revision=rev,
                                               count_only=True)).count)  # type: ignore[attr-defined]


def _leased(c: ProcCluster, tag: str, ttl: int) -> tuple[int, list[bytes], int]:
    n1 = c.nodes[0]
    kv = n1.kv()
    lease = rpc_pb2_grpc.LeaseStub(n1.channel())
    lid = int(_call(lease.LeaseGrant, pb.LeaseGrantRequest(TTL=ttl)).ID)  # type: ignore[attr-defined]
    keys = _keys(tag)
    assert len({shard_of(k, SHARDS) for k in keys}) >= 4
    for k in keys:
        _call(kv.Put, pb.PutRequest(key=k, value=b"v", lease=lid))
    top = int(_call(kv.Range, pb.RangeRequest(key=keys[-1])).header.revision)  # type: ignore[attr-defined]
    return lid, keys, top


def test_etcdctl_lease_revoke_deletes_keys_on_every_shard_at_one_revision(
    cluster: ProcCluster,
) -> None:
    c = cluster
    lid, keys, top = _leased(c, "revoke", 600)
    w = _Watch(c.nodes[1].channel(), PREFIX + b"revoke", top + 1)
    try:
        etcdctl = require_binary("etcdctl")
        out = subprocess.run([etcdctl, f"--endpoints={c.nodes[2].endpoint}", "lease",
                              "revoke", f"{lid:x}"], capture_output=True, text=True,
                             timeout=60, check=True)
        assert "revoked" in out.stdout
        rev = _deletes(w, keys)
    finally:
        w.close()
    kv = c.nodes[0].kv()
    assert _seen(kv, rev - 1) >= len(keys) and _seen(kv, rev) == 0
    with pytest.raises(grpc.RpcError) as e:
        kv.Put(pb.PutRequest(key=keys[0], value=b"x", lease=lid), timeout=10)
    assert "requested lease not found" in (e.value.details() or "")


def test_an_expired_lease_deletes_keys_on_every_shard_at_one_revision(
    cluster: ProcCluster,
) -> None:
    c = cluster
    _lid, keys, top = _leased(c, "expire", 2)
    w = _Watch(c.nodes[1].channel(), PREFIX + b"expire", top + 1)
    try:
        rev = _deletes(w, keys)  # the leader's expiry pass, within seconds of the TTL
    finally:
        w.close()
    kv = c.nodes[2].kv()
    end = b"/lr/expiref"
    before = _call(kv.Range, pb.RangeRequest(key=b"/lr/expire", range_end=end,
                                             revision=rev - 1, count_only=True))
    after = _call(kv.Range, pb.RangeRequest(key=b"/lr/expire", range_end=end,
                                            revision=rev, count_only=True))
    assert before.count == len(keys) and after.count == 0  # type: ignore[attr-defined]
