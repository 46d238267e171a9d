"""Multi-shard Txns in process (no Raft): atomic, at one revision, recoverable.

The backend applies each command straight to its shard's state machine. A random Txn
workload over keys on different shards gives the answers one unsharded store gives
(revisions renumbered); writes and reads that meet an intent wait for it; and a
coordinator "killed" after each step of the protocol (its next proposal never made)
leaves no partial commit once the recovery pass has run, while the deliberately broken
variant (participants written before the decision) is caught by the same check.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import sharding, xcommands, xtxn
from accord.services.kv.backend import HeaderInfo, StateMachineBackend
from accord.services.kv.errors import EtcdError
from accord.services.kv.intents import ABORTED
from accord.services.kv.revorder import RevisionOrder, tick_clock
from accord.services.kv.statemachine import KVStateMachine
from accord.services.kv.xcoord import TXN_TIMEOUT_MS
from tests.kv.helpers import cmp, op_del, op_get, op_put, op_txn

SHARDS = 4


class Shards(StateMachineBackend):
    """Commands applied at once to their shard; a fake clock; ``stall_after``: the
    coordinator's n-th format-3 proposal (and every later one) never happens."""

    def __init__(self, shards: int = SHARDS) -> None:
        super().__init__([KVStateMachine(lease_id_seed=i + 2) for i in range(shards)])
        self.clock = 1_000_000
        self.order = RevisionOrder(shards, clock_ns=tick_clock()) if shards > 1 else None
        self.stall_after: int | None = None
        self.x_sent = 0

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        if len(command) > 1 and command[1] == xcommands.XFORMAT:
            self.x_sent += 1
            if self.stall_after is not None and self.x_sent > self.stall_after:
                await asyncio.Event().wait()  # the coordinator died before proposing it
        await asyncio.sleep(0)
        return self.machines[shard].apply(command)

    async def read_barrier(self, shard: int = 0) -> None:
        await asyncio.sleep(0)

    def lease_clock(self) -> tuple[int, int]:
        return self.clock, 0

    def header_info(self) -> HeaderInfo:
        return HeaderInfo(1, 1, 1, 1)


def hold_commits(b: Shards) -> asyncio.Event:
    """Make every COMMIT, DECIDE or PREPARE_DECIDE of a multi-shard Txn wait until the
    returned event is set."""
    gate = asyncio.Event()
    real = b.commit

    async def slow_commit(command: bytes, shard: int = 0) -> Any:
        if command[1:2] == bytes([xcommands.XFORMAT]) and xcommands.decode(command)[0] in \
                (xcommands.XKind.COMMIT, xcommands.XKind.DECIDE,
                 xcommands.XKind.PREPARE_DECIDE):
            await gate.wait()
        return await real(command, shard)

    b.commit = slow_commit  # type: ignore[method-assign]
    return gate


def hold_decides(b: Shards) -> asyncio.Event:
    """Make every DECIDE (a participant's commit at the revision the record shard's
    ``PREPARE_DECIDE`` took) wait until the returned event is set."""
    gate = asyncio.Event()
    real = b.commit

    async def held_decide(command: bytes, shard: int = 0) -> Any:
        if command[1:2] == bytes([xcommands.XFORMAT]) and \
                xcommands.decode(command)[0] == xcommands.XKind.DECIDE:
            await gate.wait()
        return await real(command, shard)

    b.commit = held_decide  # type: ignore[method-assign]
    return gate


def log_commits(b: Shards) -> list[list[bytes]]:
    """Record every command ``b`` commits, per shard in log order (the returned lists):
    what a follower's replicas would apply, each shard at its own pace."""
    logs: list[list[bytes]] = [[] for _ in b.machines]
    real = b.commit

    async def logged(command: bytes, shard: int = 0) -> Any:
        logs[shard].append(command)
        return await real(command, shard)

    b.commit = logged  # type: ignore[method-assign]
    return logs


def spread_keys(n: int, shards: int = SHARDS) -> list[bytes]:
    """``n`` plain keys, at least one on every shard."""
    out: list[bytes] = []
    seen: set[int] = set()
    i = 0
    while len(out) < n or len(seen) < shards:
        k = f"k{i}".encode()
        s = sharding.shard_of(k, shards)
        if len(out) < n or s not in seen:
            out.append(k)
            seen.add(s)
        i += 1
    return sorted(out)


KEYS = spread_keys(6)


def _one_key_on_each(b: Shards, shards: tuple[int, ...]) -> list[bytes]:
    """One plain key on each of ``shards``, in shard order."""
    keys = spread_keys(40)
    return [next(k for k in keys if b.shard_of(k) == s) for s in shards]


def normalized(msg: Any) -> Any:
    """A response as a dict with every revision field dropped (the numbering differs
    between one store and several shards; the order and the contents must not)."""
    from google.protobuf.json_format import MessageToDict

    def strip(d: Any) -> Any:
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items()
                    if k not in ("header", "modRevision", "createRevision")}
        if isinstance(d, list):
            return [strip(x) for x in d]
        return d

    return strip(MessageToDict(msg))


def state(read: Any) -> dict[bytes, tuple[bytes, int]]:
    return {kv.key: (kv.value, kv.version) for kv in read.kvs}


