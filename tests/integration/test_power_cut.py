"""Power cuts under real daemons: each node's data directory lives on its own lossyfs
mount, so a cut loses exactly what the node had not synced, as on a machine that lost
power (``kill -9`` alone keeps the page cache and would hide a missing fsync).

A 3-node cluster serves the linearizability checker's clients and a writer of unique
keys while nodes are cut: the leader; a follower that was down while the others wrote
past their snapshots; all three at once; then a fourth member added at runtime, once it
caught up (a new replica starts from snapshot installs; it must come back as the same
member, from its member file). A cut is ``kill -9``, then the mount's power cut (torn: each
file keeps a seeded prefix of its unsynced writes), then a restart. Small WAL segments
and a small snapshot interval make every run create, preallocate, rotate and delete
segments and compact logs; a lease granted before the cuts must outlive them.
Afterwards every acknowledged write is read back, the history is checked for
linearizability, and ``accord wal check`` found no damage on any cut directory.

Seeds: ``POWER_CUT_SEED`` (printed) chooses the cuts' tear points and the clients'
choices; the interleaving with the daemons is real time and not replayable.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.raft.storage import walcheck
from tests.integration.cluster import HOST, ProcCluster, ProcNode
from tests.integration.test_linearizability import TRANSIENT, Client
from tests.lincheck import INF, Op, check
from tests.tools.lossyfs.control import LossyFS

EXTRA = ("--snapshot-count", "40", "--wal-segment-bytes", "16384")
KEYS = [b"lin/%d" % i for i in range(12)]
"""The checker's registers: more of them keep each one's history short to check."""


@dataclass
class LossyCluster:
    """A ProcCluster whose nodes keep their data on lossyfs mounts (``<mount>/data``)."""

    cluster: ProcCluster
    disks: dict[str, LossyFS]
    seed: int
    root: Path
    checks: list[str] = field(default_factory=list)
    """What ``accord wal check`` said about each cut WAL directory."""
    joined: set[str] = field(default_factory=set)
    """Members added at runtime (restarted with ``--initial-cluster-state existing``)."""

    def disk_for(self, n: ProcNode) -> LossyFS:
        """Mount a fresh disk for ``n``; its data directory goes on it."""
        fs = self.disks[n.name] = LossyFS(self.root / f"{n.name}.disk",
                                          self.root / f"{n.name}.mnt")
        fs.start()
        n.data_dir = fs.mountpoint / "data"  # created by the daemon, as on a fresh machine
        return fs

    def power_cut(self, nodes: list[ProcNode]) -> None:
        """kill -9 ``nodes``, cut their disks' power, check their logs, restart them."""
        c = self.cluster
        for n in nodes:
            c.kill(n, keep_channel=True)  # the clients' threads keep using it
        for n in nodes:
            cut_seed = random.Random(f"{self.seed}/{n.name}/{len(self.disks[n.name].cuts)}")
            rep = self.disks[n.name].power_cut(seed=cut_seed.getrandbits(32), torn=True)
            print(f"cut {n.name}: seed {rep['seed']}, {rep['bytes_dropped']} unsynced bytes "
                  f"dropped, {rep['bytes_kept']} kept torn, vanished {rep['vanished'][:6]}")
            out = io.StringIO()
            status = walcheck.check(n.data_dir / "wal", out)
            status = max(status, walcheck.check_snapshots(n.data_dir / "snap", out))
            assert status == 0, f"`accord wal check` on {n.name} after a cut:\n{out.getvalue()}"
            self.checks += [ln for ln in out.getvalue().splitlines()
                            if ln.startswith(("result:", "snapshots:"))]
        for n in nodes:
            c.start(n, existing=n.name in self.joined)
        for n in nodes:
            c.wait_serving(n)


@pytest.fixture
def lossy(tmp_path: Path) -> Iterator[LossyCluster]:
    seed = int(os.environ.get("POWER_CUT_SEED", random.randrange(1 << 30)))
    print(f"POWER_CUT_SEED={seed}")
    # One process per node: the cut, its `accord wal check` and its model of what was
    # acknowledged are written for one log per node (a node of several workers has one per
    # worker, under worker-<k>/).
    c = ProcCluster(tmp_path, 3, extra=EXTRA, workers=1)
    lc = LossyCluster(c, {}, seed, tmp_path)
    try:
        for n in c.nodes:
            lc.disk_for(n)
        c.start_all()
        yield lc
    finally:
        c.stop_all()
        for fs in lc.disks.values():
            fs.stop()


