"""Property test: random put/delete/txn/compact/range sequences agree with a naive model.

The model keeps a full copy of the key space per revision (obviously correct, only
fit for tiny workloads). The same run also checks that watch replay equals the live
events, that the live events rebuild the final state, and that a snapshot restores to
an identical state machine.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from accord.proto import kv_pb2
from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.kv.helpers import cmp, op_del, op_put

KEYS = [b"a", b"ab", b"b", b"ba", b"c", b"\xff"]
ENDS = [b"", b"", b"b", b"c", b"\x00", b"\xff"]

KV = tuple[int, int, int, bytes]  # create, mod, version, value


@dataclass
class Model:
    """Naive reference: the whole key space at every revision."""

    revs: list[int] = field(default_factory=lambda: [1])
    states: list[dict[bytes, KV]] = field(default_factory=lambda: [{}])
    compact: int = -1  # etcd never-compacted sentinel: Compact(0) is accepted once

    @property
    def rev(self) -> int:
        return self.revs[-1]

    def at(self, rev: int) -> dict[bytes, KV]:
        return self.states[bisect_right(self.revs, rev) - 1]

    def commit(self, new: dict[bytes, KV], rev: int) -> None:
        self.revs.append(rev)
        self.states.append(new)


def in_range(key: bytes, start: bytes, end: bytes) -> bool:
    if not end:
        return key == start
    if end == b"\x00":
        return key >= start
    return start <= key < end


def model_put(m: Model, key: bytes, value: bytes, floor: int) -> None:
    rev = max(m.rev + 1, floor)
    new = dict(m.at(m.rev))
    old = new.get(key)
    new[key] = (old[0], rev, old[2] + 1, value) if old else (rev, rev, 1, value)
    m.commit(new, rev)


def model_delete(m: Model, key: bytes, end: bytes, floor: int) -> int:
    cur = m.at(m.rev)
    gone = [k for k in cur if in_range(k, key, end)]
    if gone:
        m.commit({k: v for k, v in cur.items() if k not in gone}, max(m.rev + 1, floor))
    return len(gone)


put_op = st.tuples(st.just("put"), st.sampled_from(KEYS), st.binary(max_size=3),
                   st.sampled_from([0, 0, 0, 50]))
del_op = st.tuples(st.just("del"), st.sampled_from(KEYS), st.sampled_from(ENDS),
                   st.sampled_from([0, 0, 0, 80]))
txn_op = st.tuples(st.just("txn"), st.sampled_from(KEYS), st.integers(0, 2),
                   st.lists(st.sampled_from(KEYS), unique=True, max_size=3),
                   st.sampled_from(KEYS))
compact_op = st.tuples(st.just("compact"), st.integers(-1, 4))
range_op = st.tuples(st.just("range"), st.sampled_from(KEYS), st.sampled_from(ENDS),
                     st.integers(-2, 6), st.integers(0, 3))
ops = st.lists(st.one_of(put_op, put_op, del_op, txn_op, compact_op, range_op, range_op),
               max_size=40)


def check_range(sm: SM, m: Model, key: bytes, end: bytes, back: int, limit: int) -> None:
    rev = max(0, m.rev - back) if back >= 0 else m.rev + 1
    req = pb.RangeRequest(key=key, range_end=end, revision=rev, limit=limit)
    if rev > m.rev:
        expect_err: EtcdError | None = errors.FUTURE_REV
    elif 0 < rev < m.compact:
        expect_err = errors.COMPACTED
    else:
        expect_err = None
    try:
        resp = sm.range(req)
    except EtcdError as e:
        assert e == expect_err
        return
    assert expect_err is None
    state = m.at(rev if rev > 0 else m.rev)
    want = sorted((k, v) for k, v in state.items() if in_range(k, key, end))
    assert resp.count == len(want)
    shown = want[:limit] if limit else want
    assert resp.more == (len(shown) < len(want))
    got = [(kv.key, (kv.create_revision, kv.mod_revision, kv.version, kv.value))
           for kv in resp.kvs]
    assert got == shown
    assert resp.header.revision == m.rev


def run(sm: SM, m: Model, program: list[tuple]) -> None:  # type: ignore[type-arg]
    for op in program:
        kind = op[0]
        if kind == "put":
            _, key, value, floor = op
            resp = sm.apply(SM.encode_put(pb.PutRequest(key=key, value=value),
                                          min_revision=floor))
            model_put(m, key, value, floor)
            assert isinstance(resp, pb.PutResponse) and resp.header.revision == m.rev
        elif kind == "del":
            _, key, end, floor = op
            resp = sm.apply(SM.encode_delete_range(
                pb.DeleteRangeRequest(key=key, range_end=end), min_revision=floor))
            n = model_delete(m, key, end, floor)
            assert isinstance(resp, pb.DeleteRangeResponse) and resp.deleted == n
        elif kind == "txn":
            _, ckey, version, then_keys, else_key = op
            req = pb.TxnRequest(compare=[cmp(ckey, "VERSION", "EQUAL", version)],
                                success=[op_put(k, b"t") for k in then_keys],
                                failure=[op_del(else_key)])
            resp = sm.apply(SM.encode_txn(req))
            cur = m.at(m.rev)
            ok = (cur[ckey][2] if ckey in cur else 0) == version
            assert isinstance(resp, pb.TxnResponse) and resp.succeeded == ok
            if ok and then_keys:
                rev, new = m.rev + 1, dict(cur)
                for k in then_keys:
                    old = new.get(k)
                    new[k] = (old[0], rev, old[2] + 1, b"t") if old else (rev, rev, 1, b"t")
                m.commit(new, rev)
            elif not ok:
                model_delete(m, else_key, b"", 0)
            assert resp.header.revision == m.rev
        elif kind == "compact":
            target = m.rev - op[1]
            try:
                sm.apply(SM.encode_compact(pb.CompactionRequest(revision=target)))
            except EtcdError as e:
                assert e == (errors.FUTURE_REV if target > m.rev else errors.COMPACTED)
            else:
                assert m.compact < target <= m.rev
                m.compact = target
        else:
            check_range(sm, m, *op[1:])
        assert sm.revision == m.rev


@given(ops)
def test_store_agrees_with_naive_model(program: list[tuple]) -> None:  # type: ignore[type-arg]
    sm = SM()
    live = sm.watch_hub.watch(b"\x00", b"\x00", prev_kv=True, buffer_limit=10**6)
    m = Model()
    run(sm, m, program)
    for key in KEYS:
        for end in ENDS:
            check_range(sm, m, key, end, 0, 0)

    # live events rebuild the final state
    live_events: list[kv_pb2.Event] = []
    while (b := live.poll(max_events=10**6)) is not None:
        live_events.extend(b.events)
    state: dict[bytes, KV] = {}
    for e in live_events:
        if e.type == kv_pb2.Event.PUT:
            state[e.kv.key] = (e.kv.create_revision, e.kv.mod_revision, e.kv.version, e.kv.value)
        else:
            state.pop(e.kv.key, None)
    assert state == m.at(m.rev)

    # replay from the oldest revision still readable equals the live stream
    start = m.compact + 1 if m.compact > 0 else 1
    replay = sm.watch_hub.watch(b"\x00", b"\x00", start_revision=start, prev_kv=True,
                                buffer_limit=3)
    replayed: list[kv_pb2.Event] = []
    while (b := replay.poll()) is not None:
        assert not b.canceled
        replayed.extend(b.events)
    assert replayed == [e for e in live_events if e.kv.mod_revision >= start]

    # snapshot / restore round trip; a prepared snapshot ignores later writes
    prepared = sm.prepare_snapshot()
    before = sm.snapshot()
    scratch = SM()
    scratch.restore(before)
    for k in KEYS:
        scratch.apply(SM.encode_put(pb.PutRequest(key=k, value=b"later")))
        sm.apply(SM.encode_put(pb.PutRequest(key=k, value=b"later")))
    if sm.revision > 3:
        sm.apply(SM.encode_compact(pb.CompactionRequest(revision=sm.revision - 1)))
        scratch.apply(SM.encode_compact(pb.CompactionRequest(revision=scratch.revision - 1)))
    assert prepared() == before
    assert scratch.snapshot() == sm.snapshot()
    copy = SM()
    copy.restore(sm.snapshot())
    assert copy.snapshot() == sm.snapshot()
    assert copy.hash_kv(0) == sm.hash_kv(0)
    assert (copy.revision, copy.compact_revision) == (sm.revision, sm.compact_revision)
    follow_up = SM.encode_put(pb.PutRequest(key=b"a", value=b"after"))
    assert copy.apply(follow_up) == sm.apply(follow_up)
    assert copy.snapshot() == sm.snapshot()