# --- a random workload against one unsharded store -------------------------------------------
keys_st = st.sampled_from(KEYS)
values = st.sampled_from([b"a", b"b", b"c"])
compares = st.one_of(
    st.builds(lambda k, v, r: cmp(k, "VALUE", r, v), keys_st, values,
              st.sampled_from(["EQUAL", "NOT_EQUAL", "GREATER", "LESS"])),
    st.builds(lambda k, v, r: cmp(k, "VERSION", r, v), keys_st, st.integers(0, 3),
              st.sampled_from(["EQUAL", "GREATER", "LESS"])),
    st.builds(lambda v: cmp(b"k", "VERSION", "GREATER", v, b"l"), st.integers(0, 1)),
)
plain_ops = st.one_of(
    st.builds(lambda k, v, p: op_put(k, v, prev_kv=p), keys_st, values, st.booleans()),
    st.builds(lambda k, p: op_del(k, prev_kv=p), keys_st, st.booleans()),
    st.builds(lambda p: op_del(b"k", b"l", prev_kv=p), st.booleans()),
    st.builds(op_get, keys_st),
    st.builds(lambda lim: op_get(b"k", b"l", limit=lim), st.integers(0, 3)),
)
ops = st.one_of(
    plain_ops,
    st.builds(lambda c, s, f: op_txn(c, s, f), st.lists(compares, max_size=2),
              st.lists(plain_ops, max_size=2), st.lists(plain_ops, max_size=2)),
)
txns = st.builds(
    lambda c, s, f: pb.TxnRequest(compare=c, success=s, failure=f),
    st.lists(compares, max_size=3), st.lists(ops, max_size=4), st.lists(ops, max_size=3),
)


def _unique_puts(req: pb.TxnRequest) -> bool:
    """etcd refuses a Txn that puts one key twice in a branch; keep such out."""
    try:
        KVStateMachine().validate_txn(req)
    except Exception:
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(st.lists(txns.filter(_unique_puts), min_size=1, max_size=8))
async def test_random_multi_shard_txns_answer_as_one_store(reqs: list[pb.TxnRequest]) -> None:
    one = KVStateMachine()
    many = Shards()
    last = 1
    for req in reqs:
        want = one.apply(KVStateMachine.encode_txn(req)) if not one.is_read_only_txn(req) \
            else one.read_txn(req)
        got = await many.txn(req)
        assert normalized(got) == normalized(want), req
        if not many.sm.is_read_only_txn(req) and len(sharding.shards_of_txn(req, SHARDS)) > 1:
            assert got.header.revision > last
        last = max(last, got.header.revision)
        everything = pb.RangeRequest(key=b"\x00", range_end=b"\x00")
        assert state(await many.range(everything)) == state(one.range(everything))
    assert all(not m.intents for m in many.machines)


class QuietTwins(Shards):
    """Every command applied twice at once: with its answer on the backend's machines,
    and without (``apply(..., answer=False)``, what a member whose client does not wait
    for it runs) on twins of them."""

    def __init__(self) -> None:
        super().__init__()
        self.twins = [KVStateMachine(lease_id_seed=i + 2) for i in range(SHARDS)]
        for twin, m in zip(self.twins, self.machines, strict=True):
            twin.set_stripe(m.stripe)

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        await asyncio.sleep(0)
        with contextlib.suppress(EtcdError):  # a refusal is the answer, not a change
            self.twins[shard].apply(command, answer=False)
        return self.machines[shard].apply(command)


async def _quiet_twins_agree(reqs: list[pb.TxnRequest]) -> bool:
    b = QuietTwins()
    await asyncio.gather(*(b.txn(r) for r in reqs))  # concurrent: conflicts and retries too
    await b.xcoord.drain()
    return all(m.snapshot() == t.snapshot() for m, t in zip(b.machines, b.twins, strict=True))


@settings(max_examples=40, deadline=None)
@given(st.lists(txns.filter(_unique_puts), min_size=1, max_size=8))
async def test_commands_applied_without_their_answers_change_the_state_alike(
        reqs: list[pb.TxnRequest]) -> None:
    assert await _quiet_twins_agree(reqs)


async def test_the_broken_quiet_apply_that_skips_a_shares_writes_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = xtxn.run_share

    def no_writes_unanswered(ex: Any, wt: Any, plan: Any, path: Any, owns: Any,
                             answer: bool = True) -> Any:
        if not answer:
            return None, None  # the broken variant: nothing written where nobody reads
        return real(ex, wt, plan, path, owns, answer)

    monkeypatch.setattr(xtxn, "run_share", no_writes_unanswered)
    keys = spread_keys(2)
    assert not await _quiet_twins_agree([_txn(keys, b"v")])


async def test_a_multi_shard_txn_writes_every_key_at_one_revision() -> None:
    b = Shards()
    k1, k2 = KEYS[0], next(k for k in KEYS if b.shard_of(k) != b.shard_of(KEYS[0]))
    for _ in range(5):
        await b.put(pb.PutRequest(key=k1, value=b"x"))  # k1's shard runs ahead
    resp = await b.txn(pb.TxnRequest(
        compare=[cmp(k1, "VALUE", "EQUAL", b"x"), cmp(k2, "VERSION", "EQUAL", 0)],
        success=[op_put(k1, b"1"), op_put(k2, b"2")]))
    assert resp.succeeded
    rev = resp.header.revision
    for k in (k1, k2):
        (kv,) = (await b.range(pb.RangeRequest(key=k))).kvs
        assert kv.mod_revision == rev
    later = await b.put(pb.PutRequest(key=k2, value=b"3"))
    assert later.header.revision > rev


