"""A TxnPlan is the request's tree walked once: the same facts the tree walks give.

The plan's single pass is checked against the plain walks (``txnplan.nodes``, ``ops``,
``all_ranges``) and against the branch path's ops on random nested Txns; ``plan_of``
keeps a plan per request bytes, keeps none of a large request, and refuses bytes that
are not a TxnRequest with etcd's invalid-argument error.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import sharding, txnplan
from accord.services.kv.errors import EtcdError
from accord.services.kv.ranges import KeyRange
from accord.services.kv.txnplan import TxnPlan, all_ranges, nodes, ops, plan_of

keys = st.sampled_from([b"/a/1", b"/a/2", b"/b/1", b"/c/9", b"k"])
ends = st.sampled_from([b"", b"", b"\x00", b"/z"])


@st.composite
def leaf_ops(draw: st.DrawFn) -> pb.RequestOp:
    kind = draw(st.sampled_from(["put", "range", "delete", "empty"]))
    key = draw(keys)
    if kind == "put":
        return pb.RequestOp(request_put=pb.PutRequest(
            key=key, value=b"v", lease=draw(st.sampled_from([0, 0, 7])),
            ignore_value=draw(st.booleans())))
    if kind == "range":
        return pb.RequestOp(request_range=pb.RangeRequest(key=key, range_end=draw(ends)))
    if kind == "delete":
        return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(
            key=key, range_end=draw(ends)))
    return pb.RequestOp()


def txns(depth: int) -> st.SearchStrategy[pb.TxnRequest]:
    op = leaf_ops() if depth == 0 else st.one_of(
        leaf_ops(), txns(depth - 1).map(lambda t: pb.RequestOp(request_txn=t)))
    compare = st.builds(lambda k, e: pb.Compare(key=k, range_end=e, target=pb.Compare.MOD,
                                                result=pb.Compare.EQUAL), keys, ends)
    return st.builds(lambda c, s, f: pb.TxnRequest(compare=c, success=s, failure=f),
                     st.lists(compare, max_size=3), st.lists(op, max_size=3),
                     st.lists(op, max_size=3))


def reference_taken(req: pb.TxnRequest, path: list[bool]) -> list[tuple[int, pb.RequestOp]]:
    """The ops ``path`` runs with their op numbers, by numbering every op of the tree."""
    numbered = {id(op): o for o, (op, _k) in enumerate(ops(req))}
    out: list[tuple[int, pb.RequestOp]] = []
    p = [0]

    def walk(node: pb.TxnRequest) -> None:
        ok = path[p[0]]
        p[0] += 1
        for op in node.success if ok else node.failure:
            if op.WhichOneof("request") == "request_txn":
                walk(op.request_txn)
            else:
                out.append((numbered[id(op)], op))

    walk(req)
    return out


@settings(max_examples=200, deadline=None)
@given(txns(2), st.lists(st.booleans(), min_size=40, max_size=40))
def test_the_plan_holds_what_the_tree_walks_give(req: pb.TxnRequest, bits: list[bool]) -> None:
    plan = TxnPlan(req)
    assert len(plan.compares) == len(nodes(req))  # a row of compares per node
    assert list(plan.ops) == [op for op, _k in ops(req)]
    assert list(plan.kinds) == [k for _op, k in ops(req)]
    assert list(plan.ranges) == all_ranges(req)
    assert [c for row in plan.compares for _k, _e, c in row] == \
        [c for node in nodes(req) for c in node.compare]
    assert [(o, k) for o, k, _lease, _i in plan.puts] == \
        [(o, op.request_put.key) for o, (op, kind) in enumerate(ops(req))
         if kind == "request_put"]
    assert plan.flat == (len(nodes(req)) == 1)
    # a path decides every node it reaches: at most one decision per node
    path = bits[:len(plan.compares)]
    got = plan.taken(path)
    want = reference_taken(req, path)
    assert [o for o, _op in got] == [o for o, _op in want]
    assert all(a is b or a == b for (_o, a), (_p, b) in zip(got, want, strict=True))


def test_a_shard_part_holds_the_ranges_and_leases_of_its_keys() -> None:
    shards = 4
    req = pb.TxnRequest(
        compare=[pb.Compare(key=b"/a/1", target=pb.Compare.MOD, result=pb.Compare.EQUAL)],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=b"/a/1", value=b"v", lease=5)),
                 pb.RequestOp(request_put=pb.PutRequest(key=b"/q/7", value=b"v", lease=6)),
                 pb.RequestOp(request_range=pb.RangeRequest(key=b"a", range_end=b"\x00"))])
    plan = TxnPlan(req)
    home = sharding.shard_of(b"/a/1", shards)
    other = sharding.shard_of(b"/q/7", shards)
    assert home != other
    part = plan.part(home, shards)
    # the compare's key and the put's, once; then the range over everything
    assert part.ranges == (KeyRange.of(b"/a/1", b""), KeyRange.of(b"a", b"\x00"))
    assert plan.part(other, shards).ranges == (KeyRange.of(b"/q/7", b""),
                                               KeyRange.of(b"a", b"\x00"))
    assert part.leases == {5}
    assert plan.part(other, shards).leases == {6}
    # the range over everything is on every shard, once
    for s in range(shards):
        assert sum(1 for r in plan.part(s, shards).ranges if not r.single) == 1
    assert plan.part(home, shards) is part  # kept


def test_plan_of_keeps_small_requests_and_refuses_garbage() -> None:
    small = pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
        key=b"/k", value=b"v"))]).SerializeToString()
    assert plan_of(small) is plan_of(bytes(small))  # equal bytes, one plan
    big = pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
        key=b"/k", value=b"x" * (txnplan.CACHE_MAX_REQUEST + 1)))]).SerializeToString()
    assert plan_of(big) is not plan_of(big)  # parsed each time, never kept
    assert plan_of(big).puts[0][1] == b"/k"
    with pytest.raises(EtcdError) as err:
        plan_of(b"\xff\xff\xff")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed TxnRequest" in err.value.message


def test_the_cache_stays_within_its_entries() -> None:
    for i in range(txnplan.CACHE_ENTRIES + 50):
        plan_of(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
            key=f"/k{i}".encode(), value=b"v"))]).SerializeToString())
    assert len(txnplan._cache) == txnplan.CACHE_ENTRIES
