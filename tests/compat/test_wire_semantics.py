"""etcd's wire-level behaviours (ETCD_COMPAT.md), asserted identically on accord and real etcd.

Every test runs against both servers (the ``server`` fixture), so each expectation is
checked to be etcd's own before accord is held to it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from accord.proto import rpc_pb2, rpc_pb2_grpc
from tests.compat.servers import Server

T = 10.0
WC = rpc_pb2.WatchCreateRequest


class Stream:
    """A watch stream driven request by request from the test thread."""

    def __init__(self, stub: rpc_pb2_grpc.WatchStub, metadata: Any = None) -> None:
        self._q: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        self._call = stub.Watch(self._requests(), timeout=30, metadata=metadata)
        self._responses: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[rpc_pb2.WatchRequest]:
        while True:
            item = self._q.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for resp in self._call:
                self._responses.put(resp)
        except grpc.RpcError as e:
            self._responses.put(e)

    def send(self, **kw: Any) -> None:
        self._q.put(rpc_pb2.WatchRequest(**kw))

    def create(self, key: bytes, **kw: Any) -> None:
        self.send(create_request=WC(key=key, **kw))

    def recv(self, timeout: float = T) -> rpc_pb2.WatchResponse:
        item = self._responses.get(timeout=timeout)
        if isinstance(item, Exception):
            raise item
        return item

    def nothing_within(self, seconds: float) -> bool:
        try:
            self._responses.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self._call.cancel()
        self._q.put(None)
        self._reader.join(timeout=5)


@pytest.fixture
def ch(server: Server) -> Iterator[grpc.Channel]:
    # Large enough for the fragment test; real clients raise it the same way.
    with grpc.insecure_channel(
        server.endpoint, options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)]
    ) as channel:
        yield channel


def kv(ch: grpc.Channel) -> rpc_pb2_grpc.KVStub:
    return rpc_pb2_grpc.KVStub(ch)


def put(ch: grpc.Channel, key: bytes, value: bytes = b"v", **kw: Any) -> rpc_pb2.PutResponse:
    return kv(ch).Put(rpc_pb2.PutRequest(key=key, value=value, **kw), timeout=T)


def rpc_error(fn: Any, *args: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, timeout=T)
    return info.value.code(), info.value.details()


def test_watch_ids_created_in_order_and_duplicates(ch: grpc.Channel) -> None:
    s = Stream(rpc_pb2_grpc.WatchStub(ch))
    try:
        for k in (b"/ids/a", b"/ids/b", b"/ids/c"):
            s.create(k)
        got = [s.recv() for _ in range(3)]
        assert [(r.watch_id, r.created, r.canceled) for r in got] == [
            (0, True, False), (1, True, False), (2, True, False)
        ]  # fmt: skip
        assert all(r.header.revision > 0 and r.header.member_id for r in got)
        s.create(b"/ids/d", watch_id=7)
        assert (s.recv().watch_id, True) == (7, True)
        s.create(b"/ids/e", watch_id=7)
        dup = s.recv()
        assert (dup.watch_id, dup.created, dup.canceled) == (-1, True, True)
        assert dup.cancel_reason == "mvcc: duplicate watch ID provided on the WatchStream"
        s.create(b"/ids/z", range_end=b"/ids/a")  # range_end below key: an empty range
        empty = s.recv()
        assert (empty.watch_id, empty.created, empty.canceled) == (-1, True, True)
        assert empty.cancel_reason == "mvcc: watcher range is empty"
        s.create(b"/ids/f")  # auto ids continue after the ones in use, none was consumed
        assert s.recv().watch_id == 3
        s.send(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=99))  # unknown: no reply
        s.send(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=1))
        c = s.recv()
        assert (c.watch_id, c.canceled, c.created) == (1, True, False)
    finally:
        s.close()


def test_watch_events_filters_prev_kv_and_progress(ch: grpc.Channel) -> None:
    s = Stream(rpc_pb2_grpc.WatchStub(ch))
    try:
        put(ch, b"/ev/k", b"old")
        s.create(b"/ev/", range_end=b"/ev0", prev_kv=True)
        s.create(b"/ev/", range_end=b"/ev0", filters=[WC.NOPUT])
        assert s.recv().watch_id == 0 and s.recv().watch_id == 1
        rev = put(ch, b"/ev/k", b"new").header.revision
        drev = kv(ch).DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"/ev/k"), timeout=T).header.revision
        seen: dict[int, list[Any]] = {0: [], 1: []}
        while len(seen[0]) < 2 or len(seen[1]) < 1:
            r = s.recv()
            seen[r.watch_id].extend(r.events)
        put_ev, del_ev = seen[0]
        assert put_ev.type == put_ev.PUT and put_ev.kv.value == b"new"
        assert put_ev.kv.mod_revision == rev and put_ev.prev_kv.value == b"old"
        assert del_ev.type == del_ev.DELETE and del_ev.kv.mod_revision == drev
        assert del_ev.kv.value == b"" and del_ev.kv.create_revision == 0  # key + mod_revision only
        assert del_ev.prev_kv.value == b"new"
        assert [e.type for e in seen[1]] == [del_ev.DELETE]
        s.send(progress_request=rpc_pb2.WatchProgressRequest())
        p = s.recv()
        assert (p.watch_id, len(p.events), p.created, p.canceled) == (-1, 0, False, False)
        assert p.header.revision == drev
    finally:
        s.close()


def test_watch_compacted_start_is_created_then_canceled(ch: grpc.Channel) -> None:
    put(ch, b"/cw/k", b"1")
    r2 = put(ch, b"/cw/k", b"2").header.revision
    put(ch, b"/cw/k", b"3")
    kv(ch).Compact(rpc_pb2.CompactionRequest(revision=r2), timeout=T)
    s = Stream(rpc_pb2_grpc.WatchStub(ch))
    try:
        s.create(b"/cw/k", start_revision=r2 - 1)
        created = s.recv()
        assert (created.created, created.canceled, created.watch_id) == (True, False, 0)
        canceled = s.recv()
        assert (canceled.canceled, canceled.compact_revision, canceled.watch_id) == (True, r2, 0)
        assert canceled.header.revision == 0 and not canceled.events
    finally:
        s.close()


def test_watch_future_start_revision_waits(ch: grpc.Channel) -> None:
    now = put(ch, b"/fw/k", b"0").header.revision
    s = Stream(rpc_pb2_grpc.WatchStub(ch))
    try:
        s.create(b"/fw/k", start_revision=now + 2)
        assert s.recv().created
        put(ch, b"/fw/k", b"1")  # now + 1: before the start revision, not delivered
        put(ch, b"/fw/k", b"2")  # now + 2
        r = s.recv()
        assert [e.kv.value for e in r.events] == [b"2"]
    finally:
        s.close()


def test_watch_fragments_large_revisions(ch: grpc.Channel) -> None:
    big = b"x" * (700 * 1024)
    for i in range(3):
        put(ch, f"/frag/{i}".encode(), big)
    s = Stream(rpc_pb2_grpc.WatchStub(ch))
    try:
        s.create(b"/frag/", range_end=b"/frag0", prev_kv=True, fragment=True)
        assert s.recv().created
        kv(ch).DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"/frag/", range_end=b"/frag0"), timeout=T)
        first, second = s.recv(), s.recv()
        assert (first.fragment, len(first.events)) == (True, 2)
        assert (second.fragment, len(second.events)) == (False, 1)
    finally:
        s.close()


def test_watch_with_require_leader_metadata(ch: grpc.Channel) -> None:
    s = Stream(rpc_pb2_grpc.WatchStub(ch), metadata=[("hasleader", "true")])
    try:
        s.create(b"/hl/k")
        assert s.recv().created
        put(ch, b"/hl/k")
        assert s.recv().events[0].kv.key == b"/hl/k"
    finally:
        s.close()


def test_lease_semantics(ch: grpc.Channel) -> None:
    lease = rpc_pb2_grpc.LeaseStub(ch)
    g = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=1), timeout=T)
    assert g.TTL == 2  # clamped up to the minimum TTL
    lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=g.ID), timeout=T)
    assert rpc_error(lease.LeaseGrant, rpc_pb2.LeaseGrantRequest(TTL=9_000_000_001)) == (
        grpc.StatusCode.OUT_OF_RANGE, "etcdserver: too large lease TTL"
    )  # fmt: skip
    fixed = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60, ID=424242), timeout=T)
    assert fixed.ID == 424242
    assert rpc_error(lease.LeaseGrant, rpc_pb2.LeaseGrantRequest(TTL=60, ID=424242)) == (
        grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: lease already exists"
    )  # fmt: skip
    responses = lease.LeaseKeepAlive(
        iter([rpc_pb2.LeaseKeepAliveRequest(ID=424242), rpc_pb2.LeaseKeepAliveRequest(ID=1)]),
        timeout=T,
    )
    try:
        known, unknown = next(responses), next(responses)
    finally:
        responses.cancel()
    assert (known.ID, known.TTL) == (424242, 60) and known.header.revision > 0
    assert (unknown.ID, unknown.TTL) == (1, 0)
    ttl = lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=1), timeout=T)
    assert ttl.TTL == -1
    assert rpc_error(lease.LeaseRevoke, rpc_pb2.LeaseRevokeRequest(ID=1)) == (
        grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"
    )  # fmt: skip
    assert rpc_error(kv(ch).Put, rpc_pb2.PutRequest(key=b"/l/k", lease=1)) == (
        grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"
    )  # fmt: skip
    lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=424242), timeout=T)


def test_kv_errors_and_headers(ch: grpc.Channel) -> None:
    assert rpc_error(kv(ch).Put, rpc_pb2.PutRequest(key=b"")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided"
    )  # fmt: skip
    assert rpc_error(kv(ch).Put, rpc_pb2.PutRequest(key=b"/big", value=b"x" * (1600 * 1024))) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large"
    )  # fmt: skip
    ops = [rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"k"))] * 129
    assert rpc_error(kv(ch).Txn, rpc_pb2.TxnRequest(success=ops)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations in txn request"
    )  # fmt: skip
    assert rpc_error(kv(ch).Put, rpc_pb2.PutRequest(key=b"/none", ignore_value=True)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key not found"
    )  # fmt: skip
    r = put(ch, b"/hdr/k")
    st = rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), timeout=T)
    assert r.header.cluster_id and r.header.raft_term >= 1
    assert st.leader == st.header.member_id == r.header.member_id
    assert st.header.revision == r.header.revision
    txn = kv(ch).Txn(
        rpc_pb2.TxnRequest(
            success=[
                rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"/hdr/a")),
                rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"/hdr/b")),
            ]
        ),
        timeout=T,
    )
    assert txn.header.revision == r.header.revision + 1  # one revision for the whole txn
    nested = txn.responses[0].response_put.header
    assert (nested.revision, nested.member_id, nested.cluster_id) == (txn.header.revision, 0, 0)
    members = rpc_pb2_grpc.ClusterStub(ch).MemberList(rpc_pb2.MemberListRequest(), timeout=T)
    assert members.header.member_id == st.leader and members.header.cluster_id


def test_txn_delete_to_end_then_put_same_key(ch: grpc.Channel) -> None:
    """etcd's duplicate-key check treats range_end "\\0" literally (an empty interval), so a
    branch may delete [k, "\\0") and put k; the watch's DELETE then has no prev_kv."""
    base = put(ch, b"~dz/a").header.revision
    s = Stream(rpc_pb2_grpc.WatchStub(ch))
    try:
        s.create(b"~dz/k", start_revision=base + 1, prev_kv=True)
        assert s.recv().created
        ops = [
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"~dz/k", value=b"v")),
            rpc_pb2.RequestOp(
                request_delete_range=rpc_pb2.DeleteRangeRequest(key=b"~dz/k", range_end=b"\x00")
            ),
        ]
        resp = kv(ch).Txn(rpc_pb2.TxnRequest(success=ops), timeout=T)
        assert resp.succeeded and resp.responses[1].response_delete_range.deleted == 1
        events: list[Any] = []
        while len(events) < 2:
            events.extend(s.recv().events)
        put_ev, del_ev = events
        assert (put_ev.type, del_ev.type) == (put_ev.PUT, del_ev.DELETE)
        assert put_ev.kv.mod_revision == del_ev.kv.mod_revision == base + 1
        assert not del_ev.HasField("prev_kv")  # nothing existed at the previous revision
    finally:
        s.close()