async def test_a_range_too_large_in_a_committed_txn_fails_the_call_not_the_answer() -> None:
    """A participant's range over the result limit cannot refuse once the decision is
    made: the writes stand, and the client gets ResourceExhausted (as etcd fails a call
    whose response is over its limit), never a response that silently lacks the keys."""
    from accord.services.kv.errors import EtcdError
    from accord.services.kv.limits import Limits

    limits = Limits(max_range_result_bytes=4096)
    b = Shards()
    b.machines = [KVStateMachine(limits=limits, lease_id_seed=i + 2) for i in range(SHARDS)]
    b.sm = b.machines[0]
    b.xcoord.limits = limits
    k1, k2 = KEYS[0], next(k for k in KEYS if b.shard_of(k) != b.shard_of(KEYS[0]))
    big = next(k for k in KEYS if k not in (k1, k2))
    await b.put(pb.PutRequest(key=big, value=b"x" * 8192))
    with pytest.raises(EtcdError) as e:
        await b.txn(pb.TxnRequest(success=[op_put(k1, b"1"), op_put(k2, b"2"), op_get(big)]))
    assert "range result too large" in e.value.message
    await b.xcoord.drain()
    assert (await b.range(pb.RangeRequest(key=k1))).kvs[0].value == b"1"
    assert (await b.range(pb.RangeRequest(key=k2))).kvs[0].value == b"2"
    assert all(not m.intents for m in b.machines)


async def test_a_write_and_a_read_that_meet_an_intent_wait_for_the_decision() -> None:
    b = Shards()
    # k0 on the record shard (which prepares and decides in one entry, after the others);
    # k1 and k2 on participants that hold intents until the commit
    k0, k1, k2 = _one_key_on_each(b, (0, 1, 2))
    gate = hold_commits(b)
    t = asyncio.create_task(b.txn(pb.TxnRequest(
        success=[op_put(k0, b"0"), op_put(k1, b"1"), op_put(k2, b"2")])))
    for _ in range(50):
        await asyncio.sleep(0)
    assert b.machines[1].intents and b.machines[2].intents, "prepared: intents are open"
    put = asyncio.create_task(b.put(pb.PutRequest(key=k1, value=b"after")))
    read = asyncio.create_task(b.range(pb.RangeRequest(key=k2)))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not put.done() and not read.done(), "they wait for the intent"
    gate.set()
    resp = await t
    r = await read
    assert [kv.value for kv in r.kvs] == [b"2"], "the read saw the committed Txn"
    p = await put
    assert p.header.revision > resp.header.revision
    (kv,) = (await b.range(pb.RangeRequest(key=k1))).kvs
    assert kv.value == b"after" and kv.version == 2


async def test_a_watch_on_a_shard_gets_revisions_in_order_around_a_retro_commit() -> None:
    b = Shards()
    k2, k1 = _one_key_on_each(b, (0, 1))  # k1 on the participant that holds an intent
    other = next(k for k in spread_keys(40) if b.shard_of(k) == b.shard_of(k1) and k != k1)
    sm = b.machines[b.shard_of(k1)]
    w = sm.watch_hub.watch(b"\x00", b"\x00")
    gate = hold_commits(b)
    t = asyncio.create_task(b.txn(pb.TxnRequest(success=[op_put(k1, b"1"), op_put(k2, b"2")])))
    for _ in range(50):
        await asyncio.sleep(0)
    await b.put(pb.PutRequest(key=other, value=b"later"))  # above the reserved revision
    assert w.poll() is None, "held back below the open intent"
    gate.set()
    resp = await t
    await b.xcoord.drain()  # the participant's commit runs after the answer
    revs = []
    while (batch := w.poll()) is not None:
        revs.extend(ev.kv.mod_revision for ev in batch.events)
    assert revs == sorted(revs) and revs[0] == resp.header.revision and len(revs) == 2


async def test_open_intents_and_records_survive_a_snapshot() -> None:
    b = Shards()
    k1, k2 = KEYS[0], next(k for k in KEYS if b.shard_of(k) != b.shard_of(KEYS[0]))
    b.stall_after = 2  # both prepares, then the coordinator dies
    t = asyncio.create_task(b.txn(pb.TxnRequest(success=[op_put(k1), op_put(k2)])))
    for _ in range(50):
        await asyncio.sleep(0)
    t.cancel()
    for m in b.machines:
        copy = KVStateMachine()
        copy.restore(m.snapshot())
        assert copy.intents.dump() == m.intents.dump()
        assert copy.snapshot() == m.snapshot()


async def test_a_backup_cut_holds_a_txn_whole_and_writes_in_etcds_layout() -> None:
    """A backup over several shards (``cut_revision``, then each image cut there, then
    etcd's layout): a Txn whose record shard decided while another shard's commit is
    still on its way is waited for, so the backup holds all of it at one revision; the
    shards' transaction records (kept after every multi-shard Txn) leave etcd's layout
    writable."""
    from accord.services.kv import etcdformat

    b = Shards()
    k1, k2 = KEYS[0], next(k for k in KEYS if b.shard_of(k) != b.shard_of(KEYS[0]))
    gate = hold_decides(b)
    resp = await b.txn(pb.TxnRequest(success=[op_put(k1, b"a"), op_put(k2, b"b")]))
    cut = asyncio.create_task(b.cut_revision())
    for _ in range(50):
        await asyncio.sleep(0)
    assert not cut.done(), "the cut did not wait for the Txn's other share"
    gate.set()
    rev = await cut
    assert rev >= resp.header.revision
    images = [KVStateMachine.image_at(m.snapshot(), rev) for m in b.machines]
    assert any(m.intents.records for m in b.machines)  # the records are in the images
    buckets = etcdformat.to_etcd(images)
    _rev, back = etcdformat.from_etcd(buckets, SHARDS, [i + 2 for i in range(SHARDS)])
    found = {}
    for img in back:
        sm = KVStateMachine()
        sm.restore(img)
        for kv in sm.range(pb.RangeRequest(key=b"\x00", range_end=b"\x00")).kvs:
            found[kv.key] = (kv.value, kv.mod_revision)
    assert found == {k1: (b"a", resp.header.revision), k2: (b"b", resp.header.revision)}


