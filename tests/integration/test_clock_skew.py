"""A member whose clock is wrong, on real daemons (3 members, ``--shards 8``).

n3 runs with its wall clock 5 s ahead (the test failpoint ``ACCORD_FAILPOINT_CLOCK_MS``),
as a host whose NTP went wrong would. What a user relies on: n3's peer probes show it
disagreeing with both others, so writes through n3 are refused with UNAVAILABLE naming
the clock, and none of them is applied; writes through n1 and n2 go on, with revisions
of the present (a revision stamped 5 s ahead would make every later write on its shard
wait 5 s for its commit-wait, on every member); reads through n3 still answer.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv.clockguard import CLOCK_FAILPOINT_ENV
from accord.services.kv.sharding import shard_of
from tests.integration.cluster import HOST, ProcCluster, ProcNode

SHARDS = 8
AHEAD_MS = 5000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    c = ProcCluster(tmp_path_factory.mktemp("clock"), 3, extra=("--shards", str(SHARDS)))
    try:
        for node in c.nodes:
            if node.name == "n3":
                os.environ[CLOCK_FAILPOINT_ENV] = str(AHEAD_MS)
            try:
                c.start(node)
            finally:
                os.environ.pop(CLOCK_FAILPOINT_ENV, None)
        for node in c.nodes:
            c.wait_serving(node)
        c.wait_published()
        yield c
    finally:
        c.stop_all()


def _metrics(node: ProcNode) -> dict[str, float]:
    """The accord_*clock* series of ``node``'s /metrics, by series name with labels."""
    with urllib.request.urlopen(f"http://{HOST}:{node.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(accord_\w*clock\w*(?:\{[^}]*\})?) (\S+)$",
                                                     text, re.M)}


def _total(metrics: dict[str, float], name: str) -> float:
    """A counter over the node: its one series, or the sum of its workers'."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def _now_rev() -> int:
    """The revision a write stamped by an honest clock now would get, at most."""
    return (time.time_ns() // 1000 + 1_000_000) * SHARDS


def test_writes_through_a_member_with_a_wrong_clock_are_refused_and_the_rest_go_on(
        cluster: ProcCluster) -> None:
    n1, _n2, n3 = cluster.nodes
    deadline = time.monotonic() + 60

    def off_from_both() -> bool:
        """n3 holds samples of both peers 5 s behind it: the majority that disagrees with
        it, on which it refuses to stamp (one peer's sample, which its log reports as
        soon as it comes, is not enough)."""
        peers = [v for k, v in _metrics(n3).items()
                 if k.startswith("accord_peer_clock_offset_seconds")]
        # Two peers per process: with workers, every worker stamps and judges on its own.
        return len(peers) == 2 * cluster.workers and all(-6 < v < -4 for v in peers)

    while not off_from_both():
        assert time.monotonic() < deadline, "n3 never found its clock off:\n" + cluster.log(n3)
        time.sleep(0.2)
    keys = [f"/clock/k{i}".encode() for i in range(40)]
    on_shards = {shard_of(k, SHARDS) for k in keys}
    assert len(on_shards) > 1
    refused = 0
    for k in keys:
        try:
            n3.kv().Put(pb.PutRequest(key=k, value=b"from-n3"), timeout=10)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            assert "clock" in (e.details() or ""), e.details()
            refused += 1
    # Every write through n3 after it knew was refused (its first ones, before the
    # evidence, may have gone through: then their revisions are what the rest must
    # climb above, and the check below would find writes from the future).
    assert refused == len(keys)
    for k in keys:
        r = cluster.put(k, b"from-n1", via=[n1])
        assert r <= _now_rev(), f"a revision from the future: {r} (now ~{_now_rev()})"
    got = n3.kv().Range(pb.RangeRequest(key=b"/clock/", range_end=b"/clock0"), timeout=10)
    assert {kv.value for kv in got.kvs} == {b"from-n1"} and len(got.kvs) == len(keys)
    # A Txn over several shards through n1 is stamped by n1's clock: of the present.
    txn = n1.kv().Txn(pb.TxnRequest(success=[
        pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"txn")) for k in keys[:8]]),
        timeout=30)
    assert txn.succeeded and txn.header.revision <= _now_rev()
    # What an operator sees: n3's peers 5 s behind it, its refusals counted; n1 sees n3
    # 5 s ahead and refused nothing.
    odd, good = _metrics(n3), _metrics(n1)
    peers = {k: v for k, v in odd.items() if k.startswith("accord_peer_clock_offset_seconds")}
    assert len(peers) == 2 * cluster.workers and all(-6 < v < -4 for v in peers.values()), odd
    assert _total(odd, "accord_clock_refusals_total") >= len(keys)
    while not any(4 < v < 6 for k, v in good.items() if k.startswith("accord_peer_clock")):
        # n1's own probe of n3 comes on n1's schedule (every few seconds from its start).
        assert time.monotonic() < deadline, good
        time.sleep(0.2)
        good = _metrics(n1)
    assert _total(good, "accord_clock_refusals_total") == 0
