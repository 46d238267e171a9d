"""The assembled gRPC server: health, reflection, metadata, transport limits and keepalive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from accord.node.grpc_server import ServerOptions
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.kv import watchstream
from accord.services.kv.backend import HeaderInfo
from accord.services.kv.local import LocalBackend
from tests.api.conftest import Running, start, stop


async def test_health_serving_for_every_service(running: Running) -> None:
    stub = health_pb2_grpc.HealthStub(running.channel)
    for name in ("", "etcdserverpb.KV", "etcdserverpb.Watch", "etcdserverpb.Maintenance"):
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_etcd_services(running: Running) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(running.channel)

    async def one() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names: set[str] = set()
    async for resp in stub.ServerReflectionInfo(one(), timeout=5):
        names |= {s.name for s in resp.list_services_response.service}
    assert {
        "etcdserverpb.KV",
        "etcdserverpb.Watch",
        "etcdserverpb.Lease",
        "etcdserverpb.Cluster",
        "etcdserverpb.Maintenance",
        "etcdserverpb.Auth",
        "grpc.health.v1.Health",
    } <= names


async def test_hasleader_refused_without_leader_and_versions_counted(running: Running) -> None:
    kv = rpc_pb2_grpc.KVStub(running.channel)
    md = (("client-api-version", "3.4"), ("hasleader", "true"))
    await kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=md, timeout=5)
    assert running.server.client_api_versions["3.4"] == 1
    backend = running.backend
    real = backend.header_info
    backend.header_info = lambda: HeaderInfo(real().cluster_id, real().member_id, 1, 0)  # type: ignore[method-assign]
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=md, timeout=5)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.UNAVAILABLE,
            "etcdserver: no leader",
        )
        call = rpc_pb2_grpc.WatchStub(running.channel).Watch(metadata=md, timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as winfo:
            await call.read()
        assert winfo.value.details() == "etcdserver: no leader"
        # Without the metadata the member still answers (serializable-style callers).
        await kv.Range(rpc_pb2.RangeRequest(key=b"k"), timeout=5)
    finally:
        backend.header_info = real  # type: ignore[method-assign]
    assert running.server.client_api_versions["3.4"] == 3


async def test_request_size_limits() -> None:
    backend = await LocalBackend.open(max_request_bytes=64 * 1024)
    r = await start(backend, ServerOptions(max_request_bytes=64 * 1024))
    try:
        kv = rpc_pb2_grpc.KVStub(r.channel)
        await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"x" * 60_000), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"x" * 100_000), timeout=5)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "etcdserver: request is too large",
        )
        # Past max_request_bytes + 512 KiB gRPC itself refuses the message.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"x" * 700_000), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        got = await kv.Range(rpc_pb2.RangeRequest(key=b"k"), timeout=5)
        assert len(got.kvs[0].value) == 60_000  # the refused requests changed nothing
    finally:
        await stop(r)


async def test_large_responses_are_not_limited() -> None:
    backend = await LocalBackend.open()
    r = await start(backend, channel_options=[("grpc.max_receive_message_length", -1)])
    try:
        kv = rpc_pb2_grpc.KVStub(r.channel)
        for i in range(4):  # 4 x 1.2 MiB: a 4.8 MiB Range response, over gRPC's 4 MiB default
            await kv.Put(rpc_pb2.PutRequest(key=b"big%d" % i, value=b"x" * 1_250_000), timeout=5)
        got = await kv.Range(rpc_pb2.RangeRequest(key=b"big", range_end=b"bih"), timeout=10)
        assert got.count == 4 and sum(len(kv.value) for kv in got.kvs) == 5_000_000
    finally:
        await stop(r)


def test_server_options_are_etcds_and_validated() -> None:
    args = dict(ServerOptions().channel_args())
    assert args["grpc.http2.min_ping_interval_without_data_ms"] == 5000
    assert args["grpc.keepalive_permit_without_calls"] == 1
    assert args["grpc.http2.max_ping_strikes"] == 0
    assert args["grpc.max_send_message_length"] == -1
    assert args["grpc.max_receive_message_length"] == 3 * 1024 * 1024 // 2 + 512 * 1024
    with pytest.raises(ValueError, match="max_request_bytes"):
        ServerOptions(max_request_bytes=0)


@pytest.mark.parametrize("share", [False, True])
async def test_the_client_port_is_shared_only_when_asked(share: bool) -> None:
    """Workers of one node bind the same client port (SO_REUSEPORT); a lone node's port
    stays its own, so a second server on it fails to bind."""
    args = ServerOptions(share_port=share).channel_args()
    first = grpc.aio.server(options=args)
    second = grpc.aio.server(options=args)
    try:
        port = first.add_insecure_port("127.0.0.1:0")
        await first.start()
        if share:
            assert second.add_insecure_port(f"127.0.0.1:{port}") == port
            await second.start()
        else:
            with pytest.raises(RuntimeError):
                second.add_insecure_port(f"127.0.0.1:{port}")
    finally:
        await first.stop(None)
        await second.stop(None)
    with pytest.raises(ValueError, match="share_port"):
        ServerOptions(share_port=1)  # type: ignore[arg-type]


async def test_frequent_client_pings_do_not_drop_idle_watch(running: Running) -> None:
    """A client pinging every second (more often than gRPC's default server allows: it
    answers GOAWAY "too many pings" within ~3 s) keeps its idle watch stream."""
    channel = grpc.aio.insecure_channel(
        running.endpoint,
        options=[
            ("grpc.keepalive_time_ms", 1000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )
    try:
        stop_requests = asyncio.Event()

        async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
            yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"idle"))
            await stop_requests.wait()

        call = rpc_pb2_grpc.WatchStub(channel).Watch(requests())
        created = await asyncio.wait_for(call.read(), 5)
        assert created.created
        await asyncio.sleep(4)
        await rpc_pb2_grpc.KVStub(channel).Put(rpc_pb2.PutRequest(key=b"idle", value=b"v"), timeout=5)
        event = await asyncio.wait_for(call.read(), 5)
        assert event.events[0].kv.key == b"idle"
        assert running.server.watch.open_streams == 1
        stop_requests.set()
        call.cancel()
    finally:
        await channel.close()


@contextlib.asynccontextmanager
async def _hasleader_watch(running: Running, key: bytes) -> AsyncIterator[Any]:
    """A created ``hasleader`` watch stream on ``key`` (its request side kept open)."""
    never = asyncio.Event()

    async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
        yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key))
        await never.wait()

    call = rpc_pb2_grpc.WatchStub(running.channel).Watch(
        requests(), metadata=(("hasleader", "true"),), timeout=10
    )
    assert (await call.read()).created
    try:
        yield call
    finally:
        never.set()
        call.cancel()


@contextlib.contextmanager
def _no_leader(backend: Any) -> Iterator[None]:
    """The member knows no leader while inside."""
    real = backend.header_info
    backend.header_info = lambda: HeaderInfo(real().cluster_id, real().member_id, 1, 0)
    try:
        yield
    finally:
        backend.header_info = real


async def test_hasleader_watch_ends_when_leader_is_lost(running: Running) -> None:
    async with _hasleader_watch(running, b"l") as call:
        with _no_leader(running.backend), pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(call.read(), 5)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.UNAVAILABLE,
            "etcdserver: no leader",
        )


async def test_hasleader_watch_outlives_a_moment_without_a_leader(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An election or a leadership transfer leaves a member without a leader for a
    moment; like etcd, only a loss lasting three checks ends a ``hasleader`` stream."""
    monkeypatch.setattr(watchstream, "_LEADER_CHECK_S", 0.05)
    async with _hasleader_watch(running, b"m") as call:
        with _no_leader(running.backend):
            await asyncio.sleep(0.07)  # at most two checks see no leader
        await asyncio.sleep(0.3)
        kv = rpc_pb2_grpc.KVStub(running.channel)
        await kv.Put(rpc_pb2.PutRequest(key=b"m", value=b"still here"), timeout=5)
        got = await asyncio.wait_for(call.read(), 5)
        assert [ev.kv.value for ev in got.events] == [b"still here"]