async def test_a_backup_cut_below_a_txn_restores_without_any_of_it() -> None:
    """Images cut below a Txn that committed after the cut (its record shard decided, its
    other share still open when captured): restored and recovered, none of it shows, not
    the other shard's share finished from a record whose own writes were cut."""
    b = Shards()
    k1, k2 = KEYS[0], next(k for k in KEYS if b.shard_of(k) != b.shard_of(KEYS[0]))
    gate = hold_decides(b)
    resp = await b.txn(pb.TxnRequest(success=[op_put(k1, b"a"), op_put(k2, b"b")]))
    cut = resp.header.revision - 1
    restored = Shards()
    for m, copy in zip(b.machines, restored.machines, strict=True):
        copy.restore(KVStateMachine.image_at(m.snapshot(), cut))
    assert any(m.intents.intents for m in restored.machines)  # the open share came along
    restored.clock = b.clock + TXN_TIMEOUT_MS + 1
    await restored.resolve_stale_intents()
    assert all(not m.intents.intents for m in restored.machines)
    for k in (k1, k2):
        assert not (await restored.range(pb.RangeRequest(key=k))).kvs, k
    gate.set()
    await b.xcoord.drain()


# --- the coordinator dies between any two steps -----------------------------------------------
def _txn(keys: list[bytes], value: bytes) -> pb.TxnRequest:
    return pb.TxnRequest(compare=[cmp(keys[0], "VERSION", "GREATER", -1)],
                         success=[op_put(k, value) for k in keys])


async def _crash_and_recover(stall_after: int, broken: bool) -> tuple[set[bytes], Shards]:
    b = Shards()
    keys = [k for k in spread_keys(12) if b.shard_of(k) in (0, 1, 2)][:3]
    assert len({b.shard_of(k) for k in keys}) >= 2
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"old"))
    b.xcoord.broken_resolve_first = broken
    b.stall_after = stall_after
    t = asyncio.create_task(b.txn(_txn(keys, b"new")))
    for _ in range(100):
        await asyncio.sleep(0)
    finished = t.done()
    t.cancel()
    await b.xcoord.close()  # the dead coordinator's background commits die with it
    b.stall_after = None
    b.clock += TXN_TIMEOUT_MS + 1  # the dead coordinator's deadline has passed
    await b.resolve_stale_intents()
    assert all(not m.intents for m in b.machines), "every intent is resolved"
    values = set()
    for k in keys:
        (kv,) = (await b.range(pb.RangeRequest(key=k))).kvs
        values.add(kv.value)
    if finished:
        assert values == {b"new"}
    return values, b


@pytest.mark.parametrize("stall_after", range(0, 8))
async def test_a_coordinator_dying_after_any_step_leaves_all_or_nothing(stall_after: int) -> None:
    values, b = await _crash_and_recover(stall_after, broken=False)
    assert len(values) == 1, f"partial commit after {stall_after} steps: {values}"
    # and the keys are free: a new Txn over them commits
    keys = [k for k in spread_keys(12) if b.shard_of(k) in (0, 1, 2)][:3]
    assert (await b.txn(_txn(keys, b"again"))).succeeded


async def test_the_broken_variant_that_resolves_before_the_decision_is_caught() -> None:
    partial = []
    for stall_after in range(0, 8):
        values, _b = await _crash_and_recover(stall_after, broken=True)
        if len(values) > 1:
            partial.append(stall_after)
    assert partial, "writing participants before the decision must show a partial commit"


async def test_a_late_prepare_after_recovery_aborted_the_record_is_refused() -> None:
    b = Shards()
    k1, k2 = KEYS[0], next(k for k in KEYS if b.shard_of(k) != b.shard_of(KEYS[0]))
    record = min(b.shard_of(k1), b.shard_of(k2))
    sm = b.machines[record]
    txn_id = 77
    assert sm.apply(xcommands.encode_abort(txn_id, True, b.clock)).state == ABORTED
    req = pb.TxnRequest(success=[op_put(k1), op_put(k2)]).SerializeToString()
    late = sm.apply(xcommands.encode_prepare(txn_id, sm.revision + 1, record, record, SHARDS,
                                             b.clock + 5000, b.clock, req))
    assert not late.ok and late.reason == "decided" and not sm.intents


