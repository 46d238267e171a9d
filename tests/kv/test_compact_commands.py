"""The compact (format 2) Put and batch-Txn commands answer exactly what format 1 answers.

Two state machines get the same requests, one through ``KVStateMachine.encode_put`` /
``encode_txn`` (the compact form where it applies) and one through the format-1
envelope that carries the serialized request (what logs written before hold): every
response or error, the revisions, the histories, the revision log that watchers replay,
and the leases' keys must be the same. The backend's fast path for batches of puts is
checked against the generic path the same way, errors included.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors, sharding
from accord.services.kv.backend import HeaderInfo, StateMachineBackend
from accord.services.kv.codec import Kind, encode
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.ranges import KeyRange
from accord.services.kv.revorder import RevisionOrder, tick_clock
from accord.services.kv.statemachine import COMPACT_FORMAT, KVStateMachine, puts_response
from tests.kv.helpers import op_del, op_put

SM = KVStateMachine
LIMITS = Limits(max_key_bytes=6, max_value_bytes=12, max_request_bytes=160, max_txn_ops=4)
GOOD_KEYS = [b"a", b"b", b"c", b"/x/y/1", b"/x/y/2", b"/x/z/1"]
KEYS = GOOD_KEYS * 4 + [b"", b"toolong!"]  # mostly valid, so most requests get applied
VALUES = [b"", b"v", b"value", b"w" * 12] * 4 + [b"w" * 13]


def old_put(req: pb.PutRequest) -> bytes:
    """A Put in format 1."""
    return encode(Kind.PUT, req.SerializeToString())


def old_txn(req: pb.TxnRequest) -> bytes:
    """A Txn in format 1."""
    return encode(Kind.TXN, req.SerializeToString())


def outcome(sm: SM, command: bytes) -> Any:
    """The response, or the error's code and message."""
    try:
        return sm.apply(command)
    except EtcdError as e:
        return (e.code, e.message)


def state(sm: SM) -> Any:
    """Everything a replica's state is compared on."""
    store = sm.store
    replay, _ = store.changes_since(1, KeyRange.of(b"\x00", b"\x00"), 1 << 30)
    leases = {i: sorted(ls.keys) for i, ls in sm.leases.leases.items()}
    return store.rev, dict(store.hist), list(store.keys), replay, leases, sm.hash_kv()


puts = st.builds(
    lambda k, v, lease, flags: pb.PutRequest(
        key=k, value=v, lease=lease, prev_kv=bool(flags & 1), ignore_value=bool(flags & 2),
        ignore_lease=bool(flags & 4)),
    st.sampled_from(KEYS), st.sampled_from(VALUES), st.sampled_from([0, 0, 7, 99]),
    st.integers(0, 7),
)
plain_puts = st.builds(
    lambda k, v, lease: pb.PutRequest(key=k, value=v, lease=lease),
    st.sampled_from(KEYS), st.sampled_from(VALUES), st.sampled_from([0, 0, 7, 99]),
)
batches = st.builds(
    lambda ps: pb.TxnRequest(success=[pb.RequestOp(request_put=p) for p in ps]),
    st.lists(plain_puts, min_size=1, max_size=6),
)
others = st.sampled_from([
    pb.TxnRequest(success=[op_del(b"a", b"\x00"), op_put(b"b")]),
    pb.TxnRequest(success=[op_put(b"a")], failure=[op_put(b"b")]),
    pb.TxnRequest(success=[op_put(b"c", prev_kv=True)]),
])
requests = st.lists(st.one_of(puts, batches, others), min_size=1, max_size=25)


@given(requests)
def test_compact_commands_match_format_1(reqs: list[pb.PutRequest | pb.TxnRequest]) -> None:
    new, old = SM(limits=LIMITS), SM(limits=LIMITS)
    watchers = []
    for sm in (new, old):
        sm.apply(SM.encode_lease_grant(pb.LeaseGrantRequest(ID=7, TTL=60), 1_000))
        watchers.append(sm.watch_hub.watch(b"\x00", b"\x00", 0, True))
    for req in reqs:
        if isinstance(req, pb.PutRequest):
            a, b = outcome(new, SM.encode_put(req)), outcome(old, old_put(req))
        else:
            a, b = outcome(new, SM.encode_txn(req)), outcome(old, old_txn(req))
        assert a == b, req
        assert state(new) == state(old)
        events = [w.poll() for w in watchers]  # what watchers see, prev_kv included
        assert [(e.revision, list(e.events)) if e else None for e in events] == [
            (e.revision, list(e.events)) if e else None for e in reversed(events)]