async def test_thousands_of_calls_in_flight_are_all_served(running: Running) -> None:
    """gRPC's core cancels calls beyond ~1,000 waiting for the Python server unless told
    otherwise; etcd serves them all, and so must accord."""
    kv = rpc_pb2_grpc.KVStub(running.channel)
    await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), timeout=5)
    calls = [kv.Range(rpc_pb2.RangeRequest(key=b"k"), timeout=60) for _ in range(4000)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} of 4000 calls failed, first: {failed[0]!r}"
    assert all(r.kvs[0].value == b"v" for r in results)  # type: ignore[union-attr]


async def test_registered_methods_are_served_from_one_table() -> None:
    """Every service answers through the method table, and the server keeps no request
    task per method (grpc.aio waits on all of them for every call: ~90 us each)."""
    backend = await LocalBackend.open()
    before = len(asyncio.all_tasks())
    r = await start(backend)
    try:
        table = r.server.methods
        assert "/etcdserverpb.KV/Put" in table.handlers
        assert "/etcdserverpb.Lease/LeaseGrant" in table.handlers
        assert "/grpc.health.v1.Health/Check" in table.handlers
        # A registered method costs grpc.aio a request task each (78 on a node).
        assert len(asyncio.all_tasks()) - before < 10
        kv = rpc_pb2_grpc.KVStub(r.channel)
        await kv.Put(rpc_pb2.PutRequest(key=b"t", value=b"v"), timeout=5)
        got = await kv.Range(rpc_pb2.RangeRequest(key=b"t"), timeout=5)
        assert [kv.value for kv in got.kvs] == [b"v"]
        lease = await rpc_pb2_grpc.LeaseStub(r.channel).LeaseGrant(
            rpc_pb2.LeaseGrantRequest(TTL=30), timeout=5)
        assert lease.ID > 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await r.channel.unary_unary("/etcdserverpb.KV/NoSuchMethod")(b"", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await stop(r)