def test_txn_checks_puts_before_ranges(ch: grpc.Channel) -> None:
    """etcd checks every Put of the taken path, then every Range: a missing key for
    ignore_lease wins over a Range at a future revision that comes first."""
    now = put(ch, b"/ord/seed").header.revision
    ops = [
        rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"/ord/a", revision=now + 100)),
        rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"/ord/missing", ignore_lease=True)),
    ]
    assert rpc_error(kv(ch).Txn, rpc_pb2.TxnRequest(success=ops)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key not found"
    )  # fmt: skip


def test_auth_disabled_and_admin_errors(ch: grpc.Channel) -> None:
    auth = rpc_pb2_grpc.AuthStub(ch)
    fp = grpc.StatusCode.FAILED_PRECONDITION
    assert rpc_error(auth.Authenticate, rpc_pb2.AuthenticateRequest(name="u", password="p")) == (
        fp, "etcdserver: authentication is not enabled"
    )  # fmt: skip
    assert rpc_error(auth.AuthEnable, rpc_pb2.AuthEnableRequest()) == (
        fp, "etcdserver: root user does not exist"
    )  # fmt: skip
    assert rpc_error(auth.UserGet, rpc_pb2.AuthUserGetRequest(name="nobody")) == (
        fp, "etcdserver: user name not found"
    )  # fmt: skip
    assert list(auth.UserList(rpc_pb2.AuthUserListRequest(), timeout=T).users) == []
    assert list(auth.RoleList(rpc_pb2.AuthRoleListRequest(), timeout=T).roles) == []
    m = rpc_pb2_grpc.MaintenanceStub(ch)
    assert rpc_error(m.MoveLeader, rpc_pb2.MoveLeaderRequest(targetID=1)) == (
        fp, "etcdserver: bad leader transferee"
    )  # fmt: skip
