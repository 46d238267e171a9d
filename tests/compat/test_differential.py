"""Differential tests: the same gRPC requests to a real etcd and to accord, answers compared.

Both servers start empty and receive exactly the same sequence of requests for the whole
module (every hypothesis example continues on the same two servers), so their revisions
stay in lockstep and can be compared as absolute numbers. What legitimately differs is
normalised away: cluster/member ids and Raft term in headers, server-chosen lease ids
(mapped accord id -> etcd id as they are granted), the order of map-backed lists (lease
lists, lease keys) and the remaining TTL of a lease (within a second). Error answers must
have the same code and the same message. Leases use long TTLs so that none expires while
the test runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.kv.ranges import prefix_end
from tests.compat.servers import accord_server, etcd_server

RPC_TIMEOUT = 10.0
KEYS = [b"a", b"ab", b"abc", b"b", b"ba", b"c", b"z"]
VALUES = [b"", b"x", b"y", b"xyz"]
BOGUS_LEASE = 0x5EED_0000_0001
KV_METHODS = ("Range", "Put", "DeleteRange", "Txn", "Compact")


@dataclass
class Side:
    """One server and its stubs."""

    name: str
    channel: grpc.Channel
    kv: rpc_pb2_grpc.KVStub
    lease: rpc_pb2_grpc.LeaseStub
    watch: rpc_pb2_grpc.WatchStub


@dataclass
class Pair:
    """Both servers plus what the test knows about their shared state."""

    etcd: Side
    accord: Side
    revision: int = 1
    compacted: int = 0
    ns: bytes = b""
    """Key prefix of the current example: examples do not see each other's keys."""
    examples: int = 0
    leases: list[tuple[int, int]] = field(default_factory=list)
    """Granted leases as (etcd id, accord id)."""

    def key(self, key: bytes) -> bytes:
        """An abstract key of the strategies as sent: inside this example's namespace."""
        return key if key in (b"", b"\x00") else self.ns + key


def _side(name: str, endpoint: str) -> Side:
    ch = grpc.insecure_channel(endpoint)
    return Side(
        name, ch, rpc_pb2_grpc.KVStub(ch), rpc_pb2_grpc.LeaseStub(ch), rpc_pb2_grpc.WatchStub(ch)
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data = tmp_path_factory.mktemp("etcd-diff")
    with etcd_server(Path(data)) as etcd, accord_server() as acc:
        p = Pair(_side("etcd", etcd.endpoint), _side("accord", acc.endpoint))
        try:
            yield p
        finally:
            p.etcd.channel.close()
            p.accord.channel.close()


# --------------------------------------------------------------------------- strategies

keys = st.sampled_from(KEYS)
values = st.sampled_from(VALUES)


@st.composite
def key_ranges(draw: st.DrawFn) -> tuple[bytes, bytes]:
    key = draw(keys)
    kind = draw(st.sampled_from(["single", "prefix", "from", "span", "all"]))
    if kind == "single":
        return key, b""
    if kind == "prefix":
        return key, prefix_end(key)
    if kind == "from":
        return key, b"\x00"
    if kind == "all":
        return b"\x00", b"\x00"
    return key, draw(keys)


# Lease references: ("none",) | ("granted", index) | ("bogus",)
lease_refs = st.one_of(
    st.just(("none", 0)), st.tuples(st.just("granted"), st.integers(0, 7)), st.just(("bogus", 0))
)
# Revision references relative to the current revision / compaction.
rev_refs = st.sampled_from(["zero", "current", "prev", "prev3", "future", "compacted", "one"])


@st.composite
def put_ops(draw: st.DrawFn) -> tuple[Any, ...]:
    return (
        "put",
        draw(keys),
        draw(values),
        draw(lease_refs),
        draw(st.booleans()),  # prev_kv
        draw(st.sampled_from([False, False, False, True])),  # ignore_value
        draw(st.sampled_from([False, False, False, True])),  # ignore_lease
    )


@st.composite
def range_ops(draw: st.DrawFn) -> tuple[Any, ...]:
    key, end = draw(key_ranges())
    return (
        "range",
        key,
        end,
        draw(st.sampled_from([0, 0, 1, 2, 5])),  # limit
        draw(rev_refs),
        draw(st.sampled_from([0, 0, 1, 2])),  # sort_order
        draw(st.integers(0, 4)),  # sort_target
        draw(st.booleans()),  # serializable
        draw(st.booleans()),  # keys_only
        draw(st.sampled_from([False, False, True])),  # count_only
        draw(st.sampled_from([None, None, "min_mod", "max_mod", "min_create", "max_create"])),
        draw(rev_refs),  # the filter's revision
    )


@st.composite
def delete_ops(draw: st.DrawFn) -> tuple[Any, ...]:
    key, end = draw(key_ranges())
    return ("delete", key, end, draw(st.booleans()))


@st.composite
def compares(draw: st.DrawFn) -> tuple[Any, ...]:
    target = draw(st.integers(0, 4))
    key, end = draw(st.one_of(st.tuples(keys, st.just(b"")), key_ranges()))
    return (
        target,
        draw(st.integers(0, 3)),  # result
        key,
        end,
        draw(values),
        draw(st.sampled_from([0, 1, 2, 3])),  # small numbers for version/revisions
        draw(rev_refs),
        draw(lease_refs),
    )


def txn_ops(depth: int) -> st.SearchStrategy[tuple[Any, ...]]:
    leaf = st.one_of(put_ops(), range_ops(), delete_ops())
    inner = leaf if depth == 0 else st.one_of(leaf, txn_ops(depth - 1))
    return st.tuples(
        st.just("txn"),
        st.lists(compares(), max_size=3),
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3),
    )