async def _bank(readers_ignore_intents: bool, ordered: bool = True) -> tuple[int, list[int]]:
    """A small bank: accounts on different shards, transfers by compare-and-swap Txns
    from many tasks at once, an auditor reading all accounts (one multi-shard range) in
    between; returns the total and every sum the auditor saw. ``ordered=False``: the
    shards count revisions on their own (the layout before ``revorder.py``), where Txns
    reserve revisions below other shards' and the auditor meets open intents often."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    b = Shards()
    if not ordered:
        b.order = None
    if readers_ignore_intents:  # the broken variant: reads do not wait for intents
        async def ignore(shard: int, ranges: Any, rev: int) -> int:
            return 0
        b.wait_intents = ignore  # type: ignore[method-assign]
    accounts = [k for k in spread_keys(8)][:6]
    for k in accounts:
        await b.put(pb.PutRequest(key=k, value=b"100"))
    total = 100 * len(accounts)
    sums: list[int] = []

    async def transfer() -> None:
        for _ in range(15):
            src, dst = rnd.sample(accounts, 2)
            got = await b.range(pb.RangeRequest(key=b"k", range_end=b"l"))
            byk = {kv.key: kv for kv in got.kvs}
            amount = rnd.randint(1, 10)
            s, d = byk[src], byk[dst]
            await b.txn(pb.TxnRequest(
                compare=[cmp(src, "MOD", "EQUAL", s.mod_revision),
                         cmp(dst, "MOD", "EQUAL", d.mod_revision)],
                success=[op_put(src, str(int(s.value) - amount).encode()),
                         op_put(dst, str(int(d.value) + amount).encode())]))

    async def audit() -> None:
        for _ in range(60):
            got = await b.range(pb.RangeRequest(key=b"k", range_end=b"l"))
            sums.append(sum(int(kv.value) for kv in got.kvs if kv.key in accounts))
            await asyncio.sleep(0)

    await asyncio.gather(*(transfer() for _ in range(4)), audit())
    await b.xcoord.drain()
    assert all(not m.intents for m in b.machines)
    return total, sums


@pytest.mark.parametrize("ordered", [True, False])
async def test_concurrent_transfers_keep_the_total(ordered: bool) -> None:
    total, sums = await _bank(readers_ignore_intents=False, ordered=ordered)
    assert sums and all(x == total for x in sums), sums


async def test_the_broken_variant_whose_readers_ignore_intents_is_caught() -> None:
    # One random bank run meets an open intent at an audit about 5 times in 6: up to
    # five runs (each with its own printed seed), so the check misses about once in 10^4.
    for _ in range(5):
        total, sums = await _bank(readers_ignore_intents=True, ordered=False)
        if any(x != total for x in sums):
            return
    raise AssertionError("reads past intents must see a partial transfer")


async def test_a_delete_range_over_shards_deletes_everything_at_one_revision() -> None:
    b = Shards()
    keys = spread_keys(8)
    for i, k in enumerate(keys):
        for _ in range(i % 3 + 1):  # shards at different revisions
            await b.put(pb.PutRequest(key=k, value=b"v"))
    gone = await b.delete_range(pb.DeleteRangeRequest(key=b"k", range_end=b"l", prev_kv=True))
    rev = gone.header.revision
    assert gone.deleted == len(keys) and [kv.key for kv in gone.prev_kvs] == keys
    before = await b.range(pb.RangeRequest(key=b"k", range_end=b"l", revision=rev - 1))
    after = await b.range(pb.RangeRequest(key=b"k", range_end=b"l", revision=rev))
    assert before.count == len(keys) and after.count == 0, "one revision on every shard"
    assert all(not m.intents for m in b.machines)


# --- the revision decided on the record shard (DECIDE, docs/txn.md) ----------------------
class _Ungated(Shards):
    """A store where some member does not apply DECIDE yet (the gate is closed)."""

    decided_commits = False


def _ahead(b: Shards, shard: int, by_us: int) -> int:
    """Floor ``shard`` ``by_us`` microseconds of stamps ahead of the clock, so that a Txn
    stamped now reserves a higher revision there than on the others; returns the floor."""
    floor = (b.order.now_us() + by_us) * b.shards if b.order else 0
    b.machines[shard].apply(KVStateMachine.encode_floor(floor))
    return floor


async def test_participants_that_reserved_different_revisions_commit_at_one_without_reserve() -> None:
    b = Shards()
    keys = _one_key_on_each(b, (0, 1, 2))
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"old"))
    floors = [_ahead(b, 1, 500), _ahead(b, 2, 900)]
    resp = await b.txn(_txn(keys, b"new"))
    rev = resp.header.revision
    assert resp.succeeded and rev > max(floors) and rev % SHARDS == 0, "the record's stripe"
    assert b.xcoord.stats["reserve_rounds"] == 0, "no RESERVE round on the ordered path"
    for k in keys:
        (kv,) = (await b.range(pb.RangeRequest(key=k))).kvs
        assert (kv.value, kv.mod_revision) == (b"new", rev)
    assert all(m.revision >= rev for m in b.machines[:3]), "each participant moved up to it"
    later = await b.put(pb.PutRequest(key=keys[2], value=b"later"))
    assert later.header.revision > rev


async def test_without_the_gate_participants_agree_through_reserve() -> None:
    """Before every member applies DECIDE, the ordered path keeps the RESERVE rounds."""
    b = _Ungated()
    keys = _one_key_on_each(b, (0, 1, 2))
    sent: list[int] = []
    real = b.commit

    async def spy(command: bytes, shard: int = 0) -> Any:
        if command[1:2] == bytes([xcommands.XFORMAT]):
            sent.append(xcommands.decode(command)[0])
        return await real(command, shard)

    b.commit = spy  # type: ignore[method-assign]
    _ahead(b, 1, 500)
    resp = await b.txn(_txn(keys, b"new"))
    assert resp.succeeded and b.xcoord.stats["reserve_rounds"] == 1
    assert xcommands.XKind.RESERVE in sent and xcommands.XKind.DECIDE not in sent
    revs = {(await b.range(pb.RangeRequest(key=k))).kvs[0].mod_revision for k in keys}
    assert revs == {resp.header.revision}


async def _write_on_record_before_decide(broken: bool) -> tuple[int, int]:
    """A Txn whose record shard, between its prepare and its decision, writes the very
    revision the other participant reserved; returns (that write's revision, the Txn's)."""
    b = Shards()
    keys = _one_key_on_each(b, (0, 1))
    other = next(k for k in spread_keys(40) if b.shard_of(k) == 0 and k not in keys)
    b.machines[0].broken_decide_at_want = broken
    _ahead(b, 1, 500)
    wrote: list[int] = []
    real = b.commit

    async def meddle(command: bytes, shard: int = 0) -> Any:
        if (command[1:2] == bytes([xcommands.XFORMAT]) and shard == 0 and not wrote
                and xcommands.decode(command)[0] == xcommands.XKind.PREPARE_DECIDE):
            want = xcommands.decode(command)[8]
            put = KVStateMachine.encode_put(pb.PutRequest(key=other, value=b"x"),
                                            min_revision=-(want - want % SHARDS))
            wrote.append(b.machines[0].apply(put).header.revision)
        return await real(command, shard)

    b.commit = meddle  # type: ignore[method-assign]
    resp = await b.txn(_txn(keys, b"new"))
    assert resp.succeeded and wrote
    return wrote[0], resp.header.revision


async def test_the_decision_takes_a_revision_its_shard_has_not_written() -> None:
    put_rev, txn_rev = await _write_on_record_before_decide(broken=False)
    assert txn_rev > put_rev


async def test_the_broken_decision_at_the_wanted_revision_is_caught() -> None:
    put_rev, txn_rev = await _write_on_record_before_decide(broken=True)
    assert txn_rev == put_rev, "the broken decision shares a revision with a Put"


async def _crash_ahead(stall_after: int, broken: bool) -> tuple[set[bytes], set[int]]:
    """The coordinator dies after ``stall_after`` proposals of a Txn whose participants
    reserved different revisions, every shard restarts from its snapshot; returns the
    values and mod revisions of its keys after the recovery pass (``broken``: resolvers
    ignore the record's decided revision)."""
    b = Shards()
    keys = _one_key_on_each(b, (0, 1, 2))
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"old"))
    _ahead(b, 1, 500)
    _ahead(b, 2, 900)
    b.xcoord.broken_resolve_reserved = broken
    b.stall_after = stall_after
    t = asyncio.create_task(b.txn(_txn(keys, b"new")))
    for _ in range(100):
        await asyncio.sleep(0)
    t.cancel()
    await b.xcoord.close()
    for m in b.machines:  # every shard restarts from its snapshot: records, intents
        m.restore(m.snapshot())
    b.stall_after = None
    b.clock += TXN_TIMEOUT_MS + 1
    await b.resolve_stale_intents()
    assert all(not m.intents for m in b.machines), "every intent is resolved"
    values, mods = set(), set()
    for k in keys:
        (kv,) = (await b.range(pb.RangeRequest(key=k))).kvs
        values.add(kv.value)
        mods.add(kv.mod_revision)
    return values, mods


