"""etcd-compatible KV and Lease gRPC servicers (Watch: ``watchstream.py``).

Thin by design: each RPC translates to one :class:`~accord.services.kv.backend.Backend`
call, fills the response header (cluster id, member id, Raft term; the revision comes
from the store) and turns :class:`~accord.services.kv.errors.EtcdError` into
``context.abort(code, message)`` with etcd's exact code and message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.kv.backend import Backend
from accord.services.kv.errors import EtcdError

R = TypeVar("R")


def fill_header(header: rpc_pb2.ResponseHeader, backend: Backend, revision: int | None = None) -> None:
    """Stamp identity and term on ``header``; set ``revision`` when given, else keep the
    store's (and use the member's current revision if the store left none)."""
    info = backend.header_info()
    header.cluster_id = info.cluster_id
    header.member_id = info.member_id
    header.raft_term = info.raft_term
    if revision is not None:
        header.revision = revision
    elif header.revision == 0:
        header.revision = backend.revision


async def or_abort(context: grpc.aio.ServicerContext, call: Awaitable[R]) -> R:
    """Await a backend call, or abort the RPC with the etcd error it raised."""
    try:
        return await call
    except EtcdError as e:
        await context.abort(e.code, e.message)
        raise  # unreachable: abort raises


async def answer(context: grpc.aio.ServicerContext, backend: Backend, call: Awaitable[R]) -> R:
    """Await a backend call, stamp its header, or abort the RPC with the etcd error.

    (:func:`or_abort` inlined: one coroutine less per request.)"""
    try:
        resp = await call
    except EtcdError as e:
        await context.abort(e.code, e.message)
        raise  # unreachable: abort raises
    fill_header(resp.header, backend)  # type: ignore[attr-defined]
    return resp


class KVServicer(rpc_pb2_grpc.KVServicer):
    """``etcdserverpb.KV``: Range, Put, DeleteRange, Txn, Compact."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def Range(
        self, request: rpc_pb2.RangeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.RangeResponse:
        """Read keys (linearizable unless ``serializable``)."""
        return await answer(context, self._b, self._b.range(request))

    async def Put(
        self, request: rpc_pb2.PutRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.PutResponse:
        """Write one key."""
        return await answer(context, self._b, self._b.put(request))

    async def DeleteRange(
        self, request: rpc_pb2.DeleteRangeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.DeleteRangeResponse:
        """Delete a key range."""
        return await answer(context, self._b, self._b.delete_range(request))

    async def Txn(
        self, request: rpc_pb2.TxnRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.TxnResponse:
        """Guarded multi-op transaction."""
        return await answer(context, self._b, self._b.txn(request))

    async def Compact(
        self, request: rpc_pb2.CompactionRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.CompactionResponse:
        """Compact history."""
        return await answer(context, self._b, self._b.compact(request))


class LeaseServicer(rpc_pb2_grpc.LeaseServicer):
    """``etcdserverpb.Lease``: grant, revoke, the keepalive stream, time-to-live, list."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def LeaseGrant(
        self, request: rpc_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseGrantResponse:
        """Create a lease."""
        return await answer(context, self._b, self._b.lease_grant(request))

    async def LeaseRevoke(
        self, request: rpc_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseRevokeResponse:
        """Revoke a lease (its keys are deleted)."""
        return await answer(context, self._b, self._b.lease_revoke(request))

    async def LeaseKeepAlive(
        self,
        request_iterator: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rpc_pb2.LeaseKeepAliveResponse]:
        """One reply per request, in order; ``TTL=0`` (not an error) for an unknown lease."""
        async for req in request_iterator:
            try:
                ttl = await self._b.lease_keepalive(req.ID)
            except EtcdError as e:
                await context.abort(e.code, e.message)
                return
            resp = rpc_pb2.LeaseKeepAliveResponse(ID=req.ID, TTL=ttl)
            fill_header(resp.header, self._b, self._b.revision)
            yield resp

    async def LeaseTimeToLive(
        self, request: rpc_pb2.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseTimeToLiveResponse:
        """Remaining TTL (``-1`` for an unknown lease) and optionally the attached keys."""
        return await answer(context, self._b, self._b.lease_time_to_live(request))

    async def LeaseLeases(
        self, request: rpc_pb2.LeaseLeasesRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.LeaseLeasesResponse:
        """Every live lease."""
        return await answer(context, self._b, self._b.lease_leases())
