"""Multi-shard Txns on real daemons (3 members, ``--shards 8``): the coordinator killed -9.

The member that coordinates a Txn is stopped at a failpoint (``ACCORD_FAILPOINT_XTXN``,
only for keys under ``/failpoint/``) either after every participant prepared or after the
record shard's decision, then killed -9. What a user relies on: the other members resolve
every intent it left (reads of the keys wait, then answer), the Txn is all-or-nothing
(nothing of it after a prepare-only death, all of it at one revision after the decision),
no key stays blocked (plain puts on every key go through), and the killed member, back,
agrees.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv.sharding import shard_of
from accord.services.kv.xcoord import FAILPOINT_ENV
from tests.integration.cluster import ProcCluster

SHARDS = 8


@pytest.fixture(scope="module", params=["after-prepare", "after-decision"])
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ProcCluster]]:
    c = ProcCluster(tmp_path_factory.mktemp("xshard"), 3, extra=("--shards", str(SHARDS)))
    os.environ[FAILPOINT_ENV] = request.param
    try:
        c.start_all()
    finally:
        del os.environ[FAILPOINT_ENV]
    try:
        c.wait_published()
        yield request.param, c
    finally:
        c.stop_all()


def _keys() -> list[bytes]:
    """Three keys under /failpoint/ on three different shards."""
    seen: dict[int, bytes] = {}
    i = 0
    while len(seen) < 3:
        k = f"/failpoint/k{i}".encode()
        seen.setdefault(shard_of(k, SHARDS), k)
        i += 1
    return sorted(seen.values())


def _call(fn: object, req: object, timeout: float = 5.0, attempts: int = 120) -> object:
    """A call retried while the cluster elects leaders (UNAVAILABLE, deadline)."""
    last: Exception | None = None
    for _ in range(attempts):
        try:
            return fn(req, timeout=timeout)  # type: ignore[operator]
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            last = e
            time.sleep(0.2)
    raise AssertionError(f"no answer: {last}")


def _blocked(kv: object, key: bytes) -> bool:
    """Whether a linearizable read of ``key`` waits (an intent holds it)."""
    try:
        kv.Range(pb.RangeRequest(key=key), timeout=0.5)  # type: ignore[attr-defined]
    except grpc.RpcError as e:
        return e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return False


def test_a_coordinator_killed_mid_txn_leaves_all_or_nothing(
    cluster: tuple[str, ProcCluster],
) -> None:
    step, c = cluster
    n1, n2, n3 = c.nodes
    keys = _keys()
    kv1, kv2 = n1.kv(), n2.kv()
    for k in keys:
        _call(kv2.Put, pb.PutRequest(key=k, value=b"old"))
    txn = pb.TxnRequest(
        compare=[pb.Compare(key=k, target=pb.Compare.VALUE, result=pb.Compare.EQUAL,
                            value=b"old") for k in keys],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"new")) for k in keys])
    pending = kv1.Txn.future(txn, timeout=60)
    deadline = time.monotonic() + 30
    while not _blocked(kv2, keys[0]):
        assert time.monotonic() < deadline, "the Txn never held its keys"
        assert not pending.done(), "the Txn finished although its coordinator stops"
        time.sleep(0.05)
    c.kill(n1)
    with contextlib.suppress(grpc.RpcError, grpc.FutureCancelledError):
        pending.result(timeout=5)
    # Reads through a survivor wait out the dead coordinator's deadline, then resolve.
    got = [_call(kv2.Range, pb.RangeRequest(key=k), timeout=15).kvs[0]  # type: ignore[attr-defined]
           for k in keys]
    values = {kv.value for kv in got}
    if step == "after-prepare":
        assert values == {b"old"}, values
    else:
        assert values == {b"new"}, values
        assert len({kv.mod_revision for kv in got}) == 1, "one revision on every shard"
    # No key stays blocked: a plain put on each goes through at once.
    for k in keys:
        _call(n3.kv().Put, pb.PutRequest(key=k, value=b"after"), timeout=10)
    c.start(n1)
    c.wait_serving(n1)
    back = [_call(n1.kv().Range, pb.RangeRequest(key=k), timeout=10).kvs[0].value  # type: ignore[attr-defined]
            for k in keys]
    assert back == [b"after"] * 3
