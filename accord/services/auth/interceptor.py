"""The gRPC server interceptor that applies :class:`~accord.services.auth.guard.AuthGuard`
to every call, by method, from one table (:data:`RULES`).

Rules (etcd 3.4's, measured, where etcd has the call):

* ``open``: no credential looked at (MemberList, Status, LeaseKeepAlive,
  LeaseTimeToLive, AuthStatus, health, reflection);
* ``identify``: a token must be valid if one is sent, nobody is also fine (LeaseGrant,
  LeaseLeases, Compact, Authenticate and the Auth admin calls, whose own checks run in
  the servicer and at apply);
* ``keys``: the needs of the request (``needs.py``) must all be granted (KV, LeaseRevoke,
  Lock, Election); the Watch stream checks each create itself;
* ``admin``: a user holding the role root (Cluster member changes, Maintenance's
  Defragment, Hash, HashKV, Snapshot, MoveLeader, Downgrade, Alarm; accord's debug call);
* accord's own services map to *service keys*, reserved names granted like keys
  (``etcdctl role grant-permission ops read __accord/scheduling``): reading the
  scheduler (GetJob, ListJobs, WatchPlacements, ListNodes, Status) needs READ on
  ``__accord/scheduling``, changing it (SubmitJob, CancelJob, HoldJob, ReleaseJob,
  JobFinished, Drain/Undrain) WRITE; GPU agents' RegisterNode/Heartbeat/ReportTask need WRITE on
  ``__accord/scheduling/nodes``;
  the Membership service needs READ on ``__accord/membership``; the Checkpoints service
  maps each job to ``__accord/checkpoints/<job>``: reading a job's manifests (GetManifest,
  ListSteps, WatchLatest) needs READ on it, changing them (Begin, RegisterShards, Commit,
  Abort, SetRetention, Pin, Unpin, MoveTier, GC of named jobs) WRITE; calls over every job
  (ListJobs, a dry-run GC of all jobs: READ; GC of all jobs, ConfirmDeleted: WRITE) need
  the whole prefix ``__accord/checkpoints/`` (``--prefix`` grants).

A method missing from the table needs root: a new service is closed until it is given
a rule. Errors are etcd's; where etcd 3.4 sends the auth store's raw error (Maintenance,
code Unknown, ``auth: ...``) or a client error (Lock/Election, code Unknown,
``etcdserver: ...``), accord sends the same.

While auth is off and a call carries no token, the handler is returned unchanged: auth
costs nothing until it is enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from accord.services.auth import errors, needs
from accord.services.auth.guard import IDENTITY, TOKEN_KEYS, AuthGuard
from accord.services.auth.needs import READ, WRITE, Need
from accord.services.auth.tokens import AuthInfo
from accord.services.kv.errors import EtcdError
from accord.services.kv.ranges import prefix_end


class Rule(enum.Enum):
    """How a method is guarded."""

    OPEN = "open"
    IDENTIFY = "identify"
    KEYS = "keys"
    ADMIN = "admin"
    STREAM = "stream"
    """Identify without refusing: the stream checks each of its requests (Watch)."""


class Style(enum.Enum):
    """How a refusal is worded (etcd 3.4 differs by service)."""

    ETCD = "etcd"
    MAINTENANCE = "maintenance"
    CLIENT = "client"


@dataclass(frozen=True, slots=True)
class MethodRule:
    """One method's rule, its needs (for ``keys``) and the leases whose keys it writes."""

    rule: Rule
    needs: Callable[[Any], Iterable[Need]] | None = None
    leases: Callable[[Any], Iterable[int]] | None = None
    style: Style = Style.ETCD
    read_only: bool = False
    """The call changes nothing: its freshness barrier runs alongside it, and the answer
    is released only once the barrier is done and the check passed (Range)."""


SCHEDULING_KEY = b"__accord/scheduling"
SCHEDULING_NODES_KEY = b"__accord/scheduling/nodes"
MEMBERSHIP_KEY = b"__accord/membership"
CHECKPOINTS_PREFIX = b"__accord/checkpoints/"
"""A job ``J``'s checkpoints are granted as the key ``__accord/checkpoints/J``."""


