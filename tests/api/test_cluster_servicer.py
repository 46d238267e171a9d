"""Cluster, Maintenance and Auth servicers over the local backend; the snapshot file format."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.cluster import snapfile
from accord.services.kv.statemachine import KVStateMachine
from tests.api.conftest import Running


async def _error(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code(), info.value.details()


async def test_members(running: Running) -> None:
    cluster = rpc_pb2_grpc.ClusterStub(running.channel)
    me = running.backend.member_id
    listed = await cluster.MemberList(rpc_pb2.MemberListRequest(), timeout=5)
    assert [m.ID for m in listed.members] == [me]
    assert listed.header.member_id == me and listed.header.revision == 0
    assert await _error(
        cluster.MemberAdd(rpc_pb2.MemberAddRequest(peerURLs=["not a url"]), timeout=5)
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: given member URLs are invalid")
    code, msg = await _error(
        cluster.MemberAdd(rpc_pb2.MemberAddRequest(peerURLs=["http://127.0.0.1:2380"]), timeout=5)
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "replicated accord node" in msg
    updated = await cluster.MemberUpdate(
        rpc_pb2.MemberUpdateRequest(ID=me, peerURLs=["http://127.0.0.1:2380"]), timeout=5
    )
    assert list(updated.members[0].peerURLs) == ["http://127.0.0.1:2380"]
    assert await _error(cluster.MemberRemove(rpc_pb2.MemberRemoveRequest(ID=me + 1), timeout=5)) == (
        grpc.StatusCode.NOT_FOUND,
        "etcdserver: member not found",
    )
    assert await _error(cluster.MemberPromote(rpc_pb2.MemberPromoteRequest(ID=me), timeout=5)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "etcdserver: can only promote a learner member",
    )


async def test_maintenance(running: Running) -> None:
    m = rpc_pb2_grpc.MaintenanceStub(running.channel)
    kv = rpc_pb2_grpc.KVStub(running.channel)
    st = await m.Status(rpc_pb2.StatusRequest(), timeout=5)
    assert st.version == "3.5.13" and st.leader == running.backend.member_id
    h1 = (await m.Hash(rpc_pb2.HashRequest(), timeout=5)).hash
    assert (await m.Hash(rpc_pb2.HashRequest(), timeout=5)).hash == h1
    put = await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), timeout=5)
    assert (await m.Hash(rpc_pb2.HashRequest(), timeout=5)).hash != h1
    hkv = await m.HashKV(rpc_pb2.HashKVRequest(revision=0), timeout=5)
    assert hkv.header.revision == put.header.revision and hkv.compact_revision == 0
    assert await _error(m.HashKV(rpc_pb2.HashKVRequest(revision=10**6), timeout=5)) == (
        grpc.StatusCode.OUT_OF_RANGE,
        "etcdserver: mvcc: required revision is a future revision",
    )
    await m.Defragment(rpc_pb2.DefragmentRequest(), timeout=5)
    await m.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=running.backend.member_id), timeout=5)
    assert await _error(m.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=1), timeout=5)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "etcdserver: bad leader transferee",
    )
    code, _msg = await _error(m.Downgrade(rpc_pb2.DowngradeRequest(version="3.4.0"), timeout=5))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    alarms = await m.Alarm(rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.GET), timeout=5)
    assert list(alarms.alarms) == []

    chunks = [c async for c in m.Snapshot(rpc_pb2.SnapshotRequest(), timeout=5)]
    blob = b"".join(c.blob for c in chunks)
    assert len(blob) % 512 == 32 and chunks[-1].remaining_bytes == 0
    assert chunks[0].remaining_bytes == len(blob) - len(chunks[0].blob)
    snap = snapfile.decode(blob)
    assert snap.revision == chunks[0].header.revision == put.header.revision
    sm = KVStateMachine()
    sm.restore(snap.groups[snap.kv_groups[0]])
    assert sm.range(rpc_pb2.RangeRequest(key=b"k")).kvs[0].value == b"v"


async def test_auth_starts_disabled_and_users_are_kept(running: Running) -> None:
    auth = rpc_pb2_grpc.AuthStub(running.channel)
    status = await auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5)
    assert not status.enabled and status.authRevision == 1
    assert await _error(
        auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="x"), timeout=5)
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: authentication is not enabled")
    assert list((await auth.UserList(rpc_pb2.AuthUserListRequest(), timeout=5)).users) == []
    await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password="p"), timeout=5)
    assert list((await auth.UserList(rpc_pb2.AuthUserListRequest(), timeout=5)).users) == ["u"]
    assert (await auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5)).authRevision == 2
    assert await _error(auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=5)) == (
        grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: root user does not exist")
    await auth.AuthDisable(rpc_pb2.AuthDisableRequest(), timeout=5)
