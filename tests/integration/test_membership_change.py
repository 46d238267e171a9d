"""Issue #4 with real daemons: add a fourth node, then remove one, under writes.

A client thread writes without pause while node 4 is added (MemberAdd through the
etcd Cluster service, then `accord serve --initial-cluster-state existing`) and node
1 is removed (MemberRemove). At the end every acknowledged write is readable, every
group (meta, both KV shards, scheduler, checkpoints) has at least three voters on every remaining
node and none lists node 1, and node 1 has stopped by itself.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from accord.node.members import DEBUG_GROUPS_METHOD
from accord.proto import rpc_pb2 as pb
from accord.proto import rpc_pb2_grpc
from tests.integration.cluster import HOST, ProcCluster, ProcNode


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    """Three members; with two workers, the table lives in worker 0 and every worker's
    member-change driver brings the groups it leads to it."""
    with ProcCluster(tmp_path, 3, workers=request.param, extra=("--shards", "2")) as c:
        yield c


def groups_of(node: ProcNode) -> dict[str, Any]:
    """The debug method's view of every group on ``node``."""
    call = node.channel().unary_unary(DEBUG_GROUPS_METHOD)
    report: dict[str, Any] = json.loads(call(b"", timeout=2.0))
    return report


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            got = check()
        except grpc.RpcError as e:
            got, last = None, e
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout}s (last error: {last})")


class VoterWatch(threading.Thread):
    """Samples every group's voter count on one node until halted."""

    def __init__(self, node: ProcNode) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.fewest = 99
        self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while not self.halt.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                report = groups_of(self.node)["groups"]
                self.fewest = min([self.fewest, *(len(g["voters"]) for g in report.values())])
                self.samples += 1
            time.sleep(0.1)


class Writer(threading.Thread):
    """Puts /mc/<i> = <i> one after another through the nodes it is given."""

    def __init__(self, nodes: list[ProcNode]) -> None:
        super().__init__(daemon=True)
        self.nodes = list(nodes)
        self.acked: dict[bytes, bytes] = {}
        self.last: tuple[bytes, bytes] | None = None
        self.failures = 0
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        deadline = time.monotonic() + 120  # bounded whatever happens
        while not self.halt.is_set() and time.monotonic() < deadline and i < 100_000:
            key, value = f"/mc/{i}".encode(), str(i).encode()
            node = self.nodes[i % len(self.nodes)]
            try:
                node.kv().Put(pb.PutRequest(key=key, value=value), timeout=3.0)
                self.acked[key] = value
                self.last = (key, value)
            except grpc.RpcError:
                self.failures += 1  # not acknowledged: it may or may not be there
                time.sleep(0.05)
            i += 1


