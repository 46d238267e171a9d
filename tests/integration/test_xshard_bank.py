"""A bank on real daemons (3 members, ``--shards 8``): accounts on different shards,
concurrent transfers by two-key compare-and-swap Txns through every member, an auditor
reading all accounts (one range over every shard) throughout, while a fault hits one
member in the middle: killed -9 and started again, paused (SIGSTOP) past the
transactions' deadline and resumed, or cut off from both others by a partition of its
peer links and healed. Every audit sums to the total; the coordinations in flight on
the member hit are resolved (all-or-nothing) by the others. Once more on nodes of two
worker processes, one worker killed -9."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv.ranges import prefix_end
from accord.services.kv.sharding import shard_of
from tests.integration.cluster import ProcCluster
from tests.integration.test_partition import proxied_cluster

SHARDS = 8
PREFIX = b"/bank/"
RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
FAULT_S = 6.5
"""How long a fault lasts: past the multi-shard Txn deadline (5 s) and the survivors'
recovery pass (every 0.5 s), so the intents the member hit left are resolved by them."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("bank"), 3, extra=("--shards", str(SHARDS))) as c:
        c.wait_published()
        yield c


def _accounts(n: int) -> list[bytes]:
    """``n`` account keys (``/bank/<i>`` each a partition) on ``n`` different shards."""
    out: dict[int, bytes] = {}
    i = 0
    while len(out) < n:
        k = PREFIX + str(i).encode()
        out.setdefault(shard_of(k, SHARDS), k)
        i += 1
    return sorted(out.values())


def test_transfers_keep_the_total_across_a_kill(cluster: ProcCluster) -> None:
    def kill(victim: int, down: set[int]) -> None:
        down.add(victim)
        cluster.kill(cluster.nodes[victim], keep_channel=True)
        time.sleep(FAULT_S)  # past the txn deadline: its intents are resolved by the others
        cluster.start(cluster.nodes[victim])
        cluster.wait_serving(cluster.nodes[victim])
        down.discard(victim)

    _bank(cluster, kill)


def test_transfers_keep_the_total_across_a_pause(cluster: ProcCluster) -> None:
    def pause(victim: int, down: set[int]) -> None:
        down.add(victim)
        cluster.signal(cluster.nodes[victim], signal.SIGSTOP)
        try:
            time.sleep(FAULT_S)  # its leaderships move, its intents pass their deadline
        finally:
            cluster.signal(cluster.nodes[victim], signal.SIGCONT)
        down.discard(victim)

    _bank(cluster, pause)


def test_transfers_keep_the_total_across_a_partition(tmp_path: Path) -> None:
    with proxied_cluster(tmp_path, ("--shards", str(SHARDS))) as (c, proxies):
        c.wait_published()

        def cut_off(victim: int, _down: set[int]) -> None:
            # Clients keep calling the cut-off member (its calls fail or time out).
            name = c.nodes[victim].name
            proxies.partition([name], [n.name for n in c.nodes if n.name != name])
            try:
                time.sleep(FAULT_S)
            finally:
                proxies.heal()

        _bank(c, cut_off)


def test_transfers_keep_the_total_on_nodes_of_two_workers_across_a_worker_kill(
        tmp_path: Path) -> None:
    """The bank on nodes of two worker processes (``--workers 2``, docs/workers.md): a
    transfer between accounts of both workers is coordinated by the record shard's worker,
    which commits the other worker's steps through it; worker 1 of one node killed -9
    (its supervisor restarts it) leaves the Txns it coordinated to the others' recovery,
    and every audit still sums to the total."""
    with ProcCluster(tmp_path, 3, workers=2, extra=("--shards", str(SHARDS))) as c:
        def kill_worker(victim: int, _down: set[int]) -> None:
            node = c.nodes[victim]
            os.kill(c.worker_pids(node)[1], signal.SIGKILL)
            time.sleep(FAULT_S)  # past the txn deadline: its intents are resolved by the others
            c.wait_serving(node)

        _bank(c, kill_worker)


def _bank(cluster: ProcCluster, fault: Callable[[int, set[int]], None]) -> None:
    """Run the bank for a while, ``fault(member index, down)`` in the middle (it adds
    the members clients must avoid to ``down`` and removes them when they are back)."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    accounts = _accounts(5)
    total = 100 * len(accounts)
    for k in accounts:
        for _ in range(100):
            try:
                cluster.nodes[0].kv().Put(pb.PutRequest(key=k, value=b"100"), timeout=5)
                break
            except grpc.RpcError as e:
                assert e.code() in RETRY
                time.sleep(0.1)
    for n in cluster.nodes:
        n.kv()  # channels made before the threads share them
    stop = threading.Event()
    down: set[int] = set()
    sums: list[int] = []
    committed = [0]
    problems: list[str] = []
    everything = pb.RangeRequest(key=PREFIX, range_end=prefix_end(PREFIX))

    def transfers(worker: int) -> None:
        rnd = random.Random(seed + worker)
        while not stop.is_set():
            node = cluster.nodes[(worker + rnd.randrange(3)) % 3]
            if cluster.nodes.index(node) in down:
                continue
            try:
                got = node.kv().Range(everything, timeout=10)
                byk = {kv.key: kv for kv in got.kvs}
                src, dst = rnd.sample(accounts, 2)
                amount = rnd.randint(1, 10)
                s, d = byk[src], byk[dst]
                t = node.kv().Txn(pb.TxnRequest(
                    compare=[pb.Compare(key=src, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                                        mod_revision=s.mod_revision),
                             pb.Compare(key=dst, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                                        mod_revision=d.mod_revision)],
                    success=[pb.RequestOp(request_put=pb.PutRequest(
                                 key=src, value=str(int(s.value) - amount).encode())),
                             pb.RequestOp(request_put=pb.PutRequest(
                                 key=dst, value=str(int(d.value) + amount).encode()))]),
                    timeout=15)
                if t.succeeded:
                    committed[0] += 1
            except grpc.RpcError as e:
                if e.code() not in RETRY:
                    problems.append(f"transfer: {e.code()} {e.details()}")
                time.sleep(0.05)

    def audit() -> None:
        while not stop.is_set():
            node = next((n for i, n in enumerate(cluster.nodes) if i not in down), None)
            if node is None:
                continue
            try:
                got = node.kv().Range(everything, timeout=15)
            except grpc.RpcError as e:
                if e.code() not in RETRY:
                    problems.append(f"audit: {e.code()} {e.details()}")
                time.sleep(0.05)
                continue
            sums.append(sum(int(kv.value) for kv in got.kvs))
            time.sleep(0.02)

    threads = [threading.Thread(target=transfers, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=audit))
    for t in threads:
        t.start()
    try:
        time.sleep(3)  # transfers in flight on every member when the fault hits
        fault(1, down)
        time.sleep(4)  # and after it: the survivors' recovery, the member back
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not problems, problems[:5]
    assert committed[0] > 0 and len(sums) > 10, (committed, len(sums))
    assert all(x == total for x in sums), [x for x in sums if x != total][:10]
    final = None
    for _ in range(100):  # the member hit may still be finding its leaders: retried, as
        try:              # etcd's clients retry UNAVAILABLE
            final = cluster.nodes[1].kv().Range(everything, timeout=30)
            break
        except grpc.RpcError as e:
            assert e.code() in RETRY, e
            time.sleep(0.1)
    assert final is not None and sum(int(kv.value) for kv in final.kvs) == total
    print(f"transfers committed {committed[0]}, audits {len(sums)}")
