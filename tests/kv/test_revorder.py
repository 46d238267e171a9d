"""One revision order across shards (``revorder.py``, ``docs/txn.md``): simulations.

Several *members* (backends with their own clocks) propose to the same shard state
machines, as the members of a cluster propose to the shards' leaders. The checks: every
acknowledged write transaction has a revision of its own; a write acknowledged before
another starts has the lower revision, whatever shards and members; a Range at a past
revision answers the same every time; and the broken variants (shards counting on their
own; a member whose clock is behind with no drift allowed for) are caught.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors, sharding
from accord.services.kv.backend import HeaderInfo, StateMachineBackend
from accord.services.kv.errors import EtcdError
from accord.services.kv.revorder import RevisionOrder, tick_clock
from accord.services.kv.statemachine import KVStateMachine
from tests.kv.helpers import op_put

SHARDS = 8


class Member(StateMachineBackend):
    """One member: proposes to the shared shard machines (applied at once, after a yield)
    and stamps with its own clock."""

    def __init__(self, machines: list[KVStateMachine], clock_ns: Callable[[], int],
                 max_drift_ms: float = 0.0, ordered: bool = True) -> None:
        super().__init__(machines)
        self.order = (RevisionOrder(len(machines), max_drift_ms, clock_ns=clock_ns)
                      if ordered else None)

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        await asyncio.sleep(0)
        return self.machines[shard].apply(command)

    async def read_barrier(self, shard: int = 0) -> None:
        await asyncio.sleep(0)

    def header_info(self) -> HeaderInfo:
        return HeaderInfo(1, 1, 1, 1)


def shards_of(n: int = SHARDS) -> list[KVStateMachine]:
    return [KVStateMachine(lease_id_seed=i + 2, stripe=(n, i)) for i in range(n)]


def key_on(shard: int, i: int = 0) -> bytes:
    """A key held by ``shard`` (of :data:`SHARDS`)."""
    found = 0
    for j in range(100_000):
        k = f"k{j}".encode()
        if sharding.shard_of(k, SHARDS) == shard:
            if found == i:
                return k
            found += 1
    raise AssertionError("no key found")


async def _workload(ordered: bool, seed: int) -> tuple[list[tuple[int, int, int]], list[str]]:
    """16 writers through 3 members on 8 shards: single-shard puts, deletes, multi-shard
    Txns; returns ``(start, ack, revision)`` of every acknowledged write (start/ack: a
    logical time, one counter for the whole run) and the stability problems found by
    reading past revisions again at the end."""
    rnd = random.Random(seed)
    machines = shards_of()
    base = tick_clock(1_000_000)
    members = [Member(machines, base, ordered=ordered) for _ in range(3)]
    now = 0
    done: list[tuple[int, int, int]] = []
    reads: list[tuple[int, list[tuple[bytes, bytes, int]]]] = []
    keys = [key_on(s, i) for s in range(SHARDS) for i in range(3)]

    async def writer() -> None:
        nonlocal now
        for _ in range(25):
            m = rnd.choice(members)
            kind = rnd.random()
            now += 1
            start = now
            if kind < 0.6:
                r: Any = await m.put(pb.PutRequest(key=rnd.choice(keys), value=b"%d" % start))
            elif kind < 0.8:
                r = await m.delete_range(pb.DeleteRangeRequest(key=rnd.choice(keys)))
            else:
                ks = rnd.sample(keys, 3)
                r = await m.txn(pb.TxnRequest(success=[op_put(k, b"t") for k in ks]))
            now += 1
            if not isinstance(r, pb.DeleteRangeResponse) or r.deleted:
                # (a delete of nothing is no write transaction: etcd gives it no revision)
                done.append((start, now, int(r.header.revision)))
            if rnd.random() < 0.2:
                got = await m.range(pb.RangeRequest(key=b"k", range_end=b"l"))
                reads.append((int(got.header.revision),
                              [(kv.key, kv.value, kv.mod_revision) for kv in got.kvs]))

    await asyncio.gather(*(writer() for _ in range(16)))
    for m in members:
        await m.xcoord.drain()
    problems = []
    for rev, kvs in reads:
        again = await members[0].range(pb.RangeRequest(key=b"k", range_end=b"l", revision=rev))
        if [(kv.key, kv.value, kv.mod_revision) for kv in again.kvs] != kvs:
            problems.append(f"a Range at {rev} changed")
    return done, problems


def order_problems(done: list[tuple[int, int, int]]) -> list[str]:
    """Shared revisions, and pairs acknowledged-before-started with a revision not lower."""
    out = []
    revs = [r for _s, _a, r in done]
    if len(set(revs)) != len(revs):
        out.append(f"{len(revs) - len(set(revs))} revisions shared")
    by_ack = sorted(done, key=lambda d: d[1])
    # For each write, the highest revision acknowledged before it started must be lower.
    top, i = 0, 0
    for start, _ack, rev in sorted(done):
        while i < len(by_ack) and by_ack[i][1] < start:
            top = max(top, by_ack[i][2])
            i += 1
        if rev <= top:
            out.append(f"a write started after {top} was acknowledged got {rev}")
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_write_has_its_own_revision_in_real_time_order(seed: int) -> None:
    done, problems = await _workload(ordered=True, seed=seed)
    assert len(done) > 16 * 20
    assert order_problems(done) == [] and problems == []


async def test_the_broken_variant_shards_counting_on_their_own_is_caught() -> None:
    done, _problems = await _workload(ordered=False, seed=1)
    found = order_problems(done)
    assert any("shared" in p for p in found), found
    assert any("acknowledged" in p for p in found), found


async def test_a_member_with_a_slow_clock_keeps_the_order_within_the_drift() -> None:
    def slow() -> int:
        return time.time_ns() - 5_000_000  # 5 ms behind

    for drift_ms, holds in ((5.0, True), (0.0, False)):
        machines = shards_of()
        fast_m = Member(machines, time.time_ns, max_drift_ms=drift_ms)
        slow_m = Member(machines, slow, max_drift_ms=drift_ms)
        first = await fast_m.put(pb.PutRequest(key=key_on(0), value=b"a"))
        second = await slow_m.put(pb.PutRequest(key=key_on(1), value=b"b"))
        # With the drift allowed for, the first answer waited until no clock within it
        # can stamp below; without (the broken setting), the slow member writes lower.
        assert (second.header.revision > first.header.revision) is holds


async def test_revisions_lie_in_their_shards_stripe_and_a_txn_in_its_record_shards() -> None:
    machines = shards_of()
    m = Member(machines, tick_clock(1))
    for s in range(SHARDS):
        r = await m.put(pb.PutRequest(key=key_on(s), value=b"v"))
        assert r.header.revision % SHARDS == s
    ks = [key_on(3), key_on(6)]
    t = await m.txn(pb.TxnRequest(success=[op_put(k, b"x") for k in ks]))
    assert t.header.revision % SHARDS == 3
    for k in ks:
        (kv,) = (await m.range(pb.RangeRequest(key=k))).kvs
        assert kv.mod_revision == t.header.revision


async def test_a_restarted_member_continues_above_what_was_acknowledged() -> None:
    machines = shards_of()
    base = tick_clock(1_000_000)
    m = Member(machines, base)
    last = 0
    for i in range(20):
        last = (await m.put(pb.PutRequest(key=key_on(i % SHARDS), value=b"v"))).header.revision
    # The member restarts: each shard from its snapshot, a fresh order (its clock goes
    # on, but its memory of the last stamp is gone).
    restored = []
    for i, sm in enumerate(machines):
        fresh = KVStateMachine(lease_id_seed=i + 2, stripe=(SHARDS, i))
        fresh.restore(sm.snapshot())
        restored.append(fresh)
    again = Member(restored, base)
    revs = []
    for i in range(20):
        r = await again.put(pb.PutRequest(key=key_on(i % SHARDS, 1), value=b"w"))
        revs.append(r.header.revision)
        assert r.header.revision % SHARDS == i % SHARDS
    assert min(revs) > last and len(set(revs)) == len(revs) and revs == sorted(revs)


def test_a_state_machine_refuses_a_stripe_outside_the_store() -> None:
    with pytest.raises(ValueError):
        KVStateMachine(stripe=(4, 4))
    with pytest.raises(ValueError):
        Member([KVStateMachine(stripe=(4, 1)), KVStateMachine()], tick_clock())


async def test_a_range_on_one_shard_at_another_shards_revision_answers_as_one_etcd() -> None:
    m = Member(shards_of(), tick_clock(1))
    old = await m.put(pb.PutRequest(key=key_on(1), value=b"old"))
    rev = (await m.put(pb.PutRequest(key=key_on(0), value=b"v"))).header.revision
    assert m.machines[1].revision < rev
    got = await m.range(pb.RangeRequest(key=key_on(1), revision=rev))
    assert [kv.value for kv in got.kvs] == [b"old"]
    later = await m.put(pb.PutRequest(key=key_on(1), value=b"new"))
    assert later.header.revision > rev > old.header.revision
    again = await m.range(pb.RangeRequest(key=key_on(1), revision=rev))
    assert [kv.value for kv in again.kvs] == [b"old"]  # the same answer: R stayed closed
    with pytest.raises(EtcdError) as e:
        await m.range(pb.RangeRequest(key=key_on(1), revision=m.revision + 1))
    assert e.value.message == errors.FUTURE_REV.message
    # Serializable (local, possibly stale): the shard's latest, for a revision the store has.
    top = (await m.put(pb.PutRequest(key=key_on(0), value=b"w"))).header.revision
    local = await m.range(pb.RangeRequest(key=key_on(1), revision=top, serializable=True))
    assert [kv.value for kv in local.kvs] == [b"new"] and local.header.revision == top
    with pytest.raises(EtcdError) as e:
        await m.range(pb.RangeRequest(key=key_on(1), revision=top + 1, serializable=True))
    assert e.value.message == errors.FUTURE_REV.message
