"""The events of one revision in the Txn's operation order, over several shards.

A multi-shard Txn's events all carry its revision R; one etcd delivers them in the order
its puts and deletes ran (nested Txns in turn, a DeleteRange's keys in key order), in one
response. The merged watch over several shards (``shardwatch.py``) orders them by the
sub-revision each shard's share gave its changes, their operation's place in the whole
Txn (``xtxn.run_share``, ``WriteTxn.retag``), and by key within one operation. Checked
against one unsharded store (``--shards 1``, whose order is etcd's) on fixed Txns that
interleave shards, on random Txns, on a multi-shard DeleteRange and a lease revoke over
several shards, and through a replay from history; the deliberately broken variant that
delivers them in shard order (``MergedWatcher.broken_shard_order``) is caught.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import sharding
from accord.services.kv.backend import StateMachineBackend
from accord.services.kv.shardwatch import MergedWatcher
from accord.services.kv.statemachine import KVStateMachine
from tests.kv.helpers import cmp, op_del, op_get, op_put, op_txn
from tests.kv.test_xshard import SHARDS, Shards, _unique_puts, spread_keys, txns

ALL = (b"\x00", b"\x00")
"""Every key: a watch over every shard."""


class OneShard(Shards):
    """The same in-process backend over one shard (``--shards 1``: etcd's order)."""

    def __init__(self) -> None:
        StateMachineBackend.__init__(self, [KVStateMachine(lease_id_seed=2)])
        self.clock = 1_000_000
        self.stall_after = None
        self.x_sent = 0


@pytest.fixture
def broken_order() -> Iterator[None]:
    MergedWatcher.broken_shard_order = True
    try:
        yield
    finally:
        MergedWatcher.broken_shard_order = False


def on(shard: int, n: int = 1, skip: int = 0) -> list[bytes]:
    """``n`` keys on ``shard`` (after the first ``skip`` there), in key order."""
    keys = [k for k in spread_keys(64) if sharding.shard_of(k, SHARDS) == shard]
    return keys[skip:skip + n]


def outside(shard: int) -> bytes:
    """A key on ``shard`` outside ``k``..``l``."""
    return next(k for i in range(100) if sharding.shard_of(k := b"m%d" % i, SHARDS) == shard)


Event = tuple[int, bytes, bytes]


async def drain(w: Any) -> list[list[Event]]:
    """Every event delivered until the watch runs dry (the backend's floors and
    background commits given their turns), as one list per revision, in delivery order."""
    groups: list[list[Event]] = []
    last = None
    idle = 0
    while idle < 20:
        batch = w.poll()
        if batch is None:
            idle += 1
            await asyncio.sleep(0)
            continue
        idle = 0
        for e in batch.events:
            if e.kv.mod_revision != last:
                groups.append([])
                last = e.kv.mod_revision
            groups[-1].append((int(e.type), e.kv.key, e.kv.value))
    return groups


async def run_both(steps: list[Any], *, replay: bool = False) -> tuple[Any, Any]:
    """Apply ``steps`` (Txn, Put or DeleteRange requests; ``("revoke", keys)``: grant a
    lease, attach ``keys``, revoke it) to one unsharded store and to the sharded one;
    each side's events per revision, from a watch over every key (``replay``: created
    after the steps, from revision 1, so delivered from history)."""
    out = []
    for b in (OneShard(), Shards()):
        w = None if replay else b.watch_hub.watch(*ALL, start_revision=b.revision + 1)
        for step in steps:
            if isinstance(step, pb.TxnRequest):
                await b.txn(step)
            elif isinstance(step, pb.PutRequest):
                await b.put(step)
            elif isinstance(step, pb.DeleteRangeRequest):
                await b.delete_range(step)
            else:
                lease = (await b.lease_grant(pb.LeaseGrantRequest(TTL=60))).ID
                for k in step[1]:
                    await b.put(pb.PutRequest(key=k, value=b"l", lease=lease))
                await b.lease_revoke(pb.LeaseRevokeRequest(ID=lease))
        await b.xcoord.drain()
        if w is None:
            w = b.watch_hub.watch(*ALL, start_revision=1)
        out.append(await drain(w))
    return out[0], out[1]


def interleaved() -> list[Any]:
    """Txns whose operations go back and forth between shards: puts, a nested Txn, a
    DeleteRange over every shard between puts on two shards."""
    a, b_, c, d = on(3)[0], on(1)[0], on(2)[0], on(0)[0]
    a2, b2 = on(3, skip=1)[0], on(1, skip=1)[0]
    return [
        pb.TxnRequest(success=[op_put(a, b"1"), op_put(b_, b"2"), op_put(c, b"3"),
                               op_put(d, b"4"), op_put(a2, b"5"), op_put(b2, b"6")]),
        pb.TxnRequest(compare=[cmp(a, "VALUE", "EQUAL", b"1")],
                      success=[op_put(c, b"7"),
                               op_txn([cmp(d, "VERSION", "EQUAL", 1)],
                                      [op_put(b_, b"8"), op_get(a), op_del(a2)],
                                      [op_put(d, b"no")]),
                               op_put(a, b"9")],
                      failure=[op_put(b2, b"no")]),
        pb.TxnRequest(success=[op_put(outside(3), b"10"), op_del(b"k", b"l"),
                               op_put(outside(1), b"11")]),
    ]


async def test_a_multi_shard_txn_s_events_come_in_its_operation_order() -> None:
    one, many = await run_both(interleaved())
    assert [len(g) for g in many] == [6, 4, 7], many
    assert many == one


async def test_a_replay_from_history_gives_the_same_order() -> None:
    one, many = await run_both(interleaved(), replay=True)
    assert many == one


async def test_a_delete_range_and_a_lease_revoke_over_shards_delete_in_key_order() -> None:
    keys = spread_keys(10)
    steps: list[Any] = [pb.PutRequest(key=k, value=b"v") for k in keys]
    steps.append(pb.DeleteRangeRequest(key=b"k", range_end=b"l"))
    steps.append(("revoke", keys))
    one, many = await run_both(steps)
    assert many == one
    assert [k for _t, k, _v in many[-1]] == sorted(keys)


async def test_the_broken_variant_in_shard_order_is_caught(broken_order: None) -> None:
    one, many = await run_both(interleaved())
    assert sorted(map(sorted, many)) == sorted(map(sorted, one)), "the same events"
    assert many != one, "but not in the Txn's order"


@settings(max_examples=40, deadline=None)
@given(st.lists(txns.filter(_unique_puts), min_size=1, max_size=6))
async def test_random_multi_shard_txns_deliver_events_as_one_store(
        reqs: list[pb.TxnRequest]) -> None:
    one, many = await run_both(list(reqs))
    assert many == one
