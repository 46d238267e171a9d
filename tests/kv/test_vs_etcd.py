"""Store-level differential test: the same random KV workload to a real etcd 3.4 and
straight to ``KVStateMachine`` (no servicer in between); every response and error, and
the watch replay of the whole history, must be identical (header identity fields
aside). The workload is seeded, so a failure names a reproducible seed."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from accord.proto import kv_pb2
from accord.proto import rpc_pb2 as pb
from accord.proto import rpc_pb2_grpc as rpcg
from accord.services.kv.errors import EtcdError
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.compat.servers import etcd_server

KEYS = [b"a", b"ab", b"abc", b"b", b"b\xff", b"c", b"d"]
ENDS = [b"", b"", b"", b"b", b"c", b"\x00", b"e"]


class Workload:
    """Random requests over a small key space, so that they collide often."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)

    def key(self) -> bytes:
        return self.rnd.choice(KEYS)

    def end(self) -> bytes:
        return self.rnd.choice(ENDS)

    def range(self) -> pb.RangeRequest:
        r = self.rnd
        fields: dict[str, Any] = dict(
            key=self.key(), range_end=self.end(), limit=r.choice([0, 0, 1, 2]),
            revision=r.choice([0, 0, 0, r.randint(-1, 60)]), sort_order=r.choice([0, 0, 1, 2]),
            sort_target=r.choice([0, 0, 1, 2, 3, 4]), keys_only=r.random() < 0.2,
            count_only=r.random() < 0.1, min_mod_revision=r.choice([0, 0, 0, r.randint(1, 40)]),
            max_create_revision=r.choice([0, 0, 0, r.randint(1, 40)]),
        )  # fmt: skip
        return pb.RangeRequest(**fields)

    def put(self) -> pb.PutRequest:
        return pb.PutRequest(key=self.key(), value=self.rnd.choice([b"x", b"y", b"zz"]),
                             prev_kv=self.rnd.random() < 0.5)

    def delete(self) -> pb.DeleteRangeRequest:
        return pb.DeleteRangeRequest(key=self.key(), range_end=self.end(),
                                     prev_kv=self.rnd.random() < 0.5)

    def compare(self) -> pb.Compare:
        r = self.rnd
        target = r.randint(0, 3)
        fields: dict[str, Any] = dict(key=self.key(), range_end=r.choice([b"", b"", b"c"]),
                                      target=target, result=r.randint(0, 3))
        c = pb.Compare(**fields)
        if target == pb.Compare.VERSION:
            c.version = r.randint(0, 3)
        elif target == pb.Compare.CREATE:
            c.create_revision = r.randint(0, 20)
        elif target == pb.Compare.MOD:
            c.mod_revision = r.randint(0, 20)
        else:
            c.value = r.choice([b"x", b"y", b""])
        return c

    def op(self, depth: int) -> pb.RequestOp:
        x = self.rnd.random()
        if x < 0.35:
            return pb.RequestOp(request_put=self.put())
        if x < 0.55:
            return pb.RequestOp(request_delete_range=self.delete())
        if x < 0.85 or depth > 1:
            return pb.RequestOp(request_range=self.range())
        return pb.RequestOp(request_txn=self.txn(depth + 1))

    def txn(self, depth: int = 0) -> pb.TxnRequest:
        r = self.rnd
        return pb.TxnRequest(
            compare=[self.compare() for _ in range(r.randint(0, 2))],
            success=[self.op(depth) for _ in range(r.randint(0, 3))],
            failure=[self.op(depth) for _ in range(r.randint(0, 3))],
        )


def _outcome(call: Callable[[Any], Any], arg: Any) -> tuple[Any, tuple[str, str] | None]:
    """(response without identity header fields, None) or (None, (code name, message))."""
    try:
        resp = call(arg)
    except grpc.RpcError as e:
        return None, (e.code().name, e.details())
    except EtcdError as e:
        return None, (e.code.name, e.message)
    if resp.HasField("header"):
        for name in ("cluster_id", "member_id", "raft_term"):
            resp.header.ClearField(name)
    return resp, None


@pytest.fixture
def etcd_channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    """A fresh etcd per test (its revisions and compaction start from scratch)."""
    with etcd_server(tmp_path / "etcd") as server, grpc.insecure_channel(
        server.endpoint
    ) as channel:
        yield channel


@pytest.mark.parametrize("seed", [1, 2])
def test_random_workload_matches_etcd(etcd_channel: grpc.Channel, seed: int) -> None:
    kv = rpcg.KVStub(etcd_channel)  # type: ignore[no-untyped-call]
    sm = SM()
    start = 1
    work = Workload(seed)
    for i in range(300):
        x = work.rnd.random()
        req: Any
        if x < 0.3:
            req = work.put()
            theirs, ours = _outcome(kv.Put, req), _outcome(sm.apply, SM.encode_put(req))
        elif x < 0.4:
            req = work.delete()
            theirs = _outcome(kv.DeleteRange, req)
            ours = _outcome(sm.apply, SM.encode_delete_range(req))
        elif x < 0.7:
            req = work.txn()
            theirs, ours = _outcome(kv.Txn, req), _outcome(sm.apply, SM.encode_txn(req))
        elif x < 0.73:
            req = pb.CompactionRequest(revision=work.rnd.randint(start - 2, sm.revision + 1))
            theirs = _outcome(kv.Compact, req)
            ours = _outcome(sm.apply, SM.encode_compact(req))
        else:
            req = work.range()
            theirs, ours = _outcome(kv.Range, req), _outcome(sm.range, req)
        assert theirs == ours, f"seed {seed}, op {i}"
    assert kv.Range(pb.RangeRequest(key=b"a")).header.revision == sm.revision

    # the watch replay of everything since the oldest readable revision is identical
    since = max(start, sm.compact_revision + 1)
    assert sm.revision > 100  # the workload really wrote something
    for prev_kv in (False, True):
        create = pb.WatchCreateRequest(key=b"\x00", range_end=b"\x00", start_revision=since,
                                       prev_kv=prev_kv)
        their_events: list[kv_pb2.Event] = []
        stream = rpcg.WatchStub(etcd_channel).Watch(  # type: ignore[no-untyped-call]
            iter([pb.WatchRequest(create_request=create)]), timeout=15)
        for resp in stream:
            their_events.extend(resp.events)
            done = their_events and their_events[-1].kv.mod_revision >= sm.revision
            if done or resp.canceled:
                break
        stream.cancel()
        watcher = sm.watch_hub.watch(b"\x00", b"\x00", start_revision=since, prev_kv=prev_kv)
        our_events: list[kv_pb2.Event] = []
        while (batch := watcher.poll()) is not None:
            our_events.extend(batch.events)
        assert our_events == their_events, f"seed {seed}, prev_kv={prev_kv}"
