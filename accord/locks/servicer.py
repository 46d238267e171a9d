"""etcd's v3lock ``Lock`` and v3election ``Election`` services, served from the lock recipes.

Semantics follow etcd's gateway servers: ``Lock`` blocks until the lock named ``name`` is
held by ``lease`` and returns the ownership key ``name/<lease hex>``; ``Unlock`` deletes
that key; ``Campaign``/``Proclaim``/``Leader``/``Observe``/``Resign`` follow
``v3election.proto``. The recipes (:mod:`accord.locks.recipe`, :mod:`accord.locks.election`)
run here over the member's backend, so these services and ``etcdctl lock``/``elect``
(which run the client-side recipe) share one queue.

Where accord is stricter than etcd (a clear error instead of a silent no-op), the
message says so: ``Unlock`` of a key that is not held answers FAILED_PRECONDITION, and a
``Lock`` whose lease expires while it waits fails instead of reporting a grant (etcd
#11456). A client that cancels a waiting ``Lock``/``Campaign`` leaves the queue.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from accord.locks import election, recipe
from accord.locks.errors import LockError
from accord.locks.store import BackendLockStore, LockStore
from accord.proto import (
    v3election_pb2,
    v3election_pb2_grpc,
    v3lock_pb2,
    v3lock_pb2_grpc,
)
from accord.services.kv.backend import Backend
from accord.services.kv.errors import EtcdError
from accord.services.kv.servicer import fill_header

T = TypeVar("T")

MISSING_LEADER = '"leader" field must be provided'
"""etcd's message when Proclaim/Resign come without a leader key."""


async def _run(context: grpc.aio.ServicerContext, call: Awaitable[T]) -> T:
    """Await ``call``; turn lock and store errors into the RPC's status."""
    try:
        return await call
    except LockError as e:
        await context.abort(e.code, e.message)
        raise  # unreachable: abort raises
    except EtcdError as e:
        await context.abort(e.code, e.message)
        raise


class LockServicer(v3lock_pb2_grpc.LockServicer):
    """v3lockpb.Lock on one member."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend
        self.store: LockStore = BackendLockStore(backend)
        """Where the recipe runs (a worker of a node of several routes it: ``docs/workers.md``)."""

    async def Lock(
        self, request: v3lock_pb2.LockRequest, context: grpc.aio.ServicerContext
    ) -> v3lock_pb2.LockResponse:
        """Block until ``request.lease`` holds lock ``request.name``; its key."""
        held = await _run(context, recipe.acquire(self.store, request.name, request.lease))
        resp = v3lock_pb2.LockResponse(key=held.key)
        fill_header(resp.header, self._b, max(held.grant_revision, self._b.revision))
        return resp

    async def Unlock(
        self, request: v3lock_pb2.UnlockRequest, context: grpc.aio.ServicerContext
    ) -> v3lock_pb2.UnlockResponse:
        """Delete the ownership key (and its grant record)."""
        rev = await _run(context, recipe.unlock_key(self.store, request.key))
        resp = v3lock_pb2.UnlockResponse()
        fill_header(resp.header, self._b, rev)
        return resp


def _leadership(key: v3election_pb2.LeaderKey) -> election.Leadership:
    return election.Leadership(bytes(key.name), bytes(key.key), int(key.rev), int(key.lease))


class ElectionServicer(v3election_pb2_grpc.ElectionServicer):
    """v3electionpb.Election on one member."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend
        self.store: LockStore = BackendLockStore(backend)
        """Where the recipes run (a worker of a node of several routes them)."""

    async def Campaign(
        self, request: v3election_pb2.CampaignRequest, context: grpc.aio.ServicerContext
    ) -> v3election_pb2.CampaignResponse:
        """Block until elected; the leader key."""
        won = await _run(
            context, election.campaign(self.store, request.name, request.lease, request.value)
        )
        resp = v3election_pb2.CampaignResponse(leader=v3election_pb2.LeaderKey(
            name=won.name, key=won.key, rev=won.rev, lease=won.lease,
        ))
        fill_header(resp.header, self._b, self._b.revision)
        return resp

    async def Proclaim(
        self, request: v3election_pb2.ProclaimRequest, context: grpc.aio.ServicerContext
    ) -> v3election_pb2.ProclaimResponse:
        """Set the leader's value while still leader."""
        if not request.HasField("leader"):
            await context.abort(grpc.StatusCode.UNKNOWN, MISSING_LEADER)
        rev = await _run(
            context, election.proclaim(self.store, _leadership(request.leader), request.value)
        )
        resp = v3election_pb2.ProclaimResponse()
        fill_header(resp.header, self._b, rev)
        return resp

    async def Leader(
        self, request: v3election_pb2.LeaderRequest, context: grpc.aio.ServicerContext
    ) -> v3election_pb2.LeaderResponse:
        """The current leader's key-value."""
        kv, rev = await _run(context, election.leader(self.store, request.name))
        resp = v3election_pb2.LeaderResponse(kv=kv)
        fill_header(resp.header, self._b, rev)
        return resp

    async def Observe(
        self, request: v3election_pb2.LeaderRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v3election_pb2.LeaderResponse]:
        """Stream the leader's key-value on every change of leader or value."""
        stream = election.observe(self.store, request.name)
        try:
            while True:
                kv = await _run(context, anext(stream))
                resp = v3election_pb2.LeaderResponse(kv=kv)
                fill_header(resp.header, self._b, max(int(kv.mod_revision), self._b.revision))
                yield resp
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def Resign(
        self, request: v3election_pb2.ResignRequest, context: grpc.aio.ServicerContext
    ) -> v3election_pb2.ResignResponse:
        """Give up leadership."""
        if not request.HasField("leader"):
            await context.abort(grpc.StatusCode.UNKNOWN, MISSING_LEADER)
        rev = await _run(context, election.resign(self.store, _leadership(request.leader)))
        resp = v3election_pb2.ResignResponse()
        fill_header(resp.header, self._b, rev)
        return resp


def add_lock_services(server: grpc.aio.Server,
                      backend: Backend) -> tuple[LockServicer, ElectionServicer]:
    """Register the v3lock ``Lock`` and v3election ``Election`` servicers on ``server``;
    the two servicers."""
    locks, elections = LockServicer(backend), ElectionServicer(backend)
    servicer: object
    for module, name, servicer in (
        (v3lock_pb2_grpc, "add_LockServicer_to_server", locks),
        (v3election_pb2_grpc, "add_ElectionServicer_to_server", elections),
    ):
        register: Callable[[object, grpc.aio.Server], None] = getattr(module, name)
        register(servicer, server)
    return locks, elections
