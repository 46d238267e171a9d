"""etcd unary calls forwarded between workers over real gRPC and a real Unix socket
(accord/node/forwardgrpc.py on accord/node/forward.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from accord.node.forward import ForwardClient, ForwardServer
from accord.node.forwardgrpc import forward_unary, owner_handlers
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.auth.guard import AuthGuard
from accord.services.auth.interceptor import AuthInterceptor
from tests.security.authstores import store_with_user

RANGE = "/etcdserverpb.KV/Range"
PUT = "/etcdserverpb.KV/Put"


class OwnerKV:
    """The owning worker's servicer: Range answers with the key and the caller's token,
    Put refuses as etcd does for a missing lease, and waits when asked to."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def Range(self, request: rpc_pb2.RangeRequest, context: Any) -> rpc_pb2.RangeResponse:
        token = dict(context.invocation_metadata()).get("token", "")
        kv = rpc_pb2.RangeResponse(count=1)
        item = kv.kvs.add()
        item.key = request.key
        item.value = str(token).encode()
        return kv

    async def Put(self, request: rpc_pb2.PutRequest, context: Any) -> rpc_pb2.PutResponse:
        if request.key == b"slow":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        await context.abort(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")


def generated(servicer: OwnerKV) -> dict[str, grpc.RpcMethodHandler]:
    return {
        RANGE: grpc.unary_unary_rpc_method_handler(
            servicer.Range, request_deserializer=rpc_pb2.RangeRequest.FromString,
            response_serializer=rpc_pb2.RangeResponse.SerializeToString),
        PUT: grpc.unary_unary_rpc_method_handler(
            servicer.Put, request_deserializer=rpc_pb2.PutRequest.FromString,
            response_serializer=rpc_pb2.PutResponse.SerializeToString),
    }


class Stripped:
    """Broken variant's context: forwards without the caller's metadata."""

    def __init__(self, context: Any) -> None:
        self._c = context

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def front(client: ForwardClient, broken: bool) -> grpc.GenericRpcHandler:
    """The worker the client's connection landed on: forwards every KV call it gets."""

    def forwarding(method: str, deserialize: Any) -> Any:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            ctx: Any = Stripped(context) if broken else context
            return await forward_unary(client, method, request, ctx, deserialize)
        return handle

    return grpc.method_handlers_generic_handler("etcdserverpb.KV", {
        "Range": grpc.unary_unary_rpc_method_handler(
            forwarding(RANGE, rpc_pb2.RangeResponse.FromString),
            request_deserializer=rpc_pb2.RangeRequest.FromString,
            response_serializer=rpc_pb2.RangeResponse.SerializeToString),
        "Put": grpc.unary_unary_rpc_method_handler(
            forwarding(PUT, rpc_pb2.PutResponse.FromString),
            request_deserializer=rpc_pb2.PutRequest.FromString,
            response_serializer=rpc_pb2.PutResponse.SerializeToString),
    })


@contextlib.asynccontextmanager
async def worker_pair(sock: Path, owner: OwnerKV, *, broken: bool = False,
                      owner_interceptor: Any = None, front_interceptors: Sequence[Any] = (),
                      ) -> AsyncIterator[rpc_pb2_grpc.KVStub]:
    """The owner serving ``owner`` on the forwarding socket ``sock`` (its calls through
    ``owner_interceptor``), and a front worker's gRPC server forwarding every KV call to
    it (``broken``: without the caller's metadata): a KV stub on the front."""
    fwd = ForwardServer(sock, owner_handlers(generated(owner), owner_interceptor))
    await fwd.start()
    client = ForwardClient(sock)
    server = grpc.aio.server(interceptors=list(front_interceptors))
    server.add_generic_rpc_handlers((front(client, broken),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield rpc_pb2_grpc.KVStub(channel)
    finally:
        await channel.close()
        await server.stop(None)
        await client.close()
        await fwd.stop()


@pytest.fixture
async def node(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[OwnerKV, rpc_pb2_grpc.KVStub]]:
    owner = OwnerKV()
    async with worker_pair(tmp_path / "worker-1.sock", owner,
                           broken=getattr(request, "param", False)) as kv:
        yield owner, kv


async def test_a_forwarded_range_is_answered_by_the_owner_with_the_callers_metadata(node: Any) -> None:
    _, kv = node
    resp = await kv.Range(rpc_pb2.RangeRequest(key=b"/a/b"), metadata=(("token", "tok.1"),), timeout=10)
    assert [(x.key, x.value) for x in resp.kvs] == [(b"/a/b", b"tok.1")]


@pytest.mark.parametrize("node", [True], indirect=True)
async def test_broken_variant_that_drops_metadata_is_caught(node: Any) -> None:
    _, kv = node
    resp = await kv.Range(rpc_pb2.RangeRequest(key=b"/a/b"), metadata=(("token", "tok.1"),), timeout=10)
    assert [(x.key, x.value) for x in resp.kvs] != [(b"/a/b", b"tok.1")]


async def test_the_owners_error_is_the_callers_status(node: Any) -> None:
    _, kv = node
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v", lease=7), timeout=10)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert exc.value.details() == "etcdserver: requested lease not found"


async def test_the_callers_deadline_reaches_the_owner(node: Any) -> None:
    owner, kv = node
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await kv.Put(rpc_pb2.PutRequest(key=b"slow", value=b"v"), timeout=0.5)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(owner.cancelled.wait(), 10)


def test_only_unary_calls_are_forwarded() -> None:
    async def watch(requests: Any, context: Any) -> Any:
        yield rpc_pb2.WatchResponse()

    handlers = {**generated(OwnerKV()), "/etcdserverpb.Watch/Watch": grpc.stream_stream_rpc_method_handler(watch)}
    assert sorted(owner_handlers(handlers)) == [PUT, RANGE]


# --- the owner checks a forwarded call again ------------------------------------------
async def _no_commit(command: bytes) -> Any:
    raise AssertionError("no commit expected")


@pytest.mark.parametrize("owner_checks", [True, False])
async def test_a_call_forwarded_on_a_stale_grant_is_refused_by_the_owner(
        tmp_path: Path, owner_checks: bool) -> None:
    """The worker a call lands on checks it against its copy of the auth state, which
    may lag; the owner checks it again against its own. Here the owner already applied
    the revoke of ``u``'s role and the front has not: the owner refuses. The broken
    variant (the owner trusts the forwarding worker: no check there) answers it."""
    issued = int(time.time() * 1000)
    front_sm, token, _, _ = store_with_user(b"/a", b"/b", issued)
    owner_sm, owner_token, owner_run, _ = store_with_user(b"/a", b"/b", issued)
    assert owner_token == token  # the same token on both copies (same id, same time)
    owner_run("user_revoke", "u", "r")
    front_guard = AuthGuard(front_sm, commit=_no_commit)
    owner_guard = AuthGuard(owner_sm, commit=_no_commit)
    async with worker_pair(tmp_path / "worker-1.sock", OwnerKV(),
                           owner_interceptor=AuthInterceptor(owner_guard) if owner_checks else None,
                           front_interceptors=[AuthInterceptor(front_guard)]) as kv:
        call = kv.Range(rpc_pb2.RangeRequest(key=b"/a/1"), metadata=(("token", token),),
                        timeout=10)
        if owner_checks:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await call
            assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert exc.value.details() == "etcdserver: permission denied"
        else:
            assert [x.key for x in (await call).kvs] == [b"/a/1"]
