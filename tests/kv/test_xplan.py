"""A multi-shard Txn's plan: what it derives once is what walking the request gives.

The state machine takes a participant's intent ranges, its puts and their leases, the
partial compares and the branch path from a :class:`~accord.services.kv.xplan.TxnPlan`
kept per request bytes instead of walking the parsed request at every use; for random
Txn trees (nested ones, ranges, leases) each must equal ``xtxn``'s walk over the request.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import sharding, xplan, xtxn
from accord.services.kv.errors import EtcdError
from accord.services.kv.statemachine import KVStateMachine
from tests.kv.helpers import cmp, op_del, op_get, op_put, op_txn, put

SHARDS = 4
KEYS = [b"a", b"b", b"k1", b"k2", b"k3", b"z"]

keys_st = st.sampled_from(KEYS)
compares = st.one_of(
    st.builds(lambda k, v: cmp(k, "VALUE", "EQUAL", v), keys_st, st.sampled_from([b"x", b"y"])),
    st.builds(lambda k, v: cmp(k, "VERSION", "GREATER", v), keys_st, st.integers(0, 2)),
    st.builds(lambda v: cmp(b"k", "VERSION", "GREATER", v, b"l"), st.integers(0, 1)),
)
plain_ops = st.one_of(
    st.builds(lambda k, lease: op_put(k, b"v", lease=lease), keys_st, st.sampled_from([0, 7, 9])),
    st.builds(op_del, keys_st),
    st.builds(lambda: op_del(b"k", b"l")),
    st.builds(op_get, keys_st),
)
ops = st.one_of(plain_ops, st.builds(op_txn, st.lists(compares, max_size=2),
                                     st.lists(plain_ops, max_size=2),
                                     st.lists(plain_ops, max_size=2)))
txns = st.builds(lambda c, s, f: pb.TxnRequest(compare=c, success=s, failure=f),
                 st.lists(compares, max_size=3), st.lists(ops, max_size=4),
                 st.lists(ops, max_size=3))


@settings(max_examples=120, deadline=None)
@given(txns, st.lists(st.tuples(keys_st, st.sampled_from([b"x", b"y"])), max_size=6))
def test_a_plan_derives_what_walking_the_request_derives(
        req: pb.TxnRequest, writes: list[tuple[bytes, bytes]]) -> None:
    sm = KVStateMachine()
    for key, value in writes:
        put(sm, key, value)
    plan = xplan.TxnPlan(req)
    store = sm._store
    assert plan.partial_compares(store, store.rev) == xtxn.partial_compares(store, req, store.rev)
    for shard in range(SHARDS):
        def owns(key: bytes, shard: int = shard) -> bool:
            return sharding.shard_of(key, SHARDS) == shard
        share = plan.share(shard, SHARDS)
        assert share.ranges == xtxn.intent_ranges(req, shard, SHARDS, sharding.shards_of_range)
        assert share.leases == xtxn.put_leases(req, owns)
        assert plan.put_checks(sm._exec, share) == xtxn.put_checks(sm._exec, req, owns)
        assert all(share.owns(k) == owns(k) for k in KEYS)
        assert plan.share(shard, SHARDS) is share  # computed once
    parts = [plan.partial_compares(store, store.rev)]
    assert plan.path(parts) == xtxn.path_of(req, xtxn.combine(req, parts))


def test_the_same_bytes_share_one_plan_and_a_large_request_is_not_kept() -> None:
    small = pb.TxnRequest(success=[op_put(b"a"), op_put(b"z")]).SerializeToString()
    first = xplan.plan_of(small)
    assert xplan.plan_of(bytes(bytearray(small))) is first  # equal bytes, another object
    large = pb.TxnRequest(success=[op_put(b"a", b"v" * xplan.PLAN_CACHE_MAX_BYTES)])
    data = large.SerializeToString()
    one, two = xplan.plan_of(data), xplan.plan_of(data)
    assert one is not two and one.req == two.req == large


def test_malformed_request_bytes_are_a_bad_request() -> None:
    with pytest.raises(EtcdError) as e:
        xplan.plan_of(b"\xff\xff\xff")
    assert "malformed TxnRequest" in e.value.message
