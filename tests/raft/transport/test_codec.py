"""Wire codec: exact round trips, compactness, versioning and strict rejection of garbage."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.raft.core.types import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from accord.raft.transport import codec
from accord.raft.transport.codec import CodecError, Hello, SnapshotPiece

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
small = st.integers(min_value=0, max_value=1000)
ids = st.lists(st.integers(min_value=1, max_value=(1 << 63) - 1), max_size=5).map(tuple)
entries = st.builds(Entry, term=u64, index=u64, type=st.sampled_from(EntryType),
                    data=st.binary(max_size=64))
conf_states = st.builds(ConfState, voters=ids, learners=ids, voters_outgoing=ids,
                        learners_next=ids, auto_leave=st.booleans())
metas = st.builds(SnapshotMeta, index=u64, term=u64, conf_state=conf_states)
snapshots = st.builds(Snapshot, meta=metas, data=st.binary(max_size=64))
messages = st.builds(
    Message,
    type=st.sampled_from(MessageType), to=u64, frm=u64,
    term=st.one_of(small, u64), log_term=st.one_of(st.just(0), u64), index=st.one_of(st.just(0), u64),
    entries=st.lists(entries, max_size=4), commit=st.one_of(st.just(0), u64),
    reject=st.booleans(), reject_hint=st.one_of(st.just(0), u64), hint_term=st.one_of(st.just(0), u64),
    snapshot=st.none() | snapshots, context=st.binary(max_size=16),
)


@given(messages)
def test_message_round_trip_is_exact(m: Message) -> None:
    assert codec.decode_message(codec.encode_message(m)) == m


@given(st.lists(st.tuples(u64, messages), max_size=6),
       st.lists(st.tuples(u64, u64, u64), max_size=4),
       st.lists(st.tuples(u64, u64), max_size=4),
       st.integers(min_value=1, max_value=1 << 62), st.integers(min_value=1, max_value=1 << 62))
def test_frame_round_trip_fills_in_endpoints(msgs: list[tuple[int, Message]], hbs: list[tuple[int, int, int]],
                                             hbrs: list[tuple[int, int]], to: int, frm: int) -> None:
    routed = [(g, _with_endpoints(m, to, frm)) for g, m in msgs]
    frame = codec.decode_frame(codec.encode_frame(routed, hbs, hbrs), to=to, frm=frm)
    assert frame.messages == routed
    assert frame.heartbeats == hbs
    assert frame.heartbeat_resps == hbrs


def _with_endpoints(m: Message, to: int, frm: int) -> Message:
    return Message(m.type, to, frm, m.term, m.log_term, m.index, m.entries, m.commit, m.reject,
                   m.reject_hint, m.hint_term, m.snapshot, m.context)


def test_heartbeat_is_compact() -> None:
    hb = Message(MessageType.HEARTBEAT, to=2, frm=1, term=7, commit=42)
    assert len(codec.pack_routed(3, hb)) <= 12
    # a routed message has no to/frm; trailing defaults are left off
    assert msgpack.unpackb(codec.pack_routed(3, hb)) == [3, [7, 7, 0, 0, [], 42]]


def test_frame_carries_version_first() -> None:
    payload = codec.encode_frame([])
    assert msgpack.unpackb(payload) == [codec.FRAME_VERSION, [], [], []]
    bumped = msgpack.packb([codec.FRAME_VERSION + 1, [], [], []])
    with pytest.raises(CodecError, match="version"):
        codec.decode_frame(bumped, to=1, frm=2)


@pytest.mark.parametrize("payload, why", [
    (b"", "msgpack"),
    (b"\xc1", "msgpack"),
    (msgpack.packb({"a": 1}), "array"),
    (msgpack.packb([1, [[1, [99]]], [], []]), "message type"),
    (msgpack.packb([1, [[1, [1, -5]]], [], []]), "unsigned"),
    (msgpack.packb([1, [[1, [1, 1.5]]], [], []]), "unsigned"),
    (msgpack.packb([1, [[1, [1, 1, 0, 0, [[1, 1, 0, "text"]]]]], [], []]), "entry data"),
    (msgpack.packb([1, [[1, [1, 1, 0, 0, [[1, 1, 9, b""]]]]], [], []]), "entry type"),
    (msgpack.packb([1, [[1, [1, *range(20)]]], [], []]), "array"),
    (msgpack.packb([1, [], [[1, 2]], []]), "heartbeat"),
    (msgpack.packb([1, [], [], [[1, 2, 3]]]), "heartbeat response"),
    (msgpack.packb([1, [], []]), "4 fields"),
    (msgpack.packb([1, [[1, [1, 1, 0, 0, [], 0, 1]]], [], []]), "reject"),
])
def test_decode_frame_rejects_invalid(payload: bytes, why: str) -> None:
    with pytest.raises(CodecError, match=why):
        codec.decode_frame(payload, to=1, frm=2)


@given(st.binary(max_size=200))
def test_decode_frame_random_bytes_only_raise_codec_error(data: bytes) -> None:
    try:
        codec.decode_frame(data, to=1, frm=2)
    except CodecError:
        pass


def test_decode_frame_size_limit() -> None:
    payload = codec.encode_frame([(1, Message(MessageType.APP, 1, 2, entries=[Entry(1, 1, data=b"x" * 100)]))])
    with pytest.raises(CodecError, match="limit"):
        codec.decode_frame(payload, to=1, frm=2, max_len=50)


def test_hello_round_trip_and_checks() -> None:
    h = Hello(codec.PROTOCOL_VERSION, 5, 77, "raft", 6)
    assert codec.decode_hello(codec.encode_hello(h)) == h
    # worker 0 sends the six fields of a node without workers; another worker a seventh
    assert msgpack.unpackb(codec.encode_hello(h)) == [codec.MAGIC, codec.PROTOCOL_VERSION, 5, 77, "raft", 6]
    w = Hello(codec.PROTOCOL_VERSION, 5, 77, "raft", 6, worker=3)
    assert codec.decode_hello(codec.encode_hello(w)) == w
    with pytest.raises(CodecError, match="worker"):
        codec.decode_hello(msgpack.packb([codec.MAGIC, codec.PROTOCOL_VERSION, 5, 77, "raft", 6, -1]))
    with pytest.raises(CodecError, match="magic"):
        codec.decode_hello(msgpack.packb(["etcd", 1, 2, 3, "raft", 0]))
    # a future version is reported as such, not as a parse error
    future = codec.decode_hello(msgpack.packb([codec.MAGIC, 99, "whatever"]))
    assert future.protocol_version == 99
    with pytest.raises(CodecError, match="6 or 7 fields"):
        codec.decode_hello(msgpack.packb([codec.MAGIC, codec.PROTOCOL_VERSION, 1]))
    assert codec.decode_reject(codec.encode_reject("go away")) == "go away"
    assert codec.decode_reject(codec.encode_hello(h)) is None


def test_piece_and_ack_round_trip() -> None:
    meta = SnapshotMeta(10, 3, ConfState(voters=(1, 2, 3)))
    p = SnapshotPiece(4, meta, 1024, b"abc", True)
    assert codec.decode_piece(codec.encode_piece(p, 1234), 1 << 20) == (p, 1234)
    assert codec.decode_ack(codec.encode_ack(2048, False)) == (2048, False)
    with pytest.raises(CodecError):
        codec.decode_ack(msgpack.packb([1]))