def _service_key(key: bytes, perm: Any) -> Callable[[Any], Iterator[Need]]:
    def needs_of(request: Any) -> Iterator[Need]:
        yield (key, b"", perm)
    return needs_of


_OPEN = MethodRule(Rule.OPEN)
_IDENTIFY = MethodRule(Rule.IDENTIFY)
_ADMIN = MethodRule(Rule.ADMIN)
_ADMIN_M = MethodRule(Rule.ADMIN, style=Style.MAINTENANCE)


def _put_leases(req: Any) -> Iterator[int]:
    if req.lease:
        yield req.lease


def _revoke_lease(req: Any) -> Iterator[int]:
    yield req.ID


def _no_needs(req: Any) -> Iterator[Need]:
    return iter(())


def _every_job(perm: Any) -> Need:
    return (CHECKPOINTS_PREFIX, prefix_end(CHECKPOINTS_PREFIX), perm)


def _ckpt_job(perm: Any) -> Callable[[Any], Iterator[Need]]:
    def needs_of(request: Any) -> Iterator[Need]:
        yield (CHECKPOINTS_PREFIX + request.job.encode(), b"", perm)
    return needs_of


def _ckpt_every_job(perm: Any) -> Callable[[Any], Iterator[Need]]:
    def needs_of(request: Any) -> Iterator[Need]:
        yield _every_job(perm)
    return needs_of


def _ckpt_gc(request: Any) -> Iterator[Need]:
    perm = READ if request.dry_run else WRITE
    if not request.jobs:
        yield _every_job(perm)
    for job in request.jobs:
        yield (CHECKPOINTS_PREFIX + job.encode(), b"", perm)


_CKPT_READ = MethodRule(Rule.KEYS, _ckpt_job(READ))
_CKPT_WRITE = MethodRule(Rule.KEYS, _ckpt_job(WRITE))

_SCHED_READ = MethodRule(Rule.KEYS, _service_key(SCHEDULING_KEY, READ))
_SCHED_WRITE = MethodRule(Rule.KEYS, _service_key(SCHEDULING_KEY, WRITE))
_SCHED_NODES = MethodRule(Rule.KEYS, _service_key(SCHEDULING_NODES_KEY, WRITE))
_MEMBERSHIP = MethodRule(Rule.KEYS, _service_key(MEMBERSHIP_KEY, READ))