@pytest.mark.parametrize("stall_after", range(0, 7))
async def test_a_coordinator_dying_after_a_decision_at_a_new_revision_leaves_one_revision(
        stall_after: int) -> None:
    values, mods = await _crash_ahead(stall_after, broken=False)
    assert len(values) == 1, f"partial commit after {stall_after} steps: {values}"
    if values == {b"new"}:
        assert len(mods) == 1, f"committed at several revisions: {mods}"


async def test_the_broken_resolver_that_commits_at_the_reserved_revision_is_caught() -> None:
    split = [s for s in range(0, 7) if len((await _crash_ahead(s, broken=True))[1]) > 1]
    assert split, "resolving at each participant's own reserved revision must split the Txn"


async def _read_after_the_answer(broken: bool) -> bytes:
    """A Txn decided above the revision its other participant reserved is answered
    while that participant's commit is still held; a multi-shard read of that key begun
    after the answer (at a revision it chose, below the Txn's) returns the key's value."""
    b = Shards()
    b.broken_read_below_decided = broken
    k0, k1, k2 = _one_key_on_each(b, (0, 1, 2))
    for k in (k0, k1, k2):
        await b.put(pb.PutRequest(key=k, value=b"old"))
    _ahead(b, 0, 500)  # the record shard is ahead: the decision lands above shard 1's
    gate = asyncio.Event()
    real = b.commit

    async def slow(command: bytes, shard: int = 0) -> Any:
        if shard == 1 and command[1:2] == bytes([xcommands.XFORMAT]) and \
                xcommands.decode(command)[0] == xcommands.XKind.DECIDE:
            await gate.wait()
        return await real(command, shard)

    b.commit = slow  # type: ignore[method-assign]
    resp = await b.txn(pb.TxnRequest(success=[op_put(k0, b"new"), op_put(k1, b"new")]))
    assert resp.succeeded and b.machines[1].intents, "answered, shard 1's commit pending"
    reserved = next(iter(b.machines[1].intents.intents.values())).rev
    assert reserved < resp.header.revision
    read = asyncio.create_task(b.txn(pb.TxnRequest(success=[op_get(k1), op_get(k2)])))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not read.done(), "the read waits for the intent"
    gate.set()
    got = await read
    (kv,) = got.responses[0].response_range.kvs
    return bytes(kv.value)


async def test_a_read_that_waited_for_a_txn_decided_above_it_reads_again_there() -> None:
    assert await _read_after_the_answer(broken=False) == b"new"


async def test_the_broken_read_at_its_first_revision_is_caught() -> None:
    assert await _read_after_the_answer(broken=True) == b"old", "misses an answered Txn"