lease_ops = st.one_of(
    st.tuples(
        st.just("grant"),
        st.sampled_from([300, 3600, 9_000_000_001]),
        st.sampled_from([0, 0, 0, 7001, 7002]),
    ),
    st.tuples(st.just("revoke"), lease_refs),
    st.tuples(st.just("ttl"), lease_refs, st.booleans()),
    st.tuples(st.just("leases")),
    st.tuples(st.just("keepalive"), lease_refs),
)
compact_ops = st.tuples(st.just("compact"), rev_refs, st.booleans())

operations = st.one_of(
    put_ops(), put_ops(), range_ops(), range_ops(), delete_ops(), txn_ops(1), compact_ops, lease_ops
)


# --------------------------------------------------------------------------- building requests


def _rev(pair: Pair, ref: str) -> int:
    cur = pair.revision
    return {
        "zero": 0,
        "current": cur,
        "prev": max(1, cur - 1),
        "prev3": max(1, cur - 3),
        "future": cur + 5,
        "compacted": max(1, pair.compacted),
        "one": 1,
    }[ref]


def _lease(pair: Pair, ref: tuple[str, int], side: str) -> int:
    kind, index = ref
    if kind == "none":
        return 0
    if kind == "bogus" or not pair.leases:
        return BOGUS_LEASE
    etcd_id, accord_id = pair.leases[index % len(pair.leases)]
    return etcd_id if side == "etcd" else accord_id


def _put(pair: Pair, op: tuple[Any, ...], side: str) -> rpc_pb2.PutRequest:
    _k, key, value, lease, prev, ign_v, ign_l = op
    return rpc_pb2.PutRequest(
        key=pair.key(key),
        value=b"" if ign_v else value,
        lease=0 if ign_l else _lease(pair, lease, side),
        prev_kv=prev,
        ignore_value=ign_v,
        ignore_lease=ign_l,
    )


def _range(pair: Pair, op: tuple[Any, ...]) -> rpc_pb2.RangeRequest:
    _k, key, end, limit, rev, order, target, ser, keys_only, count_only, flt, flt_rev = op
    req = rpc_pb2.RangeRequest(
        key=pair.key(key),
        range_end=pair.key(end),
        limit=limit,
        revision=_rev(pair, rev),
        sort_order=order,
        sort_target=target,
        serializable=ser,
        keys_only=keys_only,
        count_only=count_only,
    )
    if flt is not None:
        setattr(req, f"{flt}_revision", _rev(pair, flt_rev))
    return req


def _delete(pair: Pair, op: tuple[Any, ...]) -> rpc_pb2.DeleteRangeRequest:
    _k, key, end, prev = op
    return rpc_pb2.DeleteRangeRequest(key=pair.key(key), range_end=pair.key(end), prev_kv=prev)


