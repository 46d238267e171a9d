"""``etcdserverpb.Auth``: etcd's user, role and token API on the replicated auth store.

Changes are meta-group commands (``statemachine.py``) carrying the caller, checked for
root at apply; passwords are bcrypt-hashed here, off the event loop, before anything is
proposed, so the log holds hashes only. Reads (UserGet/List, RoleGet/List) are answered
from this member's store after the meta group's read barrier: a user may read itself
and the roles it holds, root everything, as in etcd.

``Authenticate`` checks the password here (bcrypt, off the loop), then either proposes
a simple token (every member records it) or signs a JWT. Neither the password nor the
token is ever logged.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NoReturn, TypeVar

import grpc

from accord.proto import auth_pb2, rpc_pb2, rpc_pb2_grpc
from accord.services.auth import errors
from accord.services.auth.guard import AuthGuard, current_identity
from accord.services.auth.statemachine import encode, hash_digest
from accord.services.auth.store import ROOT
from accord.services.auth.tokens import check_password, hash_password, new_simple_prefix
from accord.services.kv.backend import Backend
from accord.services.kv.errors import EtcdError
from accord.services.kv.servicer import fill_header

R = TypeVar("R")

MSG_JWT_NO_KEY = ("accord: this member has no JWT priv-key and cannot issue tokens; "
                  "authenticate on a member started with priv-key=... in --auth-token")


class AuthServicer(rpc_pb2_grpc.AuthServicer):
    """etcd's Auth service over an :class:`AuthGuard`."""

    def __init__(self, backend: Backend, guard: AuthGuard) -> None:
        self._b = backend
        self._g = guard
        self._dummy_hash: bytes | None = None
        """Checked against for unknown users (at the configured cost), so a wrong name
        costs what a wrong password does and timing does not tell who exists."""

    async def _hash_for_unknown(self) -> bytes:
        if self._dummy_hash is None:
            self._dummy_hash = await asyncio.to_thread(
                hash_password, new_simple_prefix(), self._g.bcrypt_cost)
        return self._dummy_hash

    def _ok(self, resp: R) -> R:
        fill_header(resp.header, self._b, self._b.revision)  # type: ignore[attr-defined]
        return resp

    @staticmethod
    def _actor() -> str:
        info = current_identity()
        return info.user if info else ""

    async def _change(self, context: grpc.aio.ServicerContext, resp: R, op: str,
                      *args: Any) -> R:
        """Propose ``auth.<op>`` with the caller; the answer or etcd's error."""
        try:
            await self._g.commit(encode(op, self._actor(), *args))
        except EtcdError as e:
            await context.abort(e.code, e.message)
        return self._ok(resp)

    async def _admin_first(self, context: grpc.aio.ServicerContext) -> None:
        """Refuse a non-root caller before slow work (apply checks again)."""
        try:
            await self._g.authorize_admin(current_identity())
        except EtcdError as e:
            await context.abort(e.code, e.message)

    async def _fresh(self, context: grpc.aio.ServicerContext) -> None:
        """Wait for the meta group's read barrier, or abort with why it failed."""
        try:
            await self._g.barrier()
        except EtcdError as e:
            await context.abort(e.code, e.message)

    async def _abort(self, context: grpc.aio.ServicerContext, e: EtcdError) -> NoReturn:
        await context.abort(e.code, e.message)
        raise AssertionError("unreachable")

    # --- auth on/off, status, tokens ------------------------------------------------------
    async def AuthEnable(self, request: rpc_pb2.AuthEnableRequest,
                         context: grpc.aio.ServicerContext) -> rpc_pb2.AuthEnableResponse:
        """Turn auth on (needs root holding the root role)."""
        return await self._change(context, rpc_pb2.AuthEnableResponse(), "enable")

    async def AuthDisable(self, request: rpc_pb2.AuthDisableRequest,
                          context: grpc.aio.ServicerContext) -> rpc_pb2.AuthDisableResponse:
        """Turn auth off (root only while on); every simple token dies."""
        return await self._change(context, rpc_pb2.AuthDisableResponse(), "disable")

    async def AuthStatus(self, request: rpc_pb2.AuthStatusRequest,
                         context: grpc.aio.ServicerContext) -> rpc_pb2.AuthStatusResponse:
        """Whether auth is on, and the auth revision."""
        store = self._g.machine.store
        return self._ok(rpc_pb2.AuthStatusResponse(enabled=store.enabled,
                                                   authRevision=store.revision))

    async def Authenticate(self, request: rpc_pb2.AuthenticateRequest,
                           context: grpc.aio.ServicerContext) -> rpc_pb2.AuthenticateResponse:
        """A token for a user whose password matches."""
        g = self._g
        await self._fresh(context)
        store = g.machine.store
        if not store.enabled:
            return await self._abort(context, errors.AUTH_NOT_ENABLED)
        user = store.users.get(request.name)
        phash = user.password_hash if user is not None else await self._hash_for_unknown()
        ok = await asyncio.to_thread(check_password, request.password, phash)
        if user is None or not ok:
            return await self._abort(context, errors.AUTH_FAILED)
        if g.jwt is not None:
            if not g.jwt.can_sign:
                await self._abort(context, EtcdError(grpc.StatusCode.FAILED_PRECONDITION,
                                                     MSG_JWT_NO_KEY))
            token = g.jwt.issue(user.name, store.revision)
        else:
            try:
                token = await g.commit(encode("token", "", user.name, new_simple_prefix(),
                                              hash_digest(phash), int(time.time() * 1000)))
            except EtcdError as e:
                return await self._abort(context, e)
        return self._ok(rpc_pb2.AuthenticateResponse(token=token))

    # --- users ----------------------------------------------------------------------------
    async def UserAdd(self, request: rpc_pb2.AuthUserAddRequest,
                      context: grpc.aio.ServicerContext) -> rpc_pb2.AuthUserAddResponse:
        """Add a user; its password is hashed here (bcrypt, ``--bcrypt-cost``)."""
        await self._admin_first(context)
        no_password = bool(request.HasField("options") and request.options.no_password)
        if no_password:
            phash = b""
        elif request.hashedPassword:
            phash = request.hashedPassword.encode()
        else:
            phash = await asyncio.to_thread(hash_password, request.password, self._g.bcrypt_cost)
        return await self._change(context, rpc_pb2.AuthUserAddResponse(), "user_add",
                                  request.name, phash, no_password)

    async def UserDelete(self, request: rpc_pb2.AuthUserDeleteRequest,
                         context: grpc.aio.ServicerContext) -> rpc_pb2.AuthUserDeleteResponse:
        """Delete a user (never root while auth is on); its tokens die."""
        return await self._change(context, rpc_pb2.AuthUserDeleteResponse(), "user_delete",
                                  request.name)

    async def UserChangePassword(
        self, request: rpc_pb2.AuthUserChangePasswordRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.AuthUserChangePasswordResponse:
        """Set a new password; the user's tokens die."""
        await self._admin_first(context)
        if request.hashedPassword:
            phash = request.hashedPassword.encode()
        else:
            phash = await asyncio.to_thread(hash_password, request.password, self._g.bcrypt_cost)
        return await self._change(context, rpc_pb2.AuthUserChangePasswordResponse(),
                                  "user_passwd", request.name, phash)

    async def UserGrantRole(self, request: rpc_pb2.AuthUserGrantRoleRequest,
                            context: grpc.aio.ServicerContext) -> rpc_pb2.AuthUserGrantRoleResponse:
        """Give a role to a user."""
        return await self._change(context, rpc_pb2.AuthUserGrantRoleResponse(), "user_grant",
                                  request.user, request.role)

    async def UserRevokeRole(
        self, request: rpc_pb2.AuthUserRevokeRoleRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.AuthUserRevokeRoleResponse:
        """Take a role from a user."""
        return await self._change(context, rpc_pb2.AuthUserRevokeRoleResponse(), "user_revoke",
                                  request.name, request.role)

    async def _read_check(self, context: grpc.aio.ServicerContext, allowed: bool) -> None:
        """Root may read everything; others only what ``allowed`` says (etcd's rule)."""
        g = self._g
        await self._fresh(context)
        info = current_identity()
        try:
            g.check_admin(info)
        except EtcdError as e:
            if not allowed or info is None:
                await context.abort(e.code, e.message)

    async def UserGet(self, request: rpc_pb2.AuthUserGetRequest,
                      context: grpc.aio.ServicerContext) -> rpc_pb2.AuthUserGetResponse:
        """A user's roles (root, or the user itself)."""
        info = current_identity()
        await self._read_check(context, info is not None and info.user == request.name)
        try:
            user = self._g.machine.store.user(request.name)
        except EtcdError as e:
            return await self._abort(context, e)
        return self._ok(rpc_pb2.AuthUserGetResponse(roles=list(user.roles)))

    async def UserList(self, request: rpc_pb2.AuthUserListRequest,
                       context: grpc.aio.ServicerContext) -> rpc_pb2.AuthUserListResponse:
        """Every user (root only while auth is on)."""
        await self._read_check(context, False)
        return self._ok(rpc_pb2.AuthUserListResponse(users=self._g.machine.store.user_names()))

    # --- roles ----------------------------------------------------------------------------
    async def RoleAdd(self, request: rpc_pb2.AuthRoleAddRequest,
                      context: grpc.aio.ServicerContext) -> rpc_pb2.AuthRoleAddResponse:
        """Add a role."""
        return await self._change(context, rpc_pb2.AuthRoleAddResponse(), "role_add",
                                  request.name)

    async def RoleDelete(self, request: rpc_pb2.AuthRoleDeleteRequest,
                         context: grpc.aio.ServicerContext) -> rpc_pb2.AuthRoleDeleteResponse:
        """Delete a role (never root while auth is on), taking it from every user."""
        return await self._change(context, rpc_pb2.AuthRoleDeleteResponse(), "role_delete",
                                  request.role)

    async def RoleGrantPermission(
        self, request: rpc_pb2.AuthRoleGrantPermissionRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.AuthRoleGrantPermissionResponse:
        """Grant read, write or readwrite on a key, range or prefix."""
        if not request.HasField("perm"):
            await self._admin_first(context)
            return await self._abort(context, errors.PERMISSION_NOT_GIVEN)
        p = request.perm
        return await self._change(context, rpc_pb2.AuthRoleGrantPermissionResponse(),
                                  "role_grant", request.name, int(p.permType), p.key,
                                  p.range_end)

    async def RoleRevokePermission(
        self, request: rpc_pb2.AuthRoleRevokePermissionRequest, context: grpc.aio.ServicerContext
    ) -> rpc_pb2.AuthRoleRevokePermissionResponse:
        """Take the permission on exactly (key, range_end) from a role."""
        return await self._change(context, rpc_pb2.AuthRoleRevokePermissionResponse(),
                                  "role_revoke", request.role, request.key, request.range_end)

    async def RoleGet(self, request: rpc_pb2.AuthRoleGetRequest,
                      context: grpc.aio.ServicerContext) -> rpc_pb2.AuthRoleGetResponse:
        """A role's permissions (root, or a user holding the role)."""
        info = current_identity()
        store = self._g.machine.store
        holds = info is not None and info.user in store.users and (
            request.role in store.users[info.user].roles)
        await self._read_check(context, holds)
        try:
            role = self._g.machine.store.role(request.role)
        except EtcdError as e:
            return await self._abort(context, e)
        perms = [auth_pb2.Permission(permType=int(p.perm_type), key=p.key,  # type: ignore[arg-type]
                                     range_end=p.range_end) for p in role.perms]
        return self._ok(rpc_pb2.AuthRoleGetResponse(perm=perms))

    async def RoleList(self, request: rpc_pb2.AuthRoleListRequest,
                       context: grpc.aio.ServicerContext) -> rpc_pb2.AuthRoleListResponse:
        """Every role (root only while auth is on)."""
        await self._read_check(context, False)
        return self._ok(rpc_pb2.AuthRoleListResponse(roles=self._g.machine.store.role_names()))


__all__ = ["ROOT", "AuthServicer"]
