"""etcd-compatible Cluster and Maintenance gRPC servicers (Auth: ``accord/services/auth``).

Thin, like the KV servicers: translate, call the :class:`~accord.services.kv.backend.Backend`,
fill the header, map :class:`~accord.services.kv.errors.EtcdError` to ``context.abort``.

``Maintenance.Snapshot`` streams the backend's backup file (``snapfile.py``): a bbolt
database in etcd's layout plus every group's state, followed by its SHA-256, which is
what etcd streams, so ``etcdctl snapshot save``, ``status`` and ``restore`` work on it.

Who may call what (root for member changes and most of Maintenance) is the auth
interceptor's (``accord/services/auth/interceptor.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

import grpc

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.kv.backend import Backend, MemberInfo
from accord.services.kv.errors import EtcdError
from accord.services.kv.servicer import fill_header, or_abort

T = TypeVar("T")

SNAPSHOT_CHUNK = 32 * 1024
"""Blob bytes per SnapshotResponse (etcd sends 32 KiB chunks)."""

MSG_BAD_URLS = "etcdserver: given member URLs are invalid"


def _member_pb(m: MemberInfo) -> rpc_pb2.Member:
    return rpc_pb2.Member(
        ID=m.id,
        name=m.name,
        peerURLs=list(m.peer_urls),
        clientURLs=list(m.client_urls),
        isLearner=m.is_learner,
    )


def _check_urls(urls: Sequence[str]) -> None:
    """etcd's URL rules for members: http(s)://host:port, no path."""
    if not urls:
        raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT, MSG_BAD_URLS, "no peer URLs given")
    for url in urls:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT, MSG_BAD_URLS, str(e)) from e
        if parts.scheme not in ("http", "https", "unix", "unixs") or not parts.hostname:
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT, MSG_BAD_URLS, f"bad URL {url!r}")
        if parts.scheme in ("http", "https") and port is None:
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT, MSG_BAD_URLS, f"no port in {url!r}")
        if parts.path not in ("", "/"):
            raise EtcdError(grpc.StatusCode.INVALID_ARGUMENT, MSG_BAD_URLS, f"path in {url!r}")


async def _with_checked_urls(urls: Sequence[str], call: Callable[[], Awaitable[T]]) -> T:
    """Validate member URLs (etcd's rules), then make the backend call."""
    _check_urls(urls)
    return await call()