def _compare(pair: Pair, c: tuple[Any, ...], side: str) -> rpc_pb2.Compare:
    target, result, key, end, value, small, rev, lease = c
    cmp = rpc_pb2.Compare(target=target, result=result, key=pair.key(key), range_end=pair.key(end))
    if target == rpc_pb2.Compare.VERSION:
        cmp.version = small
    elif target == rpc_pb2.Compare.CREATE:
        cmp.create_revision = _rev(pair, rev) if small else 0
    elif target == rpc_pb2.Compare.MOD:
        cmp.mod_revision = _rev(pair, rev) if small else 0
    elif target == rpc_pb2.Compare.VALUE:
        cmp.value = value
    else:
        cmp.lease = _lease(pair, lease, side)
    return cmp


def _request_op(pair: Pair, op: tuple[Any, ...], side: str) -> rpc_pb2.RequestOp:
    if op[0] == "put":
        return rpc_pb2.RequestOp(request_put=_put(pair, op, side))
    if op[0] == "range":
        return rpc_pb2.RequestOp(request_range=_range(pair, op))
    if op[0] == "delete":
        return rpc_pb2.RequestOp(request_delete_range=_delete(pair, op))
    return rpc_pb2.RequestOp(request_txn=_txn(pair, op, side))


def _txn(pair: Pair, op: tuple[Any, ...], side: str) -> rpc_pb2.TxnRequest:
    _k, cmps, success, failure = op
    return rpc_pb2.TxnRequest(
        compare=[_compare(pair, c, side) for c in cmps],
        success=[_request_op(pair, o, side) for o in success],
        failure=[_request_op(pair, o, side) for o in failure],
    )


# --------------------------------------------------------------------------- normalising


def _strip_headers(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "header" and isinstance(v, dict):
                v = {hk: hv for hk, hv in v.items() if hk == "revision"}
            out[k] = _strip_headers(v)
        return out
    if isinstance(obj, list):
        return [_strip_headers(v) for v in obj]
    return obj


def _map_leases(obj: Any, mapping: dict[int, int]) -> Any:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("lease", "ID") and isinstance(v, int):
                v = mapping.get(v, v)
            out[k] = _map_leases(v, mapping)
        return out
    if isinstance(obj, list):
        return [_map_leases(v, mapping) for v in obj]
    return obj


def normalise(msg: Any, side: str, pair: Pair) -> Any:
    """A comparable dict: header ids/term dropped, accord's lease ids mapped to etcd's."""
    d = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    d = _int_fields(d)
    d = _strip_headers(d)
    if side == "accord":
        d = _map_leases(d, {a: e for e, a in pair.leases})
    return d


def _int_fields(obj: Any) -> Any:
    """MessageToDict renders 64-bit ints as strings; turn digit strings back into ints."""
    if isinstance(obj, dict):
        return {k: _int_fields(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_int_fields(v) for v in obj]
    if isinstance(obj, str) and obj.lstrip("-").isdigit():
        return int(obj)
    return obj


def call(pair: Pair, fn_name: str, build: Any) -> tuple[Any, Any]:
    """Send the request ``build(side)`` to both servers; the two (normalised) outcomes."""
    outcomes = []
    for side in (pair.etcd, pair.accord):
        stub = side.kv if fn_name in KV_METHODS else side.lease
        try:
            resp = getattr(stub, fn_name)(build(side.name), timeout=RPC_TIMEOUT)
            outcomes.append(("ok", resp))
        except grpc.RpcError as e:
            outcomes.append(("error", (e.code(), e.details())))
    return outcomes[0], outcomes[1]


def keepalive(side: Side, lease_id: int) -> Any:
    responses = side.lease.LeaseKeepAlive(
        iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)]), timeout=RPC_TIMEOUT
    )
    try:
        return ("ok", next(responses))
    except grpc.RpcError as e:
        return ("error", (e.code(), e.details()))
    finally:
        responses.cancel()


def _compare_outcomes(pair: Pair, what: Any, e: Any, a: Any) -> tuple[Any, Any]:
    if e[0] != a[0] or e[0] == "error":
        assert e == a, f"{what}: etcd {e} vs accord {a}"
        return e, a
    ne, na = normalise(e[1], "etcd", pair), normalise(a[1], "accord", pair)
    return ne, na


