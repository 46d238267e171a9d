"""The answers of a multi-shard Txn's steps as bytes between a node's workers
(``accord/services/kv/xresults.py``): every kind comes back equal; anything else is
refused."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors, xresults
from accord.services.kv.errors import EtcdError
from accord.services.kv.intents import ABORTED, COMMITTED
from accord.services.kv.xcommands import Committed, Decision, Prepared


def answers() -> list[object]:
    share = pb.TxnResponse(succeeded=True)
    share.header.revision = 1 << 53
    share.responses.add().response_put.SetInParent()
    return [
        None,
        Prepared(True, "", 1 << 53, [[(True, False), (False, True)], []], {3: "x"}, 7),
        Prepared(False, "invalid", 9, error=errors.LEASE_NOT_FOUND),
        Prepared(False, "conflict", 12),
        Committed(share, Decision(COMMITTED, (True, False), 1 << 53)),
        Committed(None, Decision(ABORTED)),
        Committed(share, None, errors.range_too_large(10, 5)),
        Decision(COMMITTED, (False,), 0),
        pb.LeaseGrantResponse(ID=7, TTL=30),  # a lease's grant on another worker's shard
        pb.LeaseRevokeResponse(),
    ]


@pytest.mark.parametrize("answer", answers())
def test_every_answer_comes_back_equal(answer: object) -> None:
    assert xresults.unpack(xresults.pack(answer)) == answer  # type: ignore[arg-type]


def test_anything_else_is_refused() -> None:
    with pytest.raises(ValueError, match="not an answer"):
        xresults.pack(pb.PutResponse())  # type: ignore[arg-type]
    for junk in (b"", b"\x91\x09", b"\x92\x01\x02", b"\xc1"):
        with pytest.raises(EtcdError) as e:
            xresults.unpack(junk)
        assert e.value.code == grpc.StatusCode.INTERNAL