def test_batches_and_puts_are_encoded_compactly_and_other_txns_are_not() -> None:
    batch = pb.TxnRequest(success=[op_put(b"a"), op_put(b"b", lease=3)])
    assert SM.plain_puts(batch) == [b"a", b"v", 0, b"b", b"v", 3]
    body = msgpack.unpackb(SM.encode_txn(batch, min_revision=9))
    assert body == [COMPACT_FORMAT, Kind.TXN, 9, batch.ByteSize(), [b"a", b"v", 0, b"b", b"v", 3]]
    put = pb.PutRequest(key=b"k", value=b"x", lease=5, prev_kv=True, ignore_lease=False)
    assert msgpack.unpackb(SM.encode_put(put)) == [
        COMPACT_FORMAT, Kind.PUT, 0, put.ByteSize(), b"k", b"x", 5, 1]
    for not_plain in (
        pb.TxnRequest(),
        pb.TxnRequest(compare=[pb.Compare(key=b"a")], success=[op_put(b"a")]),
        pb.TxnRequest(success=[op_put(b"a")], failure=[op_put(b"b")]),
        pb.TxnRequest(success=[op_put(b"a"), op_del(b"b")]),
        pb.TxnRequest(success=[op_put(b"a", ignore_value=True)]),
    ):
        assert SM.plain_puts(not_plain) is None
        assert msgpack.unpackb(SM.encode_txn(not_plain))[0] == 1


def test_format_1_log_still_applies_and_matches() -> None:
    """A log written before (format 1) replays to the same state as the compact one."""
    reqs = [pb.PutRequest(key=b"k%d" % i, value=b"v%d" % i) for i in range(20)]
    batch = pb.TxnRequest(success=[op_put(b"b%d" % i) for i in range(50)])
    new, old = SM(), SM()
    for r in reqs:
        assert new.apply(SM.encode_put(r)) == old.apply(old_put(r))
    assert new.apply(SM.encode_txn(batch)) == old.apply(old_txn(batch))
    assert state(new) == state(old)
    assert new.snapshot() == old.snapshot()


@pytest.mark.parametrize("body", [
    [COMPACT_FORMAT, Kind.PUT, 0, 10, b"k", b"v", 0],  # a field short
    [COMPACT_FORMAT, Kind.PUT, 0, 10, "k", b"v", 0, 0],  # key not bytes
    [COMPACT_FORMAT, Kind.PUT, -1 + 0.5, 10, b"k", b"v", 0, 0],  # revision not an int
    [COMPACT_FORMAT, Kind.TXN, 0, 10, []],  # no puts
    [COMPACT_FORMAT, Kind.TXN, 0, 10, [b"k", b"v"]],  # not triples
    [COMPACT_FORMAT, Kind.TXN, 0, 10, [b"k", b"v", True]],  # lease not an int
    [COMPACT_FORMAT, Kind.TXN, 0, 10, [b"k", None, 0]],  # value not bytes
    [COMPACT_FORMAT, Kind.LEASE_GRANT, 0, 10, b""],  # no compact form of that kind
    [COMPACT_FORMAT, True, 0, 10, b"k", b"v", 0, 0],  # kind not an int
])
def test_malformed_compact_commands_are_refused_and_change_nothing(body: list[Any]) -> None:
    sm = SM()
    sm.apply(SM.encode_put(pb.PutRequest(key=b"k", value=b"old")))
    before = state(sm)
    with pytest.raises(EtcdError) as e:
        sm.apply(msgpack.packb(body, use_bin_type=True))
    assert e.value.code == errors.bad_request("x").code
    assert "malformed KV command" in e.value.message
    assert state(sm) == before


def test_truncated_compact_command_is_refused() -> None:
    sm = SM()
    data = SM.encode_txn(pb.TxnRequest(success=[op_put(b"a"), op_put(b"b")]))
    with pytest.raises(EtcdError, match="malformed KV command"):
        sm.apply(data[:-3])
    assert sm.revision == 1


@pytest.mark.parametrize("revision", [1, 127, 128, 300, 1 << 31, 1 << 62])
@pytest.mark.parametrize("n", [1, 2, 128])
def test_puts_response_matches_a_response_built_field_by_field(revision: int, n: int) -> None:
    want = pb.TxnResponse(succeeded=True)
    want.header.revision = revision
    for _ in range(n):
        want.responses.add().response_put.header.revision = revision
    assert puts_response(revision, n) == want
    assert puts_response(revision, n).SerializeToString() == want.SerializeToString()


def test_a_key_deleted_and_put_in_one_txn_is_logged_once_with_both_changes() -> None:
    sm = SM()
    sm.apply(SM.encode_put(pb.PutRequest(key=b"a", value=b"1")))
    sm.apply(SM.encode_txn(pb.TxnRequest(success=[op_del(b"a", b"\x00"), op_put(b"a")])))
    replay, _ = sm.store.changes_since(3, KeyRange.of(b"a", b""), 100)
    assert [(rev, [(k, r[4]) for k, r, _p in batch]) for rev, batch in replay] == [
        (3, [(b"a", None), (b"a", b"v")])]


