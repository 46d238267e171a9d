"""One revision order across shards (``revorder.py``, ``docs/txn.md``): simulations.

Several *members* (backends with their own clocks) propose to the same shard state
machines, as the members of a cluster propose to the shards' leaders. The checks: every
acknowledged write transaction has a revision of its own; a write acknowledged before
another starts has the lower revision, whatever shards and members; a read answers at or
above every write acknowledged before it began (the read fence); a Range at a past
revision answers the same every time; and the broken variants (shards counting on their
own; a member whose clock is behind with no drift allowed for; reads at the clock with
no fences; a read that waits for intents once) are caught. The workloads run on a
virtual-time loop (:func:`replay`), so a seed replays the same history.
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


class VirtualTime(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when every task waits: the next timer fires
    at once, the clock set to its deadline. The coordinator's pauses and deadlines then
    depend on the seed alone, so a seed replays the same history (a failing one is
    reproducible); it runs no I/O, so a loop with nothing scheduled is a deadlock."""

    def __init__(self) -> None:
        super().__init__()
        self._virtual = 0.0
        real, loop = self._selector, self  # type: ignore[attr-defined]

        class Jump:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def select(self, timeout: float | None = None) -> Any:
                if timeout is None:
                    raise RuntimeError("deadlock: every task waits and no timer is set")
                loop._virtual += timeout
                return real.select(0)

        self._selector = Jump()  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._virtual


def replay(coro: Any, seed: int) -> Any:
    """Run ``coro`` to the end on a :class:`VirtualTime` loop, the module ``random``
    (the coordinator's txn ids and backoffs) seeded with ``seed`` meanwhile."""
    loop = VirtualTime()
    state = random.getstate()
    random.seed(seed)
    try:
        return loop.run_until_complete(coro)
    finally:
        random.setstate(state)
        loop.close()


class Leaders:
    """The shards' leaders, as far as reads are concerned (``MultiRaftHost.fence_reads``):
    a read barrier is a leader answering a read (everything appended is applied here, so
    at its last index), and before a leader appends after answering reads it appends its
    fence, made by ``fencer`` (the member that leads every shard). ``fence=False`` is the
    broken variant: members answer reads at their clock, but no leader fences."""

    def __init__(self, shards: int, fence: bool = True) -> None:
        self.fence = fence
        self.answered = [0] * shards
        self.fenced_at = [0] * shards
        self.fencer: StateMachineBackend | None = None

    def append(self, machines: list[KVStateMachine], shard: int, command: bytes) -> Any:
        if self.fence and self.answered[shard] != self.fenced_at[shard]:
            assert self.fencer is not None
            fence = self.fencer.read_fence()
            if fence is not None:
                machines[shard].apply(fence)
            self.fenced_at[shard] = self.answered[shard]
        return machines[shard].apply(command)


class Member(StateMachineBackend):
    """One member: proposes to the shared shard machines (applied at once, after a yield)
    and stamps with its own clock. With ``leaders``, its reads answer at its clock
    (fenced reads) and its proposals spend 0-3 turns in flight (``delays``) after their
    stamp, and sometimes up to 2 ms more, as a proposal forwarded to a shard's leader
    does."""

    def __init__(self, machines: list[KVStateMachine], clock_ns: Callable[[], int],
                 max_drift_ms: float = 0.0, ordered: bool = True,
                 leaders: Leaders | None = None, delays: random.Random | None = None) -> None:
        super().__init__(machines)
        self.order = (RevisionOrder(len(machines), max_drift_ms, clock_ns=clock_ns)
                      if ordered else None)
        self.leaders = leaders
        self.delays = delays

    @property
    def fenced_reads(self) -> bool:
        return self.leaders is not None and self.order is not None

    def lease_clock(self) -> tuple[int, int]:
        """The loop's clock (virtual under :func:`replay`): the coordinator's deadlines."""
        return int(asyncio.get_running_loop().time() * 1000), 0

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        await asyncio.sleep(0)
        if self.leaders is None:
            return self.machines[shard].apply(command)
        if self.delays is not None:
            for _ in range(self.delays.randrange(4)):
                await asyncio.sleep(0)
            if self.delays.random() < 0.3:  # a slow hop: time passes (virtual under replay)
                await asyncio.sleep(self.delays.random() * 0.002)
        return self.leaders.append(self.machines, shard, command)

    async def read_barrier(self, shard: int = 0) -> None:
        await asyncio.sleep(0)
        if self.leaders is not None:
            self.leaders.answered[shard] += 1

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