@pytest.mark.parametrize("missing_on", [0, 1])
async def test_etcds_check_along_the_branch_fails_the_txn_on_either_shard(missing_on: int) -> None:
    """A put with ignore_value of a missing key fails the Txn with etcd's error, whether
    the key lies on the record shard (checked in its prepare-decide) or on the other
    (checked in that prepare); nothing is written and no intent stays."""
    b = Shards()
    keys = _one_key_on_each(b, (0, 1))
    present = keys[1 - missing_on]
    await b.put(pb.PutRequest(key=present, value=b"old"))
    req = pb.TxnRequest(success=[op_put(keys[missing_on], b"", ignore_value=True),
                                 op_put(present, b"new")])
    one = KVStateMachine()
    one.apply(KVStateMachine.encode_put(pb.PutRequest(key=present, value=b"old")))
    with pytest.raises(EtcdError) as want:
        one.apply(KVStateMachine.encode_txn(req))
    with pytest.raises(EtcdError) as got:
        await b.txn(req)
    assert got.value.message == want.value.message
    assert all(not m.intents for m in b.machines)
    (kv,) = (await b.range(pb.RangeRequest(key=present))).kvs
    assert kv.value == b"old"
    assert not (await b.range(pb.RangeRequest(key=keys[missing_on]))).kvs


async def test_a_late_prepare_decide_after_recovery_aborted_the_record_is_refused() -> None:
    b = Shards()
    k0, k1 = _one_key_on_each(b, (0, 1))
    sm = b.machines[0]
    txn_id = 78
    assert sm.apply(xcommands.encode_abort(txn_id, True, b.clock)).state == ABORTED
    rev = sm.revision
    req = pb.TxnRequest(success=[op_put(k0), op_put(k1)]).SerializeToString()
    late = sm.apply(xcommands.encode_prepare_decide(
        txn_id, -(rev + SHARDS), 0, SHARDS, b.clock + 5000, b.clock, req, rev + SHARDS,
        [], {}, 0))
    assert isinstance(late, xcommands.Prepared) and not late.ok and late.reason == "decided"
    assert sm.revision == rev and not (await b.range(pb.RangeRequest(key=k0))).kvs


@pytest.mark.parametrize("body", [
    [xcommands.XFORMAT, {"kind": 1}, 5],  # kind not a number (unhashable)
    [xcommands.XFORMAT, True, 1, -1, 0, 0, 8, 0, 0, b""],  # kind a boolean, a prepare's size
    [xcommands.XFORMAT, 99, 1],  # no such kind
    [xcommands.XFORMAT, int(xcommands.XKind.PREPARE), 1, -1],  # a prepare's fields short
])
def test_malformed_cross_shard_commands_are_refused_and_change_nothing(body: list[Any]) -> None:
    sm = KVStateMachine()
    before = sm.snapshot()
    with pytest.raises(EtcdError) as e:
        sm.apply(msgpack.packb(body, use_bin_type=True))
    assert "malformed KV command" in e.value.message
    assert sm.snapshot() == before
    assert not sm.intents.intents


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("compacted", [False, True])
async def test_a_range_at_a_negative_revision_is_checked_as_one_etcd_checks_it(
        read_only: bool, compacted: bool) -> None:
    """etcd refuses a Txn's range below the store's first revision, its last compaction
    or -1 if there was none: on a store never compacted a range at revision -1 is read
    (as the latest) and one at -2 is "compacted"; after a compaction both are. A Txn over
    two shards, writing or read-only, answers each as a Txn on one store does (real
    etcd 3.4's answers, measured: the same)."""
    b = Shards()
    keys = _one_key_on_each(b, (0, 1))
    one = KVStateMachine()
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"v"))
        one.apply(KVStateMachine.encode_put(pb.PutRequest(key=k, value=b"v")))
    if compacted:
        await b.compact(pb.CompactionRequest(revision=b.machines[0].revision))
        one.apply(KVStateMachine.encode_compact(pb.CompactionRequest(revision=one.revision)))
    for rev in (-1, -2):
        first = op_get(keys[0]) if read_only else op_put(keys[0], b"w")
        req = pb.TxnRequest(success=[first, pb.RequestOp(
            request_range=pb.RangeRequest(key=keys[1], revision=rev))])
        try:
            want: Any = normalized(one.apply(KVStateMachine.encode_txn(req)))
        except EtcdError as e:
            want = e.message
        try:
            got: Any = normalized(await b.txn(req))
        except EtcdError as e:
            got = e.message
        assert got == want, (rev, compacted, read_only)
        assert (want == "etcdserver: mvcc: required revision has been compacted") == (
            rev == -2 or compacted), (rev, compacted, want)
    await b.xcoord.drain()
    assert all(not m.intents for m in b.machines)


async def test_a_one_shard_txn_reads_at_a_revision_another_shard_made() -> None:
    """Revisions are the store's, not a shard's: a one-shard Txn (read-only, served as a
    read, or writing, applied on its shard) may range at a revision another shard made,
    above its own shard's latest, and reads its shard's state there, as one etcd reads
    any revision up to its current one; above every revision of the store it is still
    etcd's future-revision error."""
    b = Shards()
    k0, k1 = _one_key_on_each(b, (0, 1))
    await b.put(pb.PutRequest(key=k0, value=b"old"))
    made = (await b.put(pb.PutRequest(key=k1, value=b"other"))).header.revision
    assert b.machines[0].revision < made

    def at(rev: int, *writes: pb.RequestOp) -> pb.TxnRequest:
        return pb.TxnRequest(success=[*writes, pb.RequestOp(
            request_range=pb.RangeRequest(key=k0, revision=rev))])

    read = await b.txn(at(made))
    assert [kv.value for kv in read.responses[0].response_range.kvs] == [b"old"]
    wrote = await b.txn(at(made, op_put(k0, b"new")))
    assert [kv.value for kv in wrote.responses[1].response_range.kvs] == [b"old"]
    assert wrote.header.revision > made
    for req in (at(wrote.header.revision + 10**9), at(wrote.header.revision + 10**9,
                                                       op_put(k0, b"newer"))):
        with pytest.raises(EtcdError, match="future revision"):
            await b.txn(req)
    (kv,) = (await b.range(pb.RangeRequest(key=k0))).kvs
    assert kv.value == b"new"