RULES: dict[str, MethodRule] = {
    "/etcdserverpb.KV/Range": MethodRule(Rule.KEYS, needs.range_needs, read_only=True),
    "/etcdserverpb.KV/Put": MethodRule(Rule.KEYS, needs.put_needs, _put_leases),
    "/etcdserverpb.KV/DeleteRange": MethodRule(Rule.KEYS, needs.delete_needs),
    "/etcdserverpb.KV/Txn": MethodRule(Rule.KEYS, needs.txn_needs, needs.txn_leases),
    "/etcdserverpb.KV/Compact": _IDENTIFY,
    "/etcdserverpb.Watch/Watch": MethodRule(Rule.STREAM),
    "/etcdserverpb.Lease/LeaseGrant": _IDENTIFY,
    "/etcdserverpb.Lease/LeaseRevoke": MethodRule(Rule.KEYS, _no_needs, _revoke_lease),
    "/etcdserverpb.Lease/LeaseKeepAlive": _OPEN,
    "/etcdserverpb.Lease/LeaseTimeToLive": _OPEN,
    "/etcdserverpb.Lease/LeaseLeases": _IDENTIFY,
    "/etcdserverpb.Cluster/MemberList": _OPEN,
    "/etcdserverpb.Cluster/MemberAdd": _ADMIN,
    "/etcdserverpb.Cluster/MemberRemove": _ADMIN,
    "/etcdserverpb.Cluster/MemberUpdate": _ADMIN,
    "/etcdserverpb.Cluster/MemberPromote": _ADMIN,
    "/etcdserverpb.Maintenance/Status": _OPEN,
    "/etcdserverpb.Maintenance/Alarm": MethodRule(Rule.IDENTIFY, style=Style.MAINTENANCE),
    "/etcdserverpb.Maintenance/Defragment": _ADMIN_M,
    "/etcdserverpb.Maintenance/Hash": _ADMIN_M,
    "/etcdserverpb.Maintenance/HashKV": _ADMIN_M,
    "/etcdserverpb.Maintenance/Snapshot": _ADMIN_M,
    "/etcdserverpb.Maintenance/MoveLeader": _ADMIN_M,
    "/etcdserverpb.Maintenance/Downgrade": _ADMIN_M,
    "/etcdserverpb.Auth/AuthStatus": _OPEN,
    **{f"/etcdserverpb.Auth/{m}": _IDENTIFY for m in (
        "Authenticate", "AuthEnable", "AuthDisable", "UserAdd", "UserGet", "UserList",
        "UserDelete", "UserChangePassword", "UserGrantRole", "UserRevokeRole", "RoleAdd",
        "RoleGet", "RoleList", "RoleDelete", "RoleGrantPermission", "RoleRevokePermission")},
    "/v3lockpb.Lock/Lock": MethodRule(Rule.KEYS, needs.lock_needs, style=Style.CLIENT),
    "/v3lockpb.Lock/Unlock": MethodRule(Rule.KEYS, needs.unlock_needs, style=Style.CLIENT),
    "/v3electionpb.Election/Campaign": MethodRule(Rule.KEYS, needs.campaign_needs,
                                                  style=Style.CLIENT),
    "/v3electionpb.Election/Proclaim": MethodRule(Rule.KEYS, needs.leader_key_needs,
                                                  style=Style.CLIENT),
    "/v3electionpb.Election/Resign": MethodRule(Rule.KEYS, needs.leader_key_needs,
                                                style=Style.CLIENT),
    "/v3electionpb.Election/Leader": MethodRule(Rule.KEYS, needs.leader_needs,
                                                style=Style.CLIENT),
    "/v3electionpb.Election/Observe": MethodRule(Rule.KEYS, needs.leader_needs,
                                                 style=Style.CLIENT),
    "/accord.scheduling.v1.Scheduler/RegisterNode": _SCHED_NODES,
    "/accord.scheduling.v1.Scheduler/Heartbeat": _SCHED_NODES,
    "/accord.scheduling.v1.Scheduler/ReportTask": _SCHED_NODES,
    "/accord.scheduling.v1.Scheduler/SubmitJob": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/CancelJob": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/HoldJob": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/ReleaseJob": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/JobFinished": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/DrainNode": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/UndrainNode": _SCHED_WRITE,
    "/accord.scheduling.v1.Scheduler/GetJob": _SCHED_READ,
    "/accord.scheduling.v1.Scheduler/ListJobs": _SCHED_READ,
    "/accord.scheduling.v1.Scheduler/WatchPlacements": _SCHED_READ,
    "/accord.scheduling.v1.Scheduler/ListNodes": _SCHED_READ,
    "/accord.scheduling.v1.Scheduler/Status": _SCHED_READ,
    "/accord.membership.v1.Membership/Members": _MEMBERSHIP,
    "/accord.membership.v1.Membership/Watch": _MEMBERSHIP,
    **{f"/accord.checkpoints.v1.Checkpoints/{m}": _CKPT_WRITE for m in (
        "Begin", "RegisterShards", "Commit", "Abort", "SetRetention", "Pin", "Unpin",
        "MoveTier")},
    **{f"/accord.checkpoints.v1.Checkpoints/{m}": _CKPT_READ for m in (
        "GetManifest", "ListSteps", "WatchLatest")},
    "/accord.checkpoints.v1.Checkpoints/ListJobs": MethodRule(Rule.KEYS, _ckpt_every_job(READ)),
    "/accord.checkpoints.v1.Checkpoints/GC": MethodRule(Rule.KEYS, _ckpt_gc),
    "/accord.checkpoints.v1.Checkpoints/ConfirmDeleted":
        MethodRule(Rule.KEYS, _ckpt_every_job(WRITE)),
}
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def rule_of(method: str) -> MethodRule:
    """The rule of a full method name (root only when the table does not know it)."""
    rule = RULES.get(method)
    if rule is not None:
        return rule
    if method.startswith(_OPEN_PREFIXES):
        return _OPEN
    return _ADMIN


