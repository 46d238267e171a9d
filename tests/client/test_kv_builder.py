"""The KV surface's request builders and the transaction builder (no server)."""

from __future__ import annotations

import pytest

from accord.client.kv import (
    Compare,
    Op,
    SortOrder,
    SortTarget,
    Txn,
    TxnBuilder,
    delete_request,
    key_range,
    put_request,
    range_request,
)
from accord.proto import rpc_pb2


def test_key_ranges() -> None:
    assert key_range("a") == (b"a", b"")
    assert key_range("a", "c") == (b"a", b"c")
    assert key_range("ab", prefix=True) == (b"ab", b"ac")
    assert key_range(b"a\xff", prefix=True) == (b"a\xff", b"b")
    assert key_range("", prefix=True) == (b"", b"\0")
    assert key_range("m", from_key=True) == (b"m", b"\0")
    with pytest.raises(ValueError, match="at most one"):
        key_range("a", "b", prefix=True)


def test_range_request_carries_every_option() -> None:
    r = range_request("k", prefix=True, limit=3, revision=7, sort_order=SortOrder.DESCEND,
                      sort_target=SortTarget.MOD, serializable=True, keys_only=True,
                      count_only=True, min_mod_revision=2, max_mod_revision=6,
                      min_create_revision=1, max_create_revision=5)
    assert (r.key, r.range_end, r.limit, r.revision) == (b"k", b"l", 3, 7)
    assert r.sort_order == rpc_pb2.RangeRequest.DESCEND and r.sort_target == rpc_pb2.RangeRequest.MOD
    assert r.serializable and r.keys_only and r.count_only
    assert (r.min_mod_revision, r.max_mod_revision) == (2, 6)
    assert (r.min_create_revision, r.max_create_revision) == (1, 5)
    with pytest.raises(ValueError):
        range_request("k", limit=-1)


def test_put_and_delete_requests() -> None:
    p = put_request("k", "", lease=0, prev_kv=True, ignore_value=True)
    assert p.prev_kv and p.ignore_value and p.value == b""
    with pytest.raises(ValueError, match="ignore_value"):
        put_request("k", "v", ignore_value=True)
    with pytest.raises(ValueError, match="ignore_lease"):
        put_request("k", "v", lease=5, ignore_lease=True)
    d = delete_request("dir/", prefix=True, prev_kv=True)
    assert (d.key, d.range_end, d.prev_kv) == (b"dir/", b"dir0", True)


def test_compares_use_the_operator_and_the_target_field() -> None:
    c = (Compare.value("k") == "v").pb
    assert (c.target, c.result, c.value) == (rpc_pb2.Compare.VALUE, rpc_pb2.Compare.EQUAL, b"v")
    c = (Compare.version("k") > 2).pb
    assert (c.target, c.result, c.version) == (rpc_pb2.Compare.VERSION, rpc_pb2.Compare.GREATER, 2)
    c = (Compare.mod("k") < 9).pb
    assert (c.target, c.result, c.mod_revision) == (rpc_pb2.Compare.MOD, rpc_pb2.Compare.LESS, 9)
    c = (Compare.create("k") != 0).pb
    assert (c.result, c.create_revision) == (rpc_pb2.Compare.NOT_EQUAL, 0)
    assert c.WhichOneof("target_union") == "create_revision"  # 0 is sent, not left unset
    c = (Compare.lease("dir/", prefix=True) == 0x10).pb
    assert (c.lease, c.range_end) == (0x10, b"dir0")
    with pytest.raises(TypeError, match="int"):
        _ = Compare.version("k") == "1"
    with pytest.raises(TypeError, match="bytes or str"):
        _ = Compare.value("k") == 1


def test_txn_builder_shape_and_order() -> None:
    sent: list[rpc_pb2.TxnRequest] = []
    t = Txn(lambda req: sent.append(req) or len(sent))
    out = (t.if_(Compare.value("a") == "1")
           .then(Op.put("a", "2", prev_kv=True), Op.get("a"),
                 Op.txn([Compare.version("b") == 0], [Op.put("b", "x")], [Op.delete("b")]))
           .else_(Op.delete("a", prefix=True, prev_kv=True))
           .commit())
    assert out == 1
    (req,) = sent
    assert len(req.compare) == 1 and len(req.success) == 3 and len(req.failure) == 1
    assert req.success[0].request_put.prev_kv
    assert req.success[2].request_txn.success[0].request_put.key == b"b"
    assert req.failure[0].request_delete_range.range_end == b"b"
    for misuse in (lambda b: b.then().if_(), lambda b: b.else_().then(),
                   lambda b: b.if_().if_(), lambda b: b.else_().else_()):
        with pytest.raises(ValueError, match="order"):
            misuse(TxnBuilder())
    with pytest.raises(TypeError, match="Compare"):
        TxnBuilder().if_(rpc_pb2.Compare())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Op"):
        TxnBuilder().then(rpc_pb2.RequestOp())  # type: ignore[arg-type]
    # no condition: then runs
    assert not TxnBuilder().then(Op.get("a")).request().compare