# --- the backend's fast path for batches -----------------------------------------------------
class DirectBackend(StateMachineBackend):
    """Applies every command at once to its shard's machine (revisions from a logical
    clock, so that two backends fed one history agree on them)."""

    def __init__(self, machines: Any) -> None:
        super().__init__(machines)
        if self.shards > 1:
            self.order = RevisionOrder(self.shards, clock_ns=tick_clock())

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        return self.machines[shard].apply(command)

    async def read_barrier(self, shard: int = 0) -> None:
        return None

    def header_info(self) -> HeaderInfo:
        return HeaderInfo(1, 1, 1, 1)


async def generic_txn(b: DirectBackend, req: pb.TxnRequest) -> Any:
    """``StateMachineBackend.txn``'s generic path, with a format-1 command."""
    b.sm.validate_txn(req)
    shard = 0
    if b.shards > 1:
        touched = sharding.shards_of_txn(req, b.shards)
        if len(touched) > 1:
            return await b.xcoord.txn(req, list(touched))
        shard = next(iter(touched), 0)
    # (proposed again while a cross-shard Txn's intent holds a key, as the real path does)
    resp = await b.commit_free(
        encode(Kind.TXN, req.SerializeToString(), min_revision=b.stamp()), shard)
    await b.settle(resp.header.revision)
    return resp


@given(st.lists(batches, min_size=1, max_size=10), st.sampled_from([1, 4]))
async def test_backend_batches_match_the_generic_path(
    reqs: list[pb.TxnRequest], shards: int
) -> None:
    fast = DirectBackend([SM(limits=LIMITS) for _ in range(shards)])
    slow = DirectBackend([SM(limits=LIMITS) for _ in range(shards)])
    for req in reqs:
        got: list[Any] = []
        for run in (fast.txn(req), generic_txn(slow, req)):
            try:
                got.append(await run)
            except EtcdError as e:
                got.append((e.code, e.message))
        assert got[0] == got[1], req
    await fast.xcoord.drain()
    await slow.xcoord.drain()
    for m_fast, m_slow in zip(fast.machines, slow.machines, strict=True):
        assert state(m_fast) == state(m_slow)


async def test_backend_batch_across_shards_commits_at_one_revision_on_each() -> None:
    b = DirectBackend([SM() for _ in range(4)])
    keys = [b"/a/b/1", b"/c/d/1", b"/e/f/1", b"/g/h/1"]
    touched = {sharding.shard_of(k, 4) for k in keys}
    assert len(touched) > 1
    resp = await b.txn(pb.TxnRequest(success=[op_put(k) for k in keys]))
    assert resp.succeeded and len(resp.responses) == 4
    rev = resp.header.revision
    for k in keys:
        (kv,) = (await b.range(pb.RangeRequest(key=k))).kvs  # waits out a commit under way
        assert kv.mod_revision == rev and kv.create_revision == rev
    assert all(not m.intents for m in b.machines)


SHARD_KEYS = [b"/a/b/1", b"/a/b/2", b"/a/b", b"/a/c/1", b"/a", b"a/1", b"a/2", b"a", b"b",
              b"\x00accord-lock/a", b"\x00accord-lock/", b"\x00accord-lock/b", b"a/b/c"]


@given(st.lists(st.sampled_from(SHARD_KEYS), min_size=1, max_size=6, unique=True),
       st.sampled_from([2, 3, 8]))
async def test_batch_shard_matches_the_generic_rule(keys: list[bytes], shards: int) -> None:
    req = pb.TxnRequest(success=[op_put(k) for k in keys])
    touched = sharding.shards_of_txn(req, shards)
    b = DirectBackend([SM() for _ in range(shards)])
    if len(touched) > 1:
        resp = await b.txn(req)
        assert all(b.machines[s].revision == resp.header.revision for s in touched)
        assert all(m.revision == 1 for i, m in enumerate(b.machines) if i not in touched)
    else:
        (shard,) = touched
        resp = await b.txn(req)
        # Only the batch's shard moved (to a revision of its own stripe: revorder.py).
        assert resp.header.revision > 1 and resp.header.revision % shards == shard
        assert [m.revision for m in b.machines] == [
            resp.header.revision if i == shard else 1 for i in range(shards)]


@given(puts)
def test_proposer_put_checks_match_validate_put_then_encode_put(req: pb.PutRequest) -> None:
    sm = SM(limits=LIMITS)
    try:
        sm.validate_put(req)
        want: Any = SM.encode_put(req)
    except EtcdError as e:
        want = (e.code, e.message)
    try:
        got: Any = sm.validate_and_encode_put(req)
    except EtcdError as e:
        got = (e.code, e.message)
    assert got == want