def run_op(pair: Pair, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "put":
        e, a = call(pair, "Put", lambda s: _put(pair, op, s))
    elif kind == "range":
        req = _range(pair, op)
        e, a = call(pair, "Range", lambda s: req)
    elif kind == "delete":
        e, a = call(pair, "DeleteRange", lambda s: _delete(pair, op))
    elif kind == "txn":
        e, a = call(pair, "Txn", lambda s: _txn(pair, op, s))
    elif kind == "compact":
        rev = _rev(pair, op[1])
        e, a = call(pair, "Compact", lambda s: rpc_pb2.CompactionRequest(revision=rev, physical=op[2]))
        if e[0] == "ok":
            pair.compacted = max(pair.compacted, rev)
    elif kind == "grant":
        e, a = call(pair, "LeaseGrant", lambda s: rpc_pb2.LeaseGrantRequest(TTL=op[1], ID=op[2]))
        if e[0] == "ok" and a[0] == "ok":
            pair.leases.append((e[1].ID, a[1].ID))
    elif kind == "revoke":
        e, a = call(pair, "LeaseRevoke", lambda s: rpc_pb2.LeaseRevokeRequest(ID=_lease(pair, op[1], s)))
    elif kind == "ttl":
        e, a = call(
            pair,
            "LeaseTimeToLive",
            lambda s: rpc_pb2.LeaseTimeToLiveRequest(ID=_lease(pair, op[1], s), keys=op[2]),
        )
    elif kind == "leases":
        e, a = call(pair, "LeaseLeases", lambda s: rpc_pb2.LeaseLeasesRequest())
    else:  # keepalive
        e = keepalive(pair.etcd, _lease(pair, op[1], "etcd"))
        a = keepalive(pair.accord, _lease(pair, op[1], "accord"))
    ne, na = _compare_outcomes(pair, op, e, a)
    if e[0] == "ok":
        if kind == "ttl":
            assert abs(ne["TTL"] - na["TTL"]) <= 1, (op, ne, na)
            ne["TTL"] = na["TTL"]
            ne["keys"] = sorted(ne["keys"])
            na["keys"] = sorted(na["keys"])
        if kind == "leases":
            ne["leases"] = sorted(ne["leases"], key=lambda x: x["ID"])
            na["leases"] = sorted(na["leases"], key=lambda x: x["ID"])
        assert ne == na, f"{op}:\n etcd   {ne}\n accord {na}"
        rev = ne.get("header", {}).get("revision", 0)
        pair.revision = max(pair.revision, rev)


# No shrinking: the servers' shared history makes replays of shrunk sequences differ in
# revisions; the failing sequence (at most 20 operations) is reported as generated.
@settings(deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.lists(operations, min_size=1, max_size=20))
def test_same_answers_as_etcd(pair: Pair, ops: list[tuple[Any, ...]]) -> None:
    pair.examples += 1
    pair.ns = b"/d%06d/" % pair.examples
    start = pair.revision + 1
    for op in ops:
        run_op(pair, op)
    check_watch_replay(pair, max(start, pair.compacted + 1))


def check_watch_replay(pair: Pair, start: int) -> None:
    """A watch from ``start`` replays the same events (with prev_kv) on both servers.

    Every revision is made by a write with at least one event, so the replay is complete
    once an event of the current revision has arrived.
    """
    if start > pair.revision:
        return
    e_events = _collect_events(pair.etcd, start, pair.revision)
    a_events = _collect_events(pair.accord, start, pair.revision)
    ne = [normalise(ev, "etcd", pair) for ev in e_events]
    na = [normalise(ev, "accord", pair) for ev in a_events]
    assert ne == na, f"watch from {start}:\n etcd   {ne}\n accord {na}"


def _collect_events(side: Side, start: int, until: int) -> list[Any]:
    req = rpc_pb2.WatchRequest(
        create_request=rpc_pb2.WatchCreateRequest(
            key=b"\x00", range_end=b"\x00", start_revision=start, prev_kv=True
        )
    )
    responses = side.watch.Watch(iter([req]), timeout=RPC_TIMEOUT)
    events: list[Any] = []
    try:
        for resp in responses:
            assert not resp.canceled, (side.name, resp)
            events.extend(resp.events)
            if events and events[-1].kv.mod_revision >= until:
                break
    finally:
        responses.cancel()
    return events