async def _workload(ordered: bool, seed: int, leaders: Leaders | None = None,
                    waits_once: bool = False) -> tuple[list[tuple[int, int, int]], list[str]]:
    """16 writers through 3 members on 8 shards: single-shard puts, deletes, multi-shard
    Txns, reads (Ranges and read-only Txns) of one key, two or all, and writes that
    write nothing (a Txn whose compare fails, a DeleteRange of a missing key); returns ``(start, ack, revision)`` of every
    acknowledged write (start/ack: a logical time, one counter for the whole run) and the
    problems found in the reads: a read that started after a write was acknowledged
    answering at a lower revision (with ``leaders``: fenced reads; without, a read
    answers at the revision of the shards it reads, which the check then leaves out),
    and a Range at a read's revision answering differently at the end. ``waits_once``:
    the members' reads run the broken variant ``broken_read_waits_once``."""
    rnd = random.Random(seed)
    machines = shards_of()
    base = tick_clock(1_000_000)
    members = [Member(machines, base, ordered=ordered, leaders=leaders,
                      delays=random.Random(seed * 10 + i)) for i in range(3)]
    for m in members:
        m.broken_read_waits_once = waits_once
    if leaders is not None:
        leaders.fencer = members[0]
    now = 0
    done: list[tuple[int, int, int]] = []
    reads: list[tuple[int, bytes, bytes | None, list[tuple[bytes, bytes, int]]]] = []
    read_times: list[tuple[int, int]] = []
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
            if rnd.random() < 0.3:
                now += 1
                read_start = now
                reader = rnd.choice(members)
                roll = rnd.random()
                if roll < 0.2:  # a write that writes nothing: a Txn whose compare fails
                    k = rnd.choice(keys)
                    t = await reader.txn(pb.TxnRequest(
                        compare=[pb.Compare(key=k, target=pb.Compare.VERSION,
                                            result=pb.Compare.LESS, version=0)],
                        success=[op_put(k, b"never")],
                        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k))]))
                    assert not t.succeeded
                    rev = int(t.header.revision)
                    reads.append((rev, k, None, [(kv.key, kv.value, kv.mod_revision)
                                                 for kv in t.responses[0].response_range.kvs]))
                elif roll < 0.3:  # ... or a DeleteRange of a key never written
                    gone = await reader.delete_range(pb.DeleteRangeRequest(
                        key=b"absent-" + rnd.choice(keys)))
                    assert gone.deleted == 0
                    rev = int(gone.header.revision)
                elif roll < 0.5:  # a read-only Txn of one or two shards' keys
                    ks = rnd.sample(keys, rnd.choice((1, 2)))
                    t = await reader.txn(pb.TxnRequest(success=[
                        pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in ks]))
                    rev = int(t.header.revision)
                    for k, r in zip(ks, t.responses, strict=True):
                        reads.append((rev, k, None, [(kv.key, kv.value, kv.mod_revision)
                                                     for kv in r.response_range.kvs]))
                else:
                    key, end = (b"k", b"l") if rnd.random() < 0.4 else (rnd.choice(keys), None)
                    got = await reader.range(pb.RangeRequest(key=key, range_end=end))
                    rev = int(got.header.revision)
                    reads.append((rev, key, end,
                                  [(kv.key, kv.value, kv.mod_revision) for kv in got.kvs]))
                read_times.append((read_start, rev))

    await asyncio.gather(*(writer() for _ in range(16)))
    for m in members:
        await m.xcoord.drain()
    problems = []
    if leaders is not None:
        for start, rev in read_times:
            before = [r for _s, ack, r in done if ack < start]
            if before and max(before) > rev:
                problems.append(f"a read that started after {max(before)} was acknowledged "
                                f"answered at {rev}")
    for rev, key, end, kvs in reads:
        again = await members[0].range(pb.RangeRequest(key=key, range_end=end, revision=rev))
        if [(kv.key, kv.value, kv.mod_revision) for kv in again.kvs] != kvs:
            problems.append(f"a Range at {rev} changed: {key!r}..{end!r} {kvs} then "
                            f"{[(kv.key, kv.value, kv.mod_revision) for kv in again.kvs]}")
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
def test_every_write_has_its_own_revision_in_real_time_order(seed: int) -> None:
    done, problems = replay(_workload(ordered=True, seed=seed), seed)
    assert len(done) > 16 * 20
    assert order_problems(done) == [] and problems == []


@pytest.mark.parametrize("seed", [1, 2, 3, 13, 15])
def test_a_fenced_read_answers_above_every_write_acknowledged_before_it(seed: int) -> None:
    """A read's revision is the store's, as on one etcd: above every write acknowledged
    before the read started, whatever shard it read, and a Range there later answers
    the same (the leaders' fences keep writes in flight above it)."""
    done, problems = replay(_workload(ordered=True, seed=seed, leaders=Leaders(SHARDS)), seed)
    assert len(done) > 16 * 20
    assert order_problems(done) == [] and problems == []


def test_the_broken_variant_reads_at_the_clock_without_fences_is_caught() -> None:
    found: list[str] = []
    for seed in (1, 2, 3):
        _done, problems = replay(_workload(ordered=True, seed=seed,
                                           leaders=Leaders(SHARDS, fence=False)), seed)
        found += problems
    assert any("changed" in p for p in found), found