def _serving(n: ProcNode) -> bool:
    if n.proc is None or n.proc.poll() is not None:
        return False
    with contextlib.suppress(OSError), socket.create_connection((HOST, n.client_port), 0.2):
        return True
    return False


class LiveClient(Client):
    """The checker's client, sending only to members that accept connections, and pausing
    between operations: each request to a member that is down or still starting would be
    recorded as an unknown outcome, and those are what makes a history slow to check."""

    def _node(self) -> ProcNode:
        nodes = list(self.cluster.nodes)
        self.rng.shuffle(nodes)
        return next((n for n in nodes if _serving(n)), nodes[0])

    def run(self) -> None:
        try:
            while time.monotonic() < self.until:
                self.one()
                time.sleep(0.05)
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)


class Acker(threading.Thread):
    """Puts unique keys through random members; records each acknowledged one."""

    def __init__(self, cluster: ProcCluster, seed: int) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.acked: list[bytes] = []
        self.running = True
        self.errors: list[BaseException] = []

    def run(self) -> None:
        i = 0
        try:
            while self.running:
                i += 1
                key = b"/acked/%06d" % i
                up = [n for n in self.cluster.nodes if n.proc is not None and n.proc.poll() is None]
                node = self.rng.choice(up or self.cluster.nodes)
                try:
                    node.kv().Put(rpc_pb2.PutRequest(key=key, value=b"v%d" % i), timeout=1.0)
                    self.acked.append(key)
                except grpc.RpcError as e:
                    if e.code() not in TRANSIENT:
                        raise
                    time.sleep(0.02)
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)


def _caught_up(c: ProcCluster, node: ProcNode, key: bytes, timeout: float = 30.0) -> None:
    """Wait until ``node`` serves ``key`` from its own state (a serializable read)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.RpcError):
            if c.get(node, key, serializable=True, timeout=1.0) is not None:
                return
        time.sleep(0.05)
    raise AssertionError(f"{node.name} did not catch up to {key!r} within {timeout}s")


T = TypeVar("T")


def _retry(call: Callable[[], T], timeout: float = 30.0) -> T:
    """``call()``, retried on transient errors for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() not in TRANSIENT or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _read_all(c: ProcCluster, prefix: bytes, timeout: float = 30.0) -> set[bytes]:
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for n in c.nodes:
            try:
                r = n.kv().Range(rpc_pb2.RangeRequest(key=prefix, range_end=end), timeout=5.0)
                return {kv.key for kv in r.kvs}
            except grpc.RpcError as e:
                last = e
        time.sleep(0.1)
    raise AssertionError(f"could not read {prefix!r} for {timeout}s: {last}")


