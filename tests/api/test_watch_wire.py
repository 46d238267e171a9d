"""Watch responses are built as bytes: they must parse into exactly the message etcd's
clients expect, for any watch id, revision and events."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from accord.proto import kv_pb2, rpc_pb2
from accord.services.kv.backend import Backend, HeaderInfo
from accord.services.kv.watchhub import WatchBatch
from accord.services.kv.watchstream import WatchStream, serialize_response

INT64 = st.integers(-(2**63), 2**63 - 1)
UINT63 = st.integers(1, 2**63 - 1)


class _Backend:
    def __init__(self, info: HeaderInfo) -> None:
        self.info = info
        self.watch_hub = None

    def header_info(self) -> HeaderInfo:
        return self.info


kvs = st.builds(
    kv_pb2.KeyValue,
    key=st.binary(min_size=1, max_size=40),
    value=st.binary(max_size=300),
    create_revision=st.integers(0, 2**40),
    mod_revision=st.integers(0, 2**40),
    version=st.integers(0, 1000),
    lease=st.integers(0, 2**62),
)


@st.composite
def events(draw: st.DrawFn) -> kv_pb2.Event:
    ev = kv_pb2.Event(type=draw(st.sampled_from([kv_pb2.Event.PUT, kv_pb2.Event.DELETE])),
                      kv=draw(kvs))
    if draw(st.booleans()):
        ev.prev_kv.CopyFrom(draw(kvs))
    return ev


def _stream(info: HeaderInfo, max_bytes: int = 1 << 20) -> WatchStream:
    return WatchStream(cast(Backend, _Backend(info)), max_response_bytes=max_bytes,
                       require_leader=False)


@given(UINT63, UINT63, st.integers(0, 2**62), INT64, st.integers(0, 2**62),
       st.lists(events(), max_size=5))
def test_event_responses_parse_as_the_protobuf_message(
    cluster: int, member: int, term: int, wid: int, rev: int, evs: list[kv_pb2.Event]
) -> None:
    stream = _stream(HeaderInfo(cluster_id=cluster, member_id=member, raft_term=term, leader=1))
    (raw,) = stream._split(wid, WatchBatch(rev, list(evs)), False)
    expected = rpc_pb2.WatchResponse(watch_id=wid, events=evs)
    expected.header.cluster_id, expected.header.member_id = cluster, member
    expected.header.raft_term, expected.header.revision = term, rev
    assert rpc_pb2.WatchResponse.FromString(raw) == expected
    # the same event objects are reused from the cache for the next watcher
    (again,) = stream._split(wid + 1 if wid < 2**63 - 1 else 0, WatchBatch(rev, list(evs)), False)
    assert [e for e in rpc_pb2.WatchResponse.FromString(again).events] == evs


@given(st.lists(events(), min_size=2, max_size=12), st.integers(200, 2000))
def test_fragments_carry_every_event_in_order_and_fit(evs: list[kv_pb2.Event], limit: int) -> None:
    stream = _stream(HeaderInfo(cluster_id=1, member_id=2, raft_term=3, leader=2), limit)
    parts = [rpc_pb2.WatchResponse.FromString(r)
             for r in stream._split(7, WatchBatch(9, list(evs)), True)]
    assert [e for p in parts for e in p.events] == evs
    assert [p.fragment for p in parts] == [True] * (len(parts) - 1) + [False]
    assert all(p.watch_id == 7 and p.header.revision == 9 for p in parts)
    for p in parts:
        # a fragment exceeds the limit only when one event alone does
        assert len(p.events) == 1 or p.ByteSize() < limit


def test_the_serializer_passes_bytes_and_serializes_messages() -> None:
    msg = rpc_pb2.WatchResponse(watch_id=-1, created=True)
    assert serialize_response(msg) == msg.SerializeToString()
    assert serialize_response(b"\x10\x05") == b"\x10\x05"
