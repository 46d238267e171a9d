"""The sorted key index against a sorted list, the command envelope, the error table."""

from __future__ import annotations

import grpc
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.services.kv import errors
from accord.services.kv.codec import Kind, decode, encode
from accord.services.kv.errors import EtcdError
from accord.services.kv.index import SortedKeys
from accord.services.kv.ranges import KeyRange, prefix_end
from accord.services.kv.watchindex import WatcherIndex


@given(
    st.lists(st.tuples(st.booleans(), st.binary(max_size=3)), max_size=400),
    st.binary(max_size=3),
    st.one_of(st.none(), st.binary(max_size=3)),
)
def test_sorted_keys_match_a_sorted_set(
    ops: list[tuple[bool, bytes]], lo: bytes, hi: bytes | None
) -> None:
    sk = SortedKeys([b"seed", b"a"], chunk=4)  # small chunks: many splits and merges
    ref = {b"seed", b"a"}
    for add, key in ops:
        if add:
            sk.add(key)
            ref.add(key)
        else:
            sk.discard(key)
            ref.discard(key)
        assert len(sk) == len(ref)
    assert list(sk) == sorted(ref)
    assert list(sk.irange(lo, hi)) == [k for k in sorted(ref) if k >= lo and (hi is None or k < hi)]
    for key in list(ref)[:10]:
        assert key in sk


def test_key_range_overlaps() -> None:
    a = KeyRange.of(b"a", b"c")
    assert a.overlaps(KeyRange.of(b"b", b""))
    assert not a.overlaps(KeyRange.of(b"c", b"\x00"))
    assert a.overlaps(KeyRange.of(b"\x00", b"\x00"))
    assert not KeyRange.of(b"x", b"").overlaps(KeyRange.of(b"y", b""))


def test_command_round_trip_and_malformed_commands() -> None:
    data = encode(Kind.LEASE_EXPIRE, b"", now_ms=5, term=2, ids=[3, 4], min_revision=9)
    cmd = decode(data)
    assert (cmd.kind, cmd.now_ms, cmd.term, cmd.ids, cmd.min_revision) == (
        Kind.LEASE_EXPIRE, 5, 2, (3, 4), 9)
    bad = [
        b"",
        b"\xc1",
        msgpack.packb([99, 1, b"", 0, 0, 0, []]),
        msgpack.packb([1, 77, b"", 0, 0, 0, []]),
        msgpack.packb([1, 1, "str", 0, 0, 0, []]),
        msgpack.packb([1, 1, b"", "x", 0, 0, []]),
        msgpack.packb([1, 1, b""]),
    ]
    for data in bad:
        with pytest.raises(EtcdError) as ei:
            decode(data)
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        encode(Kind.PUT, b"", now_ms=-1)
    # A negative min_revision is an ordered stamp (revorder.py) and travels as it is.
    assert decode(encode(Kind.PUT, b"", min_revision=-16)).min_revision == -16


def test_error_table_matches_etcd() -> None:
    table = {
        errors.EMPTY_KEY: ("INVALID_ARGUMENT", "etcdserver: key is not provided"),
        errors.KEY_NOT_FOUND: ("INVALID_ARGUMENT", "etcdserver: key not found"),
        errors.TOO_MANY_OPS: ("INVALID_ARGUMENT", "etcdserver: too many operations in txn request"),
        errors.DUPLICATE_KEY: ("INVALID_ARGUMENT", "etcdserver: duplicate key given in txn request"),
        errors.REQUEST_TOO_LARGE: ("INVALID_ARGUMENT", "etcdserver: request is too large"),
        errors.COMPACTED: ("OUT_OF_RANGE", "etcdserver: mvcc: required revision has been compacted"),
        errors.FUTURE_REV: ("OUT_OF_RANGE", "etcdserver: mvcc: required revision is a future revision"),
        errors.NO_SPACE: ("RESOURCE_EXHAUSTED", "etcdserver: mvcc: database space exceeded"),
        errors.LEASE_NOT_FOUND: ("NOT_FOUND", "etcdserver: requested lease not found"),
        errors.LEASE_EXISTS: ("FAILED_PRECONDITION", "etcdserver: lease already exists"),
        errors.LEASE_TTL_TOO_LARGE: ("OUT_OF_RANGE", "etcdserver: too large lease TTL"),
        errors.NO_LEADER: ("UNAVAILABLE", "etcdserver: no leader"),
        errors.LEADER_CHANGED: ("UNAVAILABLE", "etcdserver: leader changed"),
        errors.TIMEOUT: ("UNAVAILABLE", "etcdserver: request timed out"),
        errors.NOT_LEADER: ("FAILED_PRECONDITION", "etcdserver: not leader"),
        errors.TOO_MANY_REQUESTS: ("RESOURCE_EXHAUSTED", "etcdserver: too many requests"),
        errors.AUTH_FAILED: ("INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or password"),
        errors.PERMISSION_DENIED: ("PERMISSION_DENIED", "etcdserver: permission denied"),
        errors.INVALID_AUTH_TOKEN: ("UNAUTHENTICATED", "etcdserver: invalid auth token"),
        errors.AUTH_NOT_ENABLED: ("FAILED_PRECONDITION", "etcdserver: authentication is not enabled"),
        errors.MEMBER_EXIST: ("FAILED_PRECONDITION", "etcdserver: member ID already exist"),
        errors.PEER_URL_EXIST: ("FAILED_PRECONDITION", "etcdserver: Peer URLs already exists"),
        errors.MEMBER_NOT_FOUND: ("NOT_FOUND", "etcdserver: member not found"),
        errors.BAD_LEADER_TRANSFEREE: ("FAILED_PRECONDITION", "etcdserver: bad leader transferee"),
        errors.CORRUPT: ("DATA_LOSS", "etcdserver: corrupt cluster"),
    }
    for err, (code, message) in table.items():
        assert (err.code.name, err.message) == (code, message)
        assert str(err) == message


class _W:
    def __init__(self, kr: KeyRange) -> None:
        self.kr = kr


_ranges = st.tuples(st.binary(max_size=3), st.sampled_from([b"", b"\x00", b"b", b"\xff"]))


@given(st.lists(_ranges, max_size=30), st.lists(st.binary(max_size=4), max_size=20),
       st.data())
def test_watcher_index_matches_brute_force(
    specs: list[tuple[bytes, bytes]], probes: list[bytes], data: st.DataObject
) -> None:
    ws = []
    for key, end in specs:
        if data.draw(st.booleans()):  # make it a prefix watch
            end = prefix_end(key) if key else b"\x00"
        ws.append(_W(KeyRange.of(key, end)))
    idx: WatcherIndex[_W] = WatcherIndex()
    for w in ws:
        idx.add(w)
    removed = set(data.draw(st.sets(st.integers(0, max(0, len(ws) - 1)), max_size=5)))
    for i in removed:
        if i < len(ws):
            idx.discard(ws[i])
            idx.discard(ws[i])  # twice: still fine
    alive = [w for i, w in enumerate(ws) if i not in removed]
    for key in [*probes, *(s[0] for s in specs)]:
        got = list(idx.matching(key))
        assert len(got) == len(set(map(id, got)))
        assert {id(w) for w in got} == {id(w) for w in alive if w.kr.contains(key)}