class ClusterServicer(rpc_pb2_grpc.ClusterServicer):
    """``etcdserverpb.Cluster``: members, mapped to accord's node changes by the backend."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend

    def _header(self, resp: object) -> None:
        # etcd's cluster responses carry ids and term but no revision.
        fill_header(resp.header, self._b, 0)  # type: ignore[attr-defined]

    async def MemberList(
        self, request: rpc_pb2.MemberListRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.MemberListResponse:
        """Every member."""
        members = await or_abort(context, self._b.members(request.linearizable))
        resp = rpc_pb2.MemberListResponse(members=[_member_pb(m) for m in members])
        self._header(resp)
        return resp

    async def MemberAdd(
        self, request: rpc_pb2.MemberAddRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.MemberAddResponse:
        """Add a member (a node joining)."""
        urls = list(request.peerURLs)
        added, members = await or_abort(
            context, _with_checked_urls(urls, lambda: self._b.member_add(urls, request.isLearner))
        )
        resp = rpc_pb2.MemberAddResponse(
            member=_member_pb(added), members=[_member_pb(m) for m in members]
        )
        self._header(resp)
        return resp

    async def MemberRemove(
        self, request: rpc_pb2.MemberRemoveRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.MemberRemoveResponse:
        """Remove a member (a node leaving)."""
        members = await or_abort(context, self._b.member_remove(request.ID))
        resp = rpc_pb2.MemberRemoveResponse(members=[_member_pb(m) for m in members])
        self._header(resp)
        return resp

    async def MemberUpdate(
        self, request: rpc_pb2.MemberUpdateRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.MemberUpdateResponse:
        """Change a member's peer URLs."""
        urls = list(request.peerURLs)
        members = await or_abort(
            context, _with_checked_urls(urls, lambda: self._b.member_update(request.ID, urls))
        )
        resp = rpc_pb2.MemberUpdateResponse(members=[_member_pb(m) for m in members])
        self._header(resp)
        return resp

    async def MemberPromote(
        self, request: rpc_pb2.MemberPromoteRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.MemberPromoteResponse:
        """Promote a learner to voter."""
        members = await or_abort(context, self._b.member_promote(request.ID))
        resp = rpc_pb2.MemberPromoteResponse(members=[_member_pb(m) for m in members])
        self._header(resp)
        return resp


class MaintenanceServicer(rpc_pb2_grpc.MaintenanceServicer):
    """``etcdserverpb.Maintenance``: Status, Alarm, Snapshot, Defragment, Hash, HashKV, ..."""

    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def _simple(self, context: grpc.aio.ServicerContext, resp: object) -> None:
        fill_header(resp.header, self._b, self._b.revision)  # type: ignore[attr-defined]

    async def Status(
        self, request: rpc_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.StatusResponse:
        """This member's version, sizes, leader, Raft indexes and alarms."""
        st = await or_abort(context, self._b.status())
        resp = rpc_pb2.StatusResponse(
            version=st.version,
            dbSize=st.db_size,
            dbSizeInUse=st.db_size_in_use,
            leader=st.leader,
            raftIndex=st.raft_index,
            raftTerm=st.raft_term,
            raftAppliedIndex=st.raft_applied_index,
            errors=list(st.errors),
            isLearner=st.is_learner,
        )
        await self._simple(context, resp)
        return resp

    async def Alarm(
        self, request: rpc_pb2.AlarmRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.AlarmResponse:
        """GET, ACTIVATE or DEACTIVATE alarms."""
        alarms = await or_abort(context, self._b.alarm(request))
        resp = rpc_pb2.AlarmResponse(
            alarms=[rpc_pb2.AlarmMember(memberID=m, alarm=a) for m, a in alarms]  # type: ignore[arg-type]
        )
        await self._simple(context, resp)
        return resp

    async def Defragment(
        self, request: rpc_pb2.DefragmentRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.DefragmentResponse:
        """Reclaim space on this member."""
        await or_abort(context, self._b.defragment())
        resp = rpc_pb2.DefragmentResponse()
        await self._simple(context, resp)
        return resp

    async def Hash(
        self, request: rpc_pb2.HashRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.HashResponse:
        """Hash of this member's whole store."""
        h = await or_abort(context, self._b.hash())
        resp = rpc_pb2.HashResponse(hash=h)
        await self._simple(context, resp)
        return resp

    async def HashKV(
        self, request: rpc_pb2.HashKVRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.HashKVResponse:
        """Hash of the MVCC keys up to a revision (comparable across members)."""
        r = await or_abort(context, self._b.hash_kv(request.revision))
        resp = rpc_pb2.HashKVResponse(hash=r.hash, compact_revision=r.compact_revision)
        fill_header(resp.header, self._b, r.revision)
        return resp

    async def Snapshot(
        self, request: rpc_pb2.SnapshotRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rpc_pb2.SnapshotResponse]:
        """Stream the backup file (module docstring), 32 KiB per message."""
        revision, blob = await or_abort(context, self._b.snapshot())
        total = len(blob)
        for start in range(0, total, SNAPSHOT_CHUNK):
            chunk = blob[start : start + SNAPSHOT_CHUNK]
            resp = rpc_pb2.SnapshotResponse(
                remaining_bytes=total - start - len(chunk), blob=chunk
            )
            fill_header(resp.header, self._b, revision)
            yield resp

    async def MoveLeader(
        self, request: rpc_pb2.MoveLeaderRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.MoveLeaderResponse:
        """Transfer leadership."""
        await or_abort(context, self._b.move_leader(request.targetID))
        resp = rpc_pb2.MoveLeaderResponse()
        await self._simple(context, resp)
        return resp

    async def Downgrade(
        self, request: rpc_pb2.DowngradeRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.DowngradeResponse:
        """Refused: accord's on-disk formats are its own, there is no etcd version to go to."""
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "accord: cluster version downgrade is not supported (accord reports an etcd API "
            "version for client compatibility only)",
        )
        raise AssertionError("unreachable")
