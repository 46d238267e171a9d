"""Compaction visits only the keys the revision log holds since the previous compaction
(``MVCCStore.compact``): checked against the rule itself, applied to every key of a copy
of the store taken just before, over random puts, deletes, multi-key writes, retro writes
into revision gaps (a multi-shard Txn's reserved revision), rollbacks and compactions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.services.kv import mvcc
from accord.services.kv.mvcc import MOD, VALUE, MVCCStore, Rec, versions
from accord.services.kv.ranges import KeyRange

KEYS = [b"k%d" % i for i in range(8)]
SHARE = mvcc.CHANGED_SHARE_FOR_LOG_WALK


def kept_at(recs: list[Rec], rev: int) -> list[Rec]:
    """What compaction at ``rev`` keeps of a key's versions: everything above ``rev`` and
    the version current at ``rev`` unless that is a tombstone."""
    at = [i for i, r in enumerate(recs) if r[MOD] <= rev]
    if not at:
        return recs
    i = at[-1]
    return recs[i + 1:] if recs[i][VALUE] is None else recs[i:]


def image(store: MVCCStore) -> dict[bytes, list[Rec]]:
    return {k: list(versions(h)) for k, h in store.hist.items()}


def check_compaction(store: MVCCStore, rev: int) -> None:
    before = image(store)
    store.compact(rev)
    want = {k: kept_at(recs, rev) for k, recs in before.items()}
    want = {k: recs for k, recs in want.items() if recs}
    assert image(store) == want
    assert list(store.keys) == sorted(want)
    assert all(isinstance(h, list) == (len(want[k]) > 1) for k, h in store.hist.items())


op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.sampled_from(KEYS)),
    st.tuples(st.just("many"), st.lists(st.sampled_from(KEYS), min_size=2, max_size=4)),
    st.tuples(st.just("gap"), st.integers(2, 6)),
    st.tuples(st.just("retro"), st.sampled_from(KEYS)),
    st.tuples(st.just("rollback"), st.sampled_from(KEYS)),
    st.tuples(st.just("compact"), st.floats(0, 1)),
)


@pytest.mark.parametrize("share", [0.0, math.inf], ids=["every-key", "log"])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=60))
def test_compaction_keeps_what_a_walk_over_every_key_keeps(share: float,
                                                           ops: list[tuple]) -> None:
    """Both ways of finding the keys to compact (every key; the log's since the last
    compaction) keep what the rule keeps."""
    mvcc.CHANGED_SHARE_FOR_LOG_WALK = share
    try:
        _run(ops)
    finally:
        mvcc.CHANGED_SHARE_FOR_LOG_WALK = SHARE


def _run(ops: list[tuple]) -> None:
    store = MVCCStore()
    used: set[int] = set()
    for o in ops:
        kind = o[0]
        if kind == "put":
            t = store.begin()
            t.put(o[1], b"v", 0)
            used.add(t.rev)
            t.commit()
        elif kind == "delete":
            lo, hi = sorted((o[1], o[2]))
            t = store.begin()
            t.delete(KeyRange.of(lo, hi + b"\x00"))
            if t.changes:
                used.add(t.rev)
            t.commit()
        elif kind == "many":
            t = store.begin()
            for k in o[1]:
                t.put(k, b"m", 0)
            used.add(t.rev)
            t.commit()
        elif kind == "gap":
            store.raise_floor(store.rev + o[1])
        elif kind == "retro":
            # A reserved revision below the latest: free, above the key's last change
            # and above the last compaction (an intent kept the key still since).
            last = max((r[MOD] for r in store.versions(o[1])), default=0)
            free = [r for r in range(max(last, store.compact_rev) + 1, store.rev)
                    if r not in used]
            if free:
                t = store.begin_at(free[-1])
                t.put(o[1], b"r", 0)
                used.add(t.rev)
                t.commit()
        elif kind == "rollback":
            t = store.begin()
            t.put(o[1], b"x", 0)
            t.rollback()
        else:
            lo = store.compact_rev + 1
            if lo <= store.rev:
                check_compaction(store, lo + int(o[1] * (store.rev - lo)))


def test_a_compaction_visits_only_what_changed_since_the_last() -> None:
    """After a compaction, one more compaction looks at the keys changed since (through
    the log), not at the whole key space: the untouched keys are not even read."""
    store = MVCCStore()
    for i in range(1000):
        t = store.begin()
        t.put(b"key%04d" % i, b"v", 0)
        t.commit()
    store.compact(store.rev)
    for key in (b"key0007", b"key0500"):
        t = store.begin()
        t.put(key, b"w", 0)
        t.commit()

    class Counting(dict[bytes, object]):
        reads = 0

        def __getitem__(self, key: bytes) -> object:
            Counting.reads += 1
            return super().__getitem__(key)

        def items(self):  # type: ignore[no-untyped-def]
            raise AssertionError("compaction walked every key")

    store.hist = Counting(store.hist)  # type: ignore[assignment]
    store.compact(store.rev)
    assert Counting.reads == 2
    assert [r[VALUE] for r in store.versions(b"key0007")] == [b"w"]