def test_add_a_fourth_node_then_remove_one_under_writes(cluster: ProcCluster) -> None:
    n1, n2, n3 = cluster.nodes
    writer = Writer([n2, n3])
    writer.start()
    watch = VoterWatch(n2)
    watch.start()
    try:
        wait_for("first writes", lambda: len(writer.acked) > 20)

        # MemberAdd, as `etcdctl member add n4 --peer-urls=...` sends it.
        n4 = cluster.new_node("n4")
        peer_url = f"http://{HOST}:{n4.peer_port}"
        resp = rpc_pb2_grpc.ClusterStub(n2.channel()).MemberAdd(
            pb.MemberAddRequest(peerURLs=[peer_url]), timeout=10)
        new_id = resp.member.ID
        assert new_id and list(resp.member.peerURLs) == [peer_url]
        initial = ",".join([f"n4={peer_url}"] + [
            f"{m.name}={u}" for m in resp.members if m.ID != new_id for u in m.peerURLs])
        cluster.start(n4, existing=True, initial_cluster=initial)
        cluster.wait_serving(n4)

        # It serves a linearizable read of the latest acknowledged write.
        def reads_latest() -> bool:
            assert writer.last is not None
            key, value = writer.last
            return cluster.get(n4, key, timeout=3.0) == value
        wait_for("n4 serving the latest write", reads_latest, timeout=40)
        writer.nodes.append(n4)

        # It becomes a voter of every group (the leaders promote it once caught up).
        def n4_votes_everywhere() -> bool:
            report = groups_of(n2)["groups"]
            return all(new_id in g["voters"] for g in report.values())
        wait_for("n4 a voter of every group", n4_votes_everywhere, timeout=40)
        assert groups_of(n4)["member_id"] == new_id

        # Remove n1 while writes go on.
        n1_id = cluster.status(n1).header.member_id
        rpc_pb2_grpc.ClusterStub(n3.channel()).MemberRemove(
            pb.MemberRemoveRequest(ID=n1_id), timeout=30)
        assert n1.proc is not None
        assert n1.proc.wait(30) == 0, cluster.log(n1)
        assert "removed from the cluster" in cluster.log(n1)
        n1.close_channel()

        acked_before = len(writer.acked)
        wait_for("writes after the removal", lambda: len(writer.acked) > acked_before + 20)
    finally:
        writer.halt.set()
        watch.halt.set()
        writer.join(10)
        watch.join(10)
    # Never fewer than three voters in any group, seen from n2 all along.
    assert watch.samples > 10 and watch.fewest >= 3, (watch.samples, watch.fewest)

    # No acknowledged write is lost.
    for node in (n2, n3, n4):
        got = node.kv().Range(pb.RangeRequest(key=b"/mc/", range_end=b"/mc0"), timeout=10)
        have = {kv.key: kv.value for kv in got.kvs}
        missing = [k for k, v in writer.acked.items() if have.get(k) != v]
        assert not missing, f"{node.name} lost {len(missing)} acknowledged writes: {missing[:5]}"
    assert len(writer.acked) > 40

    # Every group keeps at least three voters, n1 in none of them, on every member.
    for node in (n2, n3, n4):
        def settled(node: ProcNode = node) -> bool:
            report = groups_of(node)["groups"]
            return len(report) == 5 and all(  # meta, 2 KV shards, scheduler, checkpoints
                len(g["voters"]) >= 3 and n1_id not in g["voters"] + g["learners"]
                for g in report.values())
        with contextlib.suppress(AssertionError):
            wait_for(f"{node.name}'s groups without n1", settled, timeout=20)
        assert settled(), (node.name, n1_id, groups_of(node))
    def names() -> list[str]:
        members = rpc_pb2_grpc.ClusterStub(n2.channel()).MemberList(
            pb.MemberListRequest(linearizable=True), timeout=5).members
        return sorted(m.name for m in members)
    wait_for("n4 to publish its name", lambda: names() == ["n2", "n3", "n4"], timeout=20)
    members = rpc_pb2_grpc.ClusterStub(n2.channel()).MemberList(
        pb.MemberListRequest(linearizable=True), timeout=5).members
    assert all(not m.isLearner for m in members)
    with contextlib.suppress(Exception):
        n4.close_channel()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_replica_repair_removes_a_member_dead_for_too_long(tmp_path: Path, workers: int) -> None:
    """Issue #6: with --member-dead-after, a killed voter leaves the cluster by itself
    (with two workers: worker 0 decides, every worker's groups follow the table)."""
    with ProcCluster(tmp_path, 4, workers=workers,
                     extra=("--shards", "2", "--member-dead-after", "2")) as c:
        n1, _, _, n4 = c.nodes
        c.put(b"/r/before", b"1")
        n4_id = c.status(n4).header.member_id
        c.kill(n4)

        def removed() -> bool:
            members = rpc_pb2_grpc.ClusterStub(n1.channel()).MemberList(
                pb.MemberListRequest(linearizable=True), timeout=3).members
            groups = groups_of(n1)["groups"].values()
            return (n4_id not in {m.ID for m in members} and len(members) == 3
                    and all(len(g["voters"]) == 3 and n4_id not in g["voters"] for g in groups))
        wait_for("n4 removed by replica repair", removed, timeout=40)
        c.put(b"/r/after", b"2", via=[n1])
        assert c.get(n1, b"/r/before") == b"1" and c.get(n1, b"/r/after") == b"2"
