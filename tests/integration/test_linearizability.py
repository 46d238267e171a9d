"""Concurrent client histories against real daemons under leader kills and pauses.

Clients read, write and compare-and-set a few keys through every member while a
nemesis kills the leader with SIGKILL, restarts it, and pauses the next leader
with SIGSTOP. Every operation is recorded with its invocation and response times
(an operation that timed out or lost its connection has an unknown outcome) and
the history is checked with ``tests.lincheck``. A second test shows the checker
catches a stale read when one is made on purpose (a serializable read from a
member cut off from the majority).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accord.node.placement import WorkerPlan
from accord.proto import rpc_pb2
from accord.services.kv.sharding import shard_of
from tests.integration.cluster import ProcCluster, ProcNode
from tests.integration.test_partition import proxied  # noqa: F401 - fixture
from tests.lincheck import INF, Op, check

KEYS = [b"lin/a", b"lin/b", b"lin/c"]
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.CANCELLED}


def _value(kvs: object) -> int | None:
    items = list(kvs)  # type: ignore[call-overload]
    return int(items[0].value) if items else None


class Client(threading.Thread):
    def __init__(self, cid: int, cluster: ProcCluster, until: float, history: list[Op],
                 lock: threading.Lock, seed: int, keys: list[bytes] = KEYS) -> None:
        super().__init__(daemon=True)
        self.keys = keys
        self.cid, self.cluster, self.until = cid, cluster, until
        self.history, self.lock = history, lock
        self.rng = random.Random(seed)
        self.errors: list[BaseException] = []
        self.counter = 0

    def _node(self) -> ProcNode:
        return self.rng.choice(self.cluster.nodes)

    def run(self) -> None:
        try:
            while time.monotonic() < self.until:
                self.one()
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)

    def one(self) -> None:
        key = self.rng.choice(self.keys)
        kind = self.rng.choice(["read", "read", "write", "cas"])
        node = self._node()
        kv = node.kv()
        self.counter += 1
        value = self.cid * 1_000_000 + self.counter
        t0 = time.monotonic()
        try:
            if kind == "read":
                r = kv.Range(rpc_pb2.RangeRequest(key=key), timeout=1.0)
                op = Op(key, "read", t0, time.monotonic(), _value(r.kvs))
            elif kind == "write":
                kv.Put(rpc_pb2.PutRequest(key=key, value=b"%d" % value), timeout=1.0)
                op = Op(key, "write", t0, time.monotonic(), value)
            else:
                expected = self._recent(key)
                cmp = rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.VALUE,
                                      result=rpc_pb2.Compare.EQUAL, value=b"%d" % expected)
                put = rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=b"%d" % value))
                r = kv.Txn(rpc_pb2.TxnRequest(compare=[cmp], success=[put]), timeout=1.0)
                op = Op(key, "cas", t0, time.monotonic(), value, expected=expected,
                        ok=r.succeeded)
        except grpc.RpcError as e:
            if e.code() not in TRANSIENT:
                raise
            if kind == "read":
                return  # a failed read changed nothing
            op = (Op(key, "write", t0, INF, value) if kind == "write" else
                  Op(key, "cas", t0, INF, value, expected=expected, ok=None))
            time.sleep(0.02)
        with self.lock:
            self.history.append(op)

    def _recent(self, key: bytes) -> int:
        with self.lock:
            for op in reversed(self.history):
                if op.key == key and op.kind in ("write", "read") and op.value is not None:
                    return int(op.value)
        return 0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path, 3) as c:
        yield c


def test_histories_under_leader_kills_and_pauses_are_linearizable(cluster: ProcCluster) -> None:
    run_with_nemesis(cluster, KEYS)


def test_histories_on_nodes_of_two_workers_are_linearizable(tmp_path: Path) -> None:
    """The same with every member ``--workers 2`` (docs/workers.md): the keys lie on
    both workers' shards, so calls are forwarded inside the nodes; the nemesis kills and
    pauses whole nodes (supervisor and workers)."""
    plan = WorkerPlan(2, 4)
    keys: list[bytes] = []
    for w in (0, 1, 0, 1):
        i = 0
        while (key := f"/lin/{w}-{i}/k".encode()) in keys or plan.worker_of_shard(
                shard_of(key, 4)) != w:
            i += 1
        keys.append(key)
    with ProcCluster(tmp_path, 3, workers=2, extra=("--shards", "4")) as c:
        run_with_nemesis(c, keys)


def run_with_nemesis(cluster: ProcCluster, keys: list[bytes]) -> None:
    """Four clients over ``keys`` while the leader is killed -9 and restarted, then the
    next leader paused and resumed; the history must be linearizable."""
    for k in keys:
        cluster.put(k, b"0")
    history: list[Op] = [Op(k, "write", 0.0, 0.0, 0) for k in keys]
    lock = threading.Lock()
    duration = 9.0
    until = time.monotonic() + duration
    clients = [Client(i, cluster, until, history, lock, seed=i, keys=keys) for i in range(4)]
    for c in clients:
        c.start()
    # nemesis: kill -9 the leader, restart it, then pause the next leader and resume it
    time.sleep(1.5)
    victim = cluster.leader(timeout=10)
    cluster.kill(victim, keep_channel=True)  # the client threads still call through it
    time.sleep(2.0)
    cluster.start(victim)
    cluster.wait_serving(victim)
    time.sleep(1.0)
    paused = cluster.leader(timeout=10)
    cluster.signal(paused, signal.SIGSTOP)
    time.sleep(2.0)
    cluster.signal(paused, signal.SIGCONT)
    for c in clients:
        c.join(duration + 10)
    errors = [e for c in clients for e in c.errors]
    assert not errors, errors
    completed = [op for op in history if op.complete != INF and op.invoke > 0]
    assert len(completed) > 50, f"too few completed operations to mean anything: {len(completed)}"
    violations = check(history)
    assert not violations, "\n".join(map(str, violations))


def test_the_checker_catches_a_deliberately_stale_read(proxied) -> None:  # noqa: F811
    c, proxies = proxied
    c.put(b"stale", b"1")
    leader = c.leader()
    follower = next(n for n in c.nodes if n is not leader)
    # let the follower apply the first write, then cut it off
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and c.get(follower, b"stale", serializable=True) != b"1":
        time.sleep(0.02)
    proxies.partition([follower.name], [n.name for n in c.nodes if n is not follower])
    majority = [n for n in c.nodes if n is not follower]
    history = [Op(b"stale", "write", 0.0, 0.1, 1)]
    t0 = time.monotonic()
    c.put(b"stale", b"2", via=majority)
    history.append(Op(b"stale", "write", t0, time.monotonic(), 2))
    # A serializable read on the cut-off member is served locally, so it is stale...
    t1 = time.monotonic()
    value = c.get(follower, b"stale", serializable=True)
    history.append(Op(b"stale", "read", t1, time.monotonic(), int(value or 0)))
    assert value == b"1"
    violations = check(history)
    assert [v.key for v in violations] == [b"stale"]
    # ...while a linearizable read there refuses to answer rather than lie.
    with pytest.raises(grpc.RpcError) as err:
        follower.kv().Range(rpc_pb2.RangeRequest(key=b"stale"), timeout=2.0)
    assert err.value.code() in TRANSIENT