def test_power_cuts_of_one_a_minority_and_all_nodes_lose_no_acknowledged_write(
    lossy: LossyCluster,
) -> None:
    c = lossy.cluster
    for k in KEYS:
        c.put(k, b"0")
    leader = c.leader()
    lease = rpc_pb2_grpc.LeaseStub(leader.channel()).LeaseGrant(
        rpc_pb2.LeaseGrantRequest(TTL=300), timeout=5.0)
    leader.kv().Put(rpc_pb2.PutRequest(key=b"/leased/k", value=b"held", lease=lease.ID),
                    timeout=5.0)
    history: list[Op] = [Op(k, "write", 0.0, 0.0, 0) for k in KEYS]
    lock = threading.Lock()

    def start_clients(first: int) -> list[LiveClient]:
        cls = [LiveClient(first + i, c, float("inf"), history, lock, seed=lossy.seed + first + i,
                          keys=KEYS) for i in range(2)]
        for cl in cls:
            cl.start()
        return cls

    def stop(threads: list[LiveClient]) -> None:
        for cl in threads:
            cl.until = 0.0
        for cl in threads:
            cl.join(30)

    clients = start_clients(0)
    done: list[LiveClient] = []
    acker = Acker(c, lossy.seed)
    acker.start()
    try:
        time.sleep(1.5)
        # One node: the leader.
        lossy.power_cut([c.leader(timeout=20)])
        time.sleep(1.0)
        # A minority: a follower, down while the others write past their snapshots
        # (so it may come back by a snapshot install), then cut.
        follower = next(n for n in c.nodes if n is not c.leader(timeout=20))
        c.kill(follower, keep_channel=True)
        time.sleep(2.5)
        lossy.power_cut([follower])
        _caught_up(c, follower, acker.acked[-1])
        time.sleep(0.5)
        # All of them at once. The checker's clients pause for it (every operation while
        # no member serves would only add an unknown outcome); the key writer goes on.
        stop(clients)
        done += clients
        lossy.power_cut(list(c.nodes))
        c.wait_published()
        clients = start_clients(10)
        time.sleep(1.0)
        # A membership change: a fourth member joins on a fresh disk, is cut once it
        # caught up (its member file, its log, its snapshots), and is the same member after.
        n4 = c.new_node("n4")
        lossy.disk_for(n4)
        peer_url = f"http://{HOST}:{n4.peer_port}"
        added = _retry(lambda: rpc_pb2_grpc.ClusterStub(c.leader(timeout=20).channel()).MemberAdd(
            rpc_pb2.MemberAddRequest(peerURLs=[peer_url]), timeout=10.0))
        c.initial_for["n4"] = ",".join([f"n4={peer_url}"] + [
            f"{m.name}={u}" for m in added.members if m.ID != added.member.ID for u in m.peerURLs])
        lossy.joined.add("n4")
        c.start(n4, existing=True)
        c.wait_serving(n4)
        _caught_up(c, n4, acker.acked[-1], timeout=60)
        lossy.power_cut([n4])
        _caught_up(c, n4, acker.acked[-1], timeout=60)
        # Linearizable: right after its restart the member's meta group may not have
        # applied its log yet (its commit index comes from the leader), and a serializable
        # list answers from that local, still empty, state.
        listed = _retry(lambda: rpc_pb2_grpc.ClusterStub(n4.channel()).MemberList(
            rpc_pb2.MemberListRequest(linearizable=True), timeout=5.0))
        assert added.member.ID in {m.ID for m in listed.members}
        assert _retry(lambda: c.status(n4, 5.0)).header.member_id == added.member.ID, \
            "the member came back under another id"
        time.sleep(1.0)
    finally:
        stop(clients)
        done += clients
        acker.running = False
        acker.join(30)
    errors = [e for t in (*done, acker) for e in t.errors]
    assert not errors, errors
    for n in c.nodes:  # fresh channels: an old one may still be backing off from a cut
        n.close_channel()
    # Every acknowledged write is there.
    present = _read_all(c, b"/acked/")
    missing = [k for k in acker.acked if k not in present]
    assert not missing, f"{len(missing)} acknowledged writes lost, first {missing[:5]}"
    # The lease and its key outlived the cuts.
    ttl = _retry(lambda: rpc_pb2_grpc.LeaseStub(c.nodes[0].channel()).LeaseTimeToLive(
        rpc_pb2.LeaseTimeToLiveRequest(ID=lease.ID), timeout=5.0))
    assert ttl.TTL > 0, "the lease granted before the cuts is gone"
    assert _retry(lambda: c.get(c.nodes[0], b"/leased/k")) == b"held"
    # The history, with a final read of every key after the cuts, is linearizable.
    for k in KEYS:
        t0 = time.monotonic()
        v = _retry(lambda k=k: c.get(c.nodes[0], k))  # type: ignore[misc]
        history.append(Op(k, "read", t0, time.monotonic(), int(v) if v is not None else None))
    completed = [op for op in history if op.complete != INF and op.invoke > 0]
    unknown = sum(1 for op in history if op.complete == INF)
    print(f"history: {len(completed)} completed, {unknown} of unknown outcome")
    violations = check(history)
    assert not violations, "\n".join(map(str, violations))
    cuts = sum(len(d.cuts) for d in lossy.disks.values())
    acked_lin = sum(1 for op in completed if op.kind in ("write", "cas"))
    print(f"power cuts: {cuts}; acknowledged writes checked: {len(acker.acked)} unique keys + "
          f"{acked_lin} register writes; history: {len(completed)} completed ops; "
          f"wal check: {sorted(set(lossy.checks))}")
    assert len(acker.acked) > 20 and len(completed) > 30