def test_the_broken_variant_a_read_waiting_for_intents_once_is_caught() -> None:
    """A one-shard read that waited for an intent must wait again for one prepared
    meanwhile (it raised the shard's revision to its reservation, where its Txn then
    lands): the variant that waits once answers at that revision without the write."""
    found: list[str] = []
    for seed in (2, 13, 15):
        found += replay(_workload(ordered=True, seed=seed, leaders=Leaders(SHARDS),
                                  waits_once=True), seed)[1]
    assert any("changed" in p for p in found), found


def test_a_seed_replays_the_same_history() -> None:
    """Every failure seed is reproducible: two runs of one seed, the same revisions and
    the same problems (here: the broken variant's, so there are some to compare)."""
    runs = [replay(_workload(ordered=True, seed=2, leaders=Leaders(SHARDS, fence=False)), 2)
            for _ in range(2)]
    assert runs[0] == runs[1] and runs[0][1]


def test_the_broken_variant_shards_counting_on_their_own_is_caught() -> None:
    done, _problems = replay(_workload(ordered=False, seed=1), 1)
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


def shape(resp: pb.TxnResponse, top: int | None = None) -> list[Any]:
    """A Txn answer's header revisions relative to its own (``R``): ``"R"``, ``"R-1"``,
    ``0`` (a nested Txn's), nested answers as lists."""
    top = resp.header.revision if top is None else top
    out: list[Any] = []
    for op in resp.responses:
        kind = op.WhichOneof("response")
        part = getattr(op, kind)
        rev = part.header.revision
        name = {top: "R", top - 1: "R-1", 0: 0}.get(rev, rev)
        out.append([name, *shape(part, top)] if kind == "response_txn" else name)
    return out


ETCD_SHAPES = [
    # (ops, the shape etcd 3.4.23 answers: measured, and checked against a live etcd by
    # tests/compat/test_differential_shards.py)
    ("get get put", ["R-1", "R-1", "R"]),
    ("get put get", ["R-1", "R", "R"]),
    ("del-nothing get", ["R", "R"]),
    ("get [get put] get", ["R-1", [0, "R-1", "R"], "R"]),
    ("get [get] get", ["R", [0, "R"], "R"]),
    ("get del get", ["R-1", "R", "R"]),
    ("[put] get", [[0, "R"], "R"]),
]


def _ops(spec: str, get_key: bytes, put_key: bytes) -> list[pb.RequestOp]:
    """``"get [get put] get"``: the ops of a Txn, ``[...]`` a nested Txn."""
    stack: list[list[pb.RequestOp]] = [[]]
    for word in spec.replace("[", "[ ").replace("]", " ]").split():
        if word == "[":
            stack.append([])
        elif word == "]":
            inner = stack.pop()
            stack[-1].append(pb.RequestOp(request_txn=pb.TxnRequest(success=inner)))
        elif word == "get":
            stack[-1].append(pb.RequestOp(request_range=pb.RangeRequest(key=get_key)))
        elif word == "put":
            stack[-1].append(pb.RequestOp(request_put=pb.PutRequest(key=put_key, value=b"v")))
        elif word == "del":
            stack[-1].append(pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(
                key=put_key)))
        else:  # del-nothing
            stack[-1].append(pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(
                key=put_key + b"-none")))
    return stack[0]


@pytest.mark.parametrize("spread", ["one-shard", "two-shards"])
@pytest.mark.parametrize(("ops", "etcd"), ETCD_SHAPES, ids=[c[0] for c in ETCD_SHAPES])
async def test_the_parts_of_a_txn_answer_carry_the_revisions_one_etcd_gives_them(
        ops: str, etcd: list[Any], spread: str) -> None:
    """Fenced reads (a read answers at its clock revision, above an idle shard's own),
    one-shard and two-shard Txns: each part of the answer is at the Txn's revision R
    once a change was made at or before it, at R - 1 before (R when the Txn changes
    nothing), a nested Txn's own header at 0, as one etcd's answer. (Found by
    ``test_differential_shards.py``: the parts of a read or of a write that wrote
    nothing kept an idle shard's revision, those of a merged Txn all said R.)"""
    leaders = Leaders(SHARDS)
    m = Member(shards_of(), tick_clock(1), leaders=leaders)
    leaders.fencer = m
    await m.put(pb.PutRequest(key=key_on(0), value=b"elsewhere"))
    get_key, put_key = key_on(1), key_on(1 if spread == "one-shard" else 2)
    await m.put(pb.PutRequest(key=put_key, value=b"old"))  # something to delete
    await m.put(pb.PutRequest(key=key_on(3), value=b"later"))  # the shards uneven
    got = await m.txn(pb.TxnRequest(success=_ops(ops, get_key, put_key)))
    assert shape(got) == etcd
    assert got.header.revision >= max(int(sm.revision) for sm in m.machines[1:3])
