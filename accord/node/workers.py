"""Which worker of a node serves a client call, for a node of several (``docs/workers.md``).

Every worker binds the client port (``SO_REUSEPORT``), so a call lands on any of them.
``WorkerRouter.install`` rewrites the worker's method table (``grpc_server.MethodTable``)
so that each etcd method is, on every worker alike:

* **routed** (KV ``Range``, ``Put``, ``DeleteRange``, ``Txn``): served here when this
  worker hosts the key's shard, else forwarded over the owner's forwarding socket
  (``forwardgrpc.py``) and answered with the owner's answer or status. A Range over shards
  of several workers (or at a given revision) is read across them as a multi-shard range
  is read across shards (``StateMachineBackend.range``): a ReadIndex barrier on every
  shard it reads (``RangeTops``: each worker for its shards, answering their highest
  revision), R = the highest (or the requested revision, when the store has it), then
  every worker floors its shards at R and reads them at R (``RangeParts``), and the parts
  are merged here (``fanout.merge_ranges``) after the commit-wait for R. A DeleteRange or
  a Txn over several shards goes to the worker of its lowest shard (the record shard of
  its multi-shard Txn, ``docs/txn.md``), whose coordinator commits the other workers'
  steps through them (``remote_commit``: ``/accord.worker/Commit``, the answers packed by
  ``xresults``); a read-only Txn over several workers' shards is read across them as a
  range is (``TxnCompares`` at R, the branch taken, ``TxnReads`` of it: ``txn_across``);
  a linearizable read across workers answers at its clock revision where the shards'
  read fences hold it, without flooring them (``docs/txn.md``, "The revision of a read");
  the reads across workers are ``workerreads.py``'s;
* **on worker 0** (the member list and member changes, ``Status``, alarms, defragment, auth but its
  ``AuthEnable``; the unary Lease calls): the meta group's calls and the leases' home
  (shard 0), forwarded there from the other workers; a lease's grant and revoke reach
  the other workers' shards as a Txn's steps do (``/accord.worker/Commit``), a
  keepalive stream is served on any worker, each renewal committed by worker 0
  (``KeepAlive``), and a TimeToLive's keys are asked of every worker (``LeaseKeys``);
* **local** (reflection, gRPC health): each worker answers for itself (its health: its
  groups have leaders and the health key reads through its owner; its answers carry the
  node's clock for the peers' clock guards);
* **across every worker** (KV ``Compact``, Maintenance ``HashKV``, ``Hash`` and
  ``MoveLeader``): every worker's shards checked (etcd's ``compacted`` and ``future
  revision`` refusals, nothing changed), then each worker compacts (``RevisionState``,
  ``CompactParts`` on the forwarding socket) or hashes (``HashParts``) its own, as
  ``StateMachineBackend`` compacts every shard of one process and combines their hashes
  in shard order; a Hash is chained through the workers shard by shard (``HashChain``);
  a MoveLeader is checked by worker 0 (whose home group's leader is the node's), then
  every worker hands the groups it leads to the target (``Leaders``): ``workermaint.py``;
* **served here, across workers** (Watch, v3lock, v3election, Snapshot): a watch over
  another worker's shards is fed by that worker and merged here in revision order
  (``workerwatch.py``); the lock and election recipes run here over the routed calls
  (:class:`RoutedLockStore`); a backup is gathered from every worker at one cut
  (``workerbackup.py``);
* **on worker 0, across workers** (accord's own services: the scheduler, checkpoint
  manifests, SWIM membership): served by worker 0, which hosts their groups and SWIM;
  the others forward their unary calls and pull their server streams
  (``forwardstream.py``);
* **refused** (everything else: enabling auth):
  UNIMPLEMENTED with a message naming ``--workers``, never a partial answer from one
  worker's shards.

The forwarding socket of each worker serves the *local* handlers (never the routing
ones: a call is forwarded at most once), the internal range, compaction, hash and
commit steps, and the feeds of watches other workers hold over its shards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
import msgpack

from accord.locks.store import BackendLockStore
from accord.node.backend import ReplicatedBackend
from accord.node.forward import ForwardClient, ForwardedError, Handler
from accord.node.forwardgrpc import (
    DEFAULT_TIMEOUT_S,
    ForwardedContext,
    carried,
    decode_fields,
    forward_unary,
    forwarded_metadata,
    owner_handlers,
)
from accord.node.forwardstream import StreamOwner, StreamPuller
from accord.node.members import DEBUG_GROUPS_METHOD, META_GROUP, groups_report
from accord.node.placement import WorkerPlan
from accord.node.workerbackup import WorkerBackups
from accord.node.workermaint import (
    COMPACT_PARTS,
    HASH_CHAIN,
    HASH_PARTS,
    LEADERS,
    REVISION_STATE,
    REVISIONS_WRITTEN,
    MaintenanceAcrossWorkers,
)
from accord.node.workerreads import (
    RANGE_HELD,
    RANGE_PARTS,
    RANGE_TOPS,
    RANGE_UNAPPLIED,
    TXN_COMPARES,
    TXN_READS,
    ReadsAcrossWorkers,
)
from accord.node.workerwatch import WatchFeeds, WatchLinks
from accord.proto import checkpoints_pb2, membership_pb2, rpc_pb2, scheduling_pb2
from accord.raft.host.multiraft import GroupUnavailable
from accord.services.kv import sharding, xcommands, xresults
from accord.services.kv.codec import spreads_to_every_shard
from accord.services.kv.errors import EtcdError
from accord.services.kv.servicer import fill_header
from accord.services.kv.shardwatch import ShardedWatchHub

KV = "/etcdserverpb.KV/"
COMPACT = f"{KV}Compact"
HASH_KV = "/etcdserverpb.Maintenance/HashKV"
HASH = "/etcdserverpb.Maintenance/Hash"
MOVE_LEADER = "/etcdserverpb.Maintenance/MoveLeader"
COMMIT_ON = "/accord.worker/Commit"
"""Internal: ``[shard, command]`` -> what applying the format-3 ``command`` (a
multi-shard Txn's step) or a lease's grant or revoke on that shard of the owner
answered (``xresults``)."""
KEEPALIVE = "/accord.worker/KeepAlive"
"""Internal, to shard 0's worker: ``lease id`` -> the TTL a renewal granted (0: unknown)."""
LEASE_KEYS = "/accord.worker/LeaseKeys"
"""Internal: ``[lease id, shards]`` -> the lease's keys on those shards (after a barrier)."""
META_BARRIER = "/accord.worker/MetaBarrier"
"""Internal, to worker 0: ``[]`` -> the meta group's applied index after a ReadIndex on
it (another worker's auth guard then waits for its copy to reach it)."""
GROUPS = "/accord.worker/Groups"
"""Internal: ``[]`` -> this worker's ``members.groups_report`` (the debug report of a node
of several workers merges every worker's)."""
MEMBER_GONE = "/accord.worker/MemberGone"
"""Internal: ``[member id]`` -> whether this worker's groups dropped the member within
``members.REMOVE_WAIT`` (a MemberRemove on worker 0 waits for every worker's)."""
LEASE = "/etcdserverpb.Lease/"
WATCH = "/etcdserverpb.Watch/Watch"
LOCKS = {*(f"/v3lockpb.Lock/{m}" for m in ("Lock", "Unlock")),
         *(f"/v3electionpb.Election/{m}" for m in (
             "Campaign", "Proclaim", "Leader", "Observe", "Resign"))}
SNAPSHOT = "/etcdserverpb.Maintenance/Snapshot"
DOWNGRADE = "/etcdserverpb.Maintenance/Downgrade"
SERVED_HERE = {f"{LEASE}LeaseKeepAlive", WATCH, SNAPSHOT, DOWNGRADE, *LOCKS}
"""Served by this worker's own handler: a keepalive's backend commits on shard 0's
worker, a watch's hub watches the other workers' shards through them (``workerwatch``),
the lock and election recipes run over the routed calls (:class:`RoutedLockStore`), a
backup's is gathered from every worker (``workerbackup.py``); a Downgrade is refused as
a node of one process refuses it."""

NODE_SERVICES = {
    f"/{svc.full_name}/{m.name}": (m.server_streaming, getattr(module, m.input_type.name))
    for module in (scheduling_pb2, checkpoints_pb2, membership_pb2)
    for svc in module.DESCRIPTOR.services_by_name.values() for m in svc.methods}
"""accord's own services (method -> whether the server streams, its request class):
served by worker 0, which hosts their groups and SWIM; the other workers forward unary
calls to it and pull its streams (``forwardstream.py``)."""
ROUTED = {f"{KV}Range", f"{KV}Put", f"{KV}DeleteRange", f"{KV}Txn"}
ON_WORKER_0 = {
    *(f"{LEASE}{m}" for m in ("LeaseGrant", "LeaseRevoke", "LeaseTimeToLive", "LeaseLeases")),
    *(f"/etcdserverpb.Cluster/{m}" for m in (
        "MemberList", "MemberAdd", "MemberRemove", "MemberUpdate", "MemberPromote")),
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Alarm",
    "/etcdserverpb.Maintenance/Defragment",
    *(f"/etcdserverpb.Auth/{m}" for m in (
        "AuthEnable", "AuthDisable", "AuthStatus", "Authenticate", "UserAdd", "UserGet", "UserList",
        "UserDelete", "UserChangePassword", "UserGrantRole", "UserRevokeRole", "RoleAdd",
        "RoleGet", "RoleList", "RoleDelete", "RoleGrantPermission", "RoleRevokePermission")),
}
LOCAL_PREFIXES = ("/grpc.reflection.", "/grpc.health.v1.Health/")


def refusal(method: str, workers: int) -> str:
    """The message of a call a node of several workers does not serve yet."""
    return (f"{method} is not served by a node of --workers {workers} yet "
            f"(docs/workers.md, \"Status\"); run it with --workers 1")


def _response_class(method: str) -> Any:
    """The response message class of an etcd method (``/etcdserverpb.S/M``)."""
    service, name = method.strip("/").split("/")
    desc = rpc_pb2.DESCRIPTOR.services_by_name[service.split(".")[-1]].methods_by_name[name]
    return getattr(rpc_pb2, desc.output_type.name)


def _refusing(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of any call shape that fails the call with ``code`` at once (a stream
    handler without deserializers reads nothing, so unary and streaming calls alike)."""
    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - abort raises; this makes it an async generator
    return grpc.stream_stream_rpc_method_handler(refuse)


class RoutedLockStore(BackendLockStore):
    """The lock and election recipes' store on a worker of a node of several: their
    Txns, Ranges and lease grants go where a client's would (``handlers``: the routed
    method table, so served here, forwarded to the owner, or read across workers), and
    their waits watch any shard through the worker's hub."""

    def __init__(self, backend: ReplicatedBackend,
                 handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        super().__init__(backend)
        self._handlers = handlers

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await self._handlers[method].unary_unary(
                request, ForwardedContext((), internal=True))
        except ForwardedError as e:
            raise EtcdError(e.code, e.message) from None

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """A Txn where the router serves it."""
        resp: rpc_pb2.TxnResponse = await self._call(f"{KV}Txn", req)
        return resp

    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """A linearizable read where the router serves it."""
        resp: rpc_pb2.RangeResponse = await self._call(f"{KV}Range", req)
        return resp

    async def lease_grant(self, ttl: int) -> int:
        """A lease granted by worker 0 (the leases' home)."""
        resp = await self._call(f"{LEASE}LeaseGrant", rpc_pb2.LeaseGrantRequest(TTL=ttl))
        return int(resp.ID)


class WorkerRouter(ReadsAcrossWorkers, MaintenanceAcrossWorkers):
    """Routes this worker's client calls (see the module docstring); the reads over
    several workers' shards are :class:`~accord.node.workerreads.ReadsAcrossWorkers`',
    Compact, HashKV, Hash and MoveLeader
    :class:`~accord.node.workermaint.MaintenanceAcrossWorkers`'."""

    def __init__(self, plan: WorkerPlan, index: int, backend: ReplicatedBackend,
                 clients: Mapping[int, ForwardClient]) -> None:
        self.plan = plan
        self.index = index
        self.backend = backend
        self.clients = dict(clients)
        self.forwarded = 0
        """Calls this worker handed to another (for tests and a later metric)."""
        self.wait_gone: Callable[[int], Awaitable[bool]] | None = None
        """How this worker waits for its groups to drop a removed member
        (``MemberChanges.wait_gone``; set by the node)."""
        self.broken_local_commits = False
        """A deliberately broken variant for tests: a multi-shard Txn's step for another
        worker's shard is applied to this worker's empty copy of it, never replicated.
        Never set outside tests."""

    # -- the method table ----------------------------------------------------

    def install(self, handlers: dict[str, grpc.RpcMethodHandler],
                interceptor: Any = None) -> dict[str, Handler]:
        """Rewrite ``handlers`` (the server's method table, in place) for this worker and
        return what its forwarding socket serves: the local handlers' unary ones and the
        internal range steps. ``interceptor`` (the node's ``AuthInterceptor``) checks
        every forwarded call again on arrival, as a call from a client is checked."""
        local = dict(handlers)
        served: dict[str, Handler] = owner_handlers(
            {m: h for m, h in local.items()
             if m in ROUTED or m in ON_WORKER_0 or m in NODE_SERVICES}, interceptor)
        self.streams = StreamOwner(local, interceptor)
        served.update(self.streams.handlers())
        self._puller = StreamPuller(self.index)
        served[RANGE_TOPS] = self._serve_tops
        served[RANGE_PARTS] = self._serve_parts
        served[RANGE_HELD] = self._serve_held
        served[RANGE_UNAPPLIED] = self._serve_unapplied
        served[TXN_COMPARES] = self._serve_txn_compares
        served[TXN_READS] = self._serve_txn_reads
        served[REVISION_STATE] = self._serve_revision_state
        served[COMPACT_PARTS] = self._serve_compact_parts
        served[REVISIONS_WRITTEN] = self._serve_revisions_written
        served[HASH_PARTS] = self._serve_hash_parts
        served[HASH_CHAIN] = self._serve_hash_chain
        served[LEADERS] = self._serve_leaders
        served[COMMIT_ON] = self._serve_commit
        served[MEMBER_GONE] = self._serve_member_gone
        served[GROUPS] = self._serve_groups
        if self.index == 0:  # the debug report, asked of another worker, answered here
            served[DEBUG_GROUPS_METHOD] = self._serve_debug
            served[META_BARRIER] = self._serve_meta_barrier
        served[KEEPALIVE] = self._serve_keepalive
        served[LEASE_KEYS] = self._serve_lease_keys
        hub = self.backend.watch_hub
        assert isinstance(hub, ShardedWatchHub), "a node of several workers has several shards"
        self.feeds = WatchFeeds(hub, frozenset(self.plan.shards_of(self.index)), self.backend.floor)
        served.update(self.feeds.handlers())
        self.links = WatchLinks(self.plan, self.index, self.clients,
                                self.backend.sm.limits.watch_buffer_events)
        hub.remote = self.links
        self.backups = WorkerBackups(self.plan, self.index, self.backend, self.clients,
                                     self._tops)
        served.update(self.backups.handlers())
        self.backend.remote_snapshot = self.backups.snapshot
        self.backend.remote = self.remote_commit
        self.backend.remote_keepalive = self.keepalive_on_home
        self.backend.remote_lease_keys = self.lease_keys_across
        n = self.plan.workers
        for method, h in local.items():
            if method.startswith(LOCAL_PREFIXES) or method in SERVED_HERE:
                continue
            if method in NODE_SERVICES and self.index == 0:
                continue  # worker 0 hosts them
            if method == COMPACT:
                handlers[method] = self._across(h, self.compact_across)
            elif method == HASH_KV:
                handlers[method] = self._across(h, self.hash_kv_across)
            elif method == HASH:
                handlers[method] = self._across(h, self.hash_across)
            elif method == MOVE_LEADER:
                handlers[method] = self._across(h, self.move_leader_across)
            elif method in ROUTED:
                handlers[method] = self._routed(method, h)
            elif method in ON_WORKER_0:
                if self.index != 0:
                    handlers[method] = self._forwarding(method, h, lambda _r: 0)
            else:
                handlers[method] = _refusing(grpc.StatusCode.UNIMPLEMENTED, refusal(method, n))
        return served

    def fallback(self, method: str) -> grpc.RpcMethodHandler | None:
        """A method this worker has no handler for (a service only worker 0 registers):
        refused as the others are, instead of gRPC's bare "Method not found". The local
        methods and the Watch stream (a generic handler of its own) are left to the
        server's other handlers."""
        if method.startswith(LOCAL_PREFIXES) or method == WATCH:
            return None
        if method == DEBUG_GROUPS_METHOD:  # worker 0's generic handler answers it
            return None if self.index == 0 else self._to_worker_0(method, False, None)
        if method in NODE_SERVICES and self.index != 0:
            streaming, request_class = NODE_SERVICES[method]
            return self._to_worker_0(method, streaming, request_class.FromString)
        return _refusing(grpc.StatusCode.UNIMPLEMENTED, refusal(method, self.plan.workers))

    def _to_worker_0(self, method: str, streaming: bool,
                     parse: Callable[[bytes], Any] | None) -> grpc.RpcMethodHandler:
        """A handler serving ``method`` in worker 0 (its requests parsed with ``parse``,
        so that this worker's interceptors see them; its answers passed on as worker 0
        serialized them): a unary call forwarded, a server stream pulled
        (``forwardstream.py``)."""
        client = self.clients[0]

        def raw_of(request: Any) -> bytes:
            return request if isinstance(request, bytes) else bytes(request.SerializeToString())

        if streaming:
            async def pull(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
                self.forwarded += 1
                async for item in self._puller.pull(client, method, raw_of(request), context):
                    yield item
            return grpc.unary_stream_rpc_method_handler(pull, request_deserializer=parse)

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> bytes:
            self.forwarded += 1
            raw = raw_of(request)
            metadata = forwarded_metadata(context)
            left = context.time_remaining()
            try:
                return await client.call(method, msgpack.packb([raw, metadata]),
                                         DEFAULT_TIMEOUT_S if left is None else max(left, 0.001))
            except ForwardedError as e:
                await context.abort(e.code, e.message)
                raise  # abort raises
        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=parse)

    def _forwarding(self, method: str, h: grpc.RpcMethodHandler,
                    owner_of: Callable[[Any], int]) -> grpc.RpcMethodHandler:
        """``h``'s shape, serving the call where ``owner_of(request)`` says."""
        local = h.unary_unary
        deserialize = _response_class(method).FromString

        async def serve(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                owner = owner_of(request)
            except EtcdError as e:
                await context.abort(e.code, e.message)
            if owner == self.index:
                return await local(request, context)
            self.forwarded += 1
            return await forward_unary(self.clients[owner], method, request, context, deserialize)

        return grpc.unary_unary_rpc_method_handler(
            serve, request_deserializer=h.request_deserializer,
            response_serializer=h.response_serializer)

    def _routed(self, method: str, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        name = method[len(KV):]
        if name == "Put":
            return self._forwarding(method, h, lambda r: self._owner([self.backend.shard_of(r.key)]))
        if name == "DeleteRange":
            return self._forwarding(method, h, lambda r: self._owner(
                sharding.shards_of_range(r.key, r.range_end, self.plan.shards)))
        if name == "Txn":
            owned = self._forwarding(method, h, self._txn_owner).unary_unary
            read = self._across(h, self.txn_across).unary_unary

            async def txn(request: rpc_pb2.TxnRequest,
                          context: grpc.aio.ServicerContext) -> rpc_pb2.TxnResponse:
                if self._read_across(request):
                    return await read(request, context)  # type: ignore[no-any-return]
                return await owned(request, context)  # type: ignore[no-any-return]

            return grpc.unary_unary_rpc_method_handler(
                txn, request_deserializer=h.request_deserializer,
                response_serializer=h.response_serializer)
        forward = self._forwarding(method, h, self._range_owner).unary_unary
        across = self._across(h, lambda r: self.range_across(r, self._shards_of(r))).unary_unary

        async def range_(request: rpc_pb2.RangeRequest,
                         context: grpc.aio.ServicerContext) -> rpc_pb2.RangeResponse:
            shards = self._shards_of(request)
            if request.revision == 0 and len({self.plan.worker_of_shard(s) for s in shards}) == 1:
                return await forward(request, context)  # type: ignore[no-any-return]
            return await across(request, context)  # type: ignore[no-any-return]

        return grpc.unary_unary_rpc_method_handler(
            range_, request_deserializer=h.request_deserializer,
            response_serializer=h.response_serializer)

    def _shards_of(self, request: rpc_pb2.RangeRequest) -> list[int]:
        return sharding.shards_of_range(request.key, request.range_end, self.plan.shards)

    def _range_owner(self, request: rpc_pb2.RangeRequest) -> int:
        return self._owner(self._shards_of(request))

    def _owner(self, shards: Sequence[int]) -> int:
        """The worker that serves a call over ``shards``: the owner of the lowest, which
        for a write over several is the record shard of its multi-shard Txn (its
        coordinator then commits the other workers' steps through them)."""
        return self.plan.worker_of_shard(min(shards))

    def _txn_owner(self, req: rpc_pb2.TxnRequest) -> int:
        """:meth:`_owner` of a Txn (a read-only one over several workers' shards is read
        across them instead: :meth:`txn_across`)."""
        return self._owner(sorted(sharding.shards_of_txn(req, self.plan.shards)) or [0])

    def _read_across(self, req: rpc_pb2.TxnRequest) -> bool:
        """Whether ``req`` is a read-only Txn over the shards of several workers."""
        shards = sharding.shards_of_txn(req, self.plan.shards)
        return (len({self.plan.worker_of_shard(s) for s in shards}) > 1
                and self.backend.sm.is_read_only_txn(req))

    # -- a multi-shard Txn's steps on other workers ---------------------------

    async def remote_commit(self, command: bytes, shard: int) -> Any:
        """Commit a multi-shard Txn's ``command`` on ``shard`` of another worker: the owner
        proposes it on its group and answers what its apply returned."""
        owner = self.plan.worker_of_shard(shard)
        if self.broken_local_commits:
            # The broken variant: the step applied to this worker's empty, unreplicated
            # copy of the shard instead of the owner's group.
            return self.backend.machines[shard].apply(command)
        try:
            raw = await self.clients[owner].call(COMMIT_ON, msgpack.packb([shard, command]),
                                                 DEFAULT_TIMEOUT_S)
        except ForwardedError as e:
            raise EtcdError(e.code, e.message) from None
        return xresults.unpack(raw)

    async def _serve_commit(self, body: bytes) -> bytes:
        shard, command = decode_fields(body, 2)
        if not isinstance(command, bytes) or not (xcommands.is_cross_shard(command)
                                                  or spreads_to_every_shard(command)):
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "an internal commit carries only a multi-shard Txn's step "
                                 "or a lease's grant or revoke")
        return xresults.pack(await carried(self.local_commit(command, int(shard))))

    # -- member changes: the table in worker 0, every worker's groups follow ------

    async def members_gone(self, member_id: int) -> None:
        """Wait until the other workers' groups no longer list a removed member (each
        worker's driver takes it out of the groups it leads, ``members.py``)."""
        async def ask(worker: int) -> None:
            try:
                await self.clients[worker].call(MEMBER_GONE, msgpack.packb([member_id]),
                                                DEFAULT_TIMEOUT_S)
            except (ForwardedError, OSError):
                pass  # that worker is restarting: its groups follow the table when back
        await asyncio.gather(*(ask(w) for w in self.clients))

    async def groups_across(self) -> dict[str, Any]:
        """The debug report of the node: every worker's groups in one."""
        report = groups_report(self.backend.node)
        for worker, client in self.clients.items():
            try:
                theirs = json.loads(await client.call(GROUPS, msgpack.packb([]), 5.0))
            except (ForwardedError, OSError, ValueError):
                report.setdefault("unreachable_workers", []).append(worker)
                continue
            report["groups"].update(theirs["groups"])
        return report

    async def _serve_meta_barrier(self, _body: bytes) -> bytes:
        host = self.backend.node.host
        try:
            await host.read_barrier(META_GROUP)
        except GroupUnavailable as e:
            raise ForwardedError(grpc.StatusCode.UNAVAILABLE, str(e)) from None
        return bytes(msgpack.packb(host.group(META_GROUP).applied))

    async def _serve_groups(self, _body: bytes) -> bytes:
        return json.dumps(groups_report(self.backend.node)).encode()

    async def _serve_debug(self, _body: bytes) -> bytes:
        return json.dumps(await self.groups_across()).encode()

    async def _serve_member_gone(self, body: bytes) -> bytes:
        (member_id,) = decode_fields(body, 1)
        if type(member_id) is not int or self.wait_gone is None:
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "a member-gone wait carries [member id]")
        return bytes(msgpack.packb(await self.wait_gone(member_id)))

    # -- leases: their home is shard 0's worker --------------------------------

    async def keepalive_on_home(self, lease_id: int) -> int:
        """A keepalive committed by the worker of shard 0 (the leases' home)."""
        home = self.plan.worker_of_shard(0)
        try:
            raw = await self.clients[home].call(KEEPALIVE, msgpack.packb(lease_id),
                                                DEFAULT_TIMEOUT_S)
        except ForwardedError as e:
            raise EtcdError(e.code, e.message) from None
        return int(msgpack.unpackb(raw))

    async def _serve_keepalive(self, body: bytes) -> bytes:
        try:
            lease_id = int(msgpack.unpackb(body))
        except (ValueError, TypeError, msgpack.UnpackException):
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "an internal keepalive carries a lease id") from None
        self.backend._check_local(0)
        return bytes(msgpack.packb(await carried(self.backend.lease_keepalive(lease_id))))

    async def lease_keys_across(self, shards: Sequence[int], lease_id: int) -> list[bytes]:
        """A lease's keys on other workers' ``shards``, each asked of its worker."""
        async def ask(worker: int, mine: list[int]) -> list[bytes]:
            try:
                raw = await self.clients[worker].call(
                    LEASE_KEYS, msgpack.packb([lease_id, mine]), DEFAULT_TIMEOUT_S)
            except ForwardedError as e:
                raise EtcdError(e.code, e.message) from None
            return [bytes(k) for k in msgpack.unpackb(raw)]

        parts = await asyncio.gather(*(ask(w, s) for w, s in self._by_worker(shards).items()))
        return [k for part in parts for k in part]

    async def _serve_lease_keys(self, body: bytes) -> bytes:
        lease_id, shards = decode_fields(body, 2)
        for s in shards:
            self.backend._check_local(int(s))
        keys = await carried(self.backend.lease_keys_on([int(s) for s in shards], int(lease_id)))
        return bytes(msgpack.packb(keys))

    async def local_commit(self, command: bytes, shard: int) -> Any:
        """A step of another worker's multi-shard Txn on this worker's ``shard``."""
        self.backend._check_local(shard)
        return await self.backend.commit(command, shard)

    # -- calls served here from every worker's shards ---------------------------

    def _across(self, h: grpc.RpcMethodHandler,
                serve: Callable[[Any], Awaitable[Any]]) -> grpc.RpcMethodHandler:
        """``h``'s shape, served by ``serve`` here from every worker's shards."""
        async def across(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                resp = await serve(request)
            except EtcdError as e:
                await context.abort(e.code, e.message)
            except ForwardedError as e:
                await context.abort(e.code, e.message)
            fill_header(resp.header, self.backend)
            return resp

        return grpc.unary_unary_rpc_method_handler(
            across, request_deserializer=h.request_deserializer,
            response_serializer=h.response_serializer)