def _both(r: pb.RangeResponse, keys: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    values = {kv.key: kv.value for kv in r.kvs}
    return values.get(keys[0], b""), values.get(keys[1], b"")


async def _serializable_after_the_answer(broken: bool) -> tuple[tuple[bytes, bytes], ...]:
    """A two-shard Txn answered once the record shard decided, its other participant's
    DECIDE held (as while it is in flight): what a serializable read over both shards
    shows then, and once the DECIDE applied."""
    b = Shards()
    b.broken_serializable_parts = broken
    keys = (k0, k1) = tuple(_one_key_on_each(b, (0, 1)))
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"old"))
    gate = hold_decides(b)
    answer = await b.txn(pb.TxnRequest(success=[op_put(k0, b"new"), op_put(k1, b"new")]))
    assert b.machines[1].intents, "the participant's DECIDE is still held"
    every = pb.RangeRequest(key=b"k", range_end=b"l", serializable=True)
    during = await b.range(every)
    assert broken or during.header.revision < answer.header.revision
    gate.set()
    for _ in range(50):
        await asyncio.sleep(0)
    assert not b.machines[1].intents
    return _both(during, keys), _both(await b.range(every), keys)


async def test_a_serializable_read_over_shards_never_shows_part_of_a_txn() -> None:
    """etcd's serializable read may be stale but shows one revision of the store: a
    multi-shard Txn whole or not at all. While a participant still holds the Txn's
    intent (its DECIDE in flight) the read answers below the intent's revision; after
    it, at the Txn."""
    assert await _serializable_after_the_answer(False) == ((b"old", b"old"), (b"new", b"new"))


async def test_the_broken_serializable_read_at_the_highest_revision_is_caught() -> None:
    during, _after = await _serializable_after_the_answer(True)
    assert during == (b"new", b"old"), "part of the Txn shown"


async def _lagging_replica(broken: bool) -> list[tuple[bytes, bytes]]:
    """The replicas of one member apply each shard's log at their own pace: a follower
    whose record-shard replica applied a two-shard Txn's decision while its other
    participant's replica has not yet applied the Txn's prepare (or its DECIDE). What a
    serializable read over both shards shows on that follower at each point."""
    leader = Shards()
    keys = (k0, k1) = tuple(_one_key_on_each(leader, (0, 1)))
    logs = log_commits(leader)
    for k in keys:
        await leader.put(pb.PutRequest(key=k, value=b"old"))
    before = [len(log) for log in logs]
    await leader.txn(pb.TxnRequest(success=[op_put(k0, b"new"), op_put(k1, b"new")]))
    for _ in range(50):
        await asyncio.sleep(0)
    assert [len(log) - n for log, n in zip(logs, before, strict=False)][:2] == [1, 2], \
        "the record shard's PREPARE_DECIDE; the participant's PREPARE and DECIDE"
    follower = Shards()
    follower.broken_serializable_parts = broken
    every = pb.RangeRequest(key=b"k", range_end=b"l", serializable=True)
    seen = []
    for shard, upto in ((0, before[0]), (1, before[1])):
        for command in logs[shard][:upto]:
            follower.machines[shard].apply(command)
    follower.machines[0].apply(logs[0][before[0]])  # the decision, before any of shard 1's
    seen.append(_both(await follower.range(every), keys))
    at = pb.RangeRequest()
    at.CopyFrom(every)
    at.revision = follower.machines[0].revision  # the Txn's, named by the client
    seen.append(_both(await follower.range(at), keys))
    follower.machines[1].apply(logs[1][before[1]])  # the prepare: an intent
    seen.append(_both(await follower.range(every), keys))
    follower.machines[1].apply(logs[1][before[1] + 1])  # the DECIDE
    seen.append(_both(await follower.range(every), keys))
    return seen


async def test_a_serializable_read_on_a_lagging_replica_never_shows_part_of_a_txn() -> None:
    assert await _lagging_replica(False) == [(b"old", b"old")] * 3 + [(b"new", b"new")]


async def test_the_broken_serializable_read_on_a_lagging_replica_is_caught() -> None:
    assert (b"new", b"old") in await _lagging_replica(True)


async def test_a_serializable_read_at_a_given_revision_waits_for_the_txn_there() -> None:
    """At a revision the client names, a serializable read over shards cannot answer
    below it: it waits out the intents at or below it (as a linearizable read does,
    without the barrier), then shows the Txn whole."""
    b = Shards()
    keys = (k0, k1) = tuple(_one_key_on_each(b, (0, 1)))
    for k in keys:
        await b.put(pb.PutRequest(key=k, value=b"old"))
    gate = hold_decides(b)
    answer = await b.txn(pb.TxnRequest(success=[op_put(k0, b"new"), op_put(k1, b"new")]))
    read = asyncio.create_task(b.range(pb.RangeRequest(
        key=b"k", range_end=b"l", serializable=True, revision=answer.header.revision)))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not read.done(), "it waits for the participant's share"
    gate.set()
    assert _both(await read, keys) == (b"new", b"new")