def worded(e: EtcdError, style: Style) -> EtcdError:
    """``e`` as the service of ``style`` sends it."""
    if style is Style.MAINTENANCE:
        return errors.MAINTENANCE_ERRORS.get(e, e)
    if style is Style.CLIENT and e.code in errors.CLIENT_WRAPPED_CODES:
        return EtcdError(grpc.StatusCode.UNKNOWN, e.message)
    return e


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Guards every call by :data:`RULES` (see the module docstring)."""

    def __init__(self, guard: AuthGuard) -> None:
        self.guard = guard

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The handler, wrapped with its rule unless auth is off and no token is sent."""
        handler = await continuation(details)
        if handler is None:
            return handler
        rule = rule_of(details.method)
        if rule.rule is Rule.OPEN:
            return handler
        if not self.guard.enabled and not any(
                k in TOKEN_KEYS for k, _ in details.invocation_metadata or ()):
            return handler
        return self._wrap(handler, rule)

    async def _admit(self, rule: MethodRule, request: Any,
                     context: grpc.aio.ServicerContext) -> None:
        """Identify the caller, check its rule, set :data:`IDENTITY`; abort on refusal."""
        guard = self.guard
        try:
            try:
                info: AuthInfo | None = await guard.identify_fresh(
                    context.invocation_metadata(), context.auth_context())
            except EtcdError as e:
                if rule.rule is Rule.STREAM:
                    IDENTITY.set(e)
                    return
                raise
            if rule.rule is Rule.KEYS:
                needs_of = rule.needs(request) if rule.needs and request is not None else ()
                leases = rule.leases(request) if rule.leases and request is not None else ()
                await guard.authorize(info, needs_of, leases)
            elif rule.rule is Rule.ADMIN:
                await guard.authorize_admin(info)
            IDENTITY.set(info)
        except EtcdError as e:
            w = worded(e, rule.style)
            await context.abort(w.code, w.message)

    async def _read(self, rule: MethodRule, inner: Any, request: Any,
                    context: grpc.aio.ServicerContext) -> Any:
        """A read-only call: the barrier and the read run together; the check gates the
        answer (a refused caller gets the refusal, never the data)."""
        guard = self.guard
        try:
            info = await guard.identify_fresh(context.invocation_metadata(),
                                              context.auth_context())
        except EtcdError as e:
            await context.abort(e.code, e.message)
        needs_of = list(rule.needs(request)) if rule.needs else []
        barrier = asyncio.ensure_future(guard.barrier())
        IDENTITY.set(info)
        try:
            resp = await inner(request, context)
        except BaseException:  # the read failed or was cancelled: so is its barrier
            barrier.cancel()
            with contextlib.suppress(BaseException):
                await barrier
            raise
        try:
            await barrier
            guard.check(guard.current(info), needs_of)
        except EtcdError as e:
            w = worded(e, rule.style)
            await context.abort(w.code, w.message)
        return resp

    def _wrap(self, handler: grpc.RpcMethodHandler, rule: MethodRule) -> Any:
        admit = self._admit
        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None and rule.read_only and self.guard.enabled:
            inner_read = handler.unary_unary
            read = self._read

            async def unary_read(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return await read(rule, inner_read, request, context)
            return grpc.unary_unary_rpc_method_handler(unary_read, **kwargs)
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await admit(rule, request, context)
                return await inner_uu(request, context)
            return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await admit(rule, request, context)
                result = inner_us(request, context)
                if inspect.isasyncgen(result):
                    async for item in result:
                        yield item
                else:
                    await result
            return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                await admit(rule, None, context)
                return await inner_su(requests, context)
            return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
        inner_ss = handler.stream_stream

        async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await admit(rule, None, context)
            result = inner_ss(requests, context)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield item
            else:
                await result
        return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
