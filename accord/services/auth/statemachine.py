"""The auth store as the meta group replicates it: commands, apply, snapshots.

Every auth change is a meta-group command (msgpack ``["auth.<op>", actor, ...]``) so all
members change their store at the same log index and the change survives restarts (the
WAL) and snapshots (:meth:`AuthStateMachine.image`). ``actor`` is the user the request
came from (``""`` for none): while auth is on, only a user holding the role root may
change anything, and that is decided *at apply* against the store as it is at that log
index, as etcd's auth applier does, so a request checked just before its caller lost
root is still refused.

``auth.token`` records a simple token on every member (``tokens.py``); the password was
checked by the member that proposed it, and the entry carries only a digest of the hash
it checked, so a password changed in between makes the token fail.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgpack

from accord.services.auth import errors
from accord.services.auth.perms import Permission, PermType
from accord.services.auth.store import AuthStore
from accord.services.auth.tokens import SimpleTokens
from accord.services.kv.errors import EtcdError

OP_PREFIX = "auth."
AUTH_FORMAT = 3
"""The meta-group command format from which a member applies ``auth.*`` commands. An
older member would refuse them and stop applying its log, so they are proposed only once
every member advertised it (the cluster-version gate, ``docs/operations.md``)."""

ADMIN_OPS = frozenset({
    "enable", "disable", "user_add", "user_delete", "user_passwd", "user_grant",
    "user_revoke", "role_add", "role_delete", "role_grant", "role_revoke",
})


def hash_digest(password_hash: bytes) -> bytes:
    """A short digest of a password hash, carried by ``auth.token`` entries."""
    return hashlib.sha256(password_hash).digest()[:16]


def admin_error(store: AuthStore, actor: str) -> EtcdError | None:
    """etcd's ``IsAdminPermitted``: the error for a non-root ``actor`` while auth is on."""
    if not store.enabled:
        return None
    if not actor:
        return errors.USER_EMPTY
    if actor not in store.users:
        return errors.USER_NOT_FOUND
    if not store.is_root(actor):
        return errors.PERMISSION_DENIED
    return None


def encode(op: str, actor: str, *args: Any) -> bytes:
    """A meta-group command for the auth store."""
    return bytes(msgpack.packb([OP_PREFIX + op, actor, *args]))


class AuthStateMachine:
    """Applies ``auth.*`` meta-group commands to an :class:`AuthStore` and a token table."""

    def __init__(self, tokens: SimpleTokens | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.store = AuthStore()
        self.tokens = tokens or SimpleTokens()
        self._wall = wall_clock
        self.listeners: list[Callable[[], None]] = []
        """Called after every applied change (on every replica)."""

    @staticmethod
    def handles(op: str) -> bool:
        """Whether a meta-group command name is one of this machine's."""
        return op.startswith(OP_PREFIX)

    def apply(self, index: int, op: str, args: list[Any]) -> object:
        """Apply ``auth.<op>`` (already unpacked); returns its answer or raises EtcdError."""
        name = op[len(OP_PREFIX):]
        actor, *rest = args
        if name in ADMIN_OPS:
            err = admin_error(self.store, actor)
            if err is not None:
                raise err
        handler = self._handlers.get(name)
        if handler is None:
            raise ValueError(f"unknown auth command {op!r}")
        result = handler(self, index, *rest)
        for listener in self.listeners:
            listener()
        return result

    # --- handlers -----------------------------------------------------------------------
    def _enable(self, index: int) -> None:
        self.store.enable()

    def _disable(self, index: int) -> None:
        self.store.disable()
        self.tokens.clear()

    def _user_add(self, index: int, name: str, phash: bytes, no_password: bool) -> None:
        self.store.user_add(name, phash, no_password)

    def _user_delete(self, index: int, name: str) -> None:
        self.store.user_delete(name)
        self.tokens.invalidate_user(name)

    def _user_passwd(self, index: int, name: str, phash: bytes) -> None:
        self.store.user_change_password(name, phash)
        self.tokens.invalidate_user(name)

    def _user_grant(self, index: int, name: str, role: str) -> None:
        self.store.user_grant_role(name, role)

    def _user_revoke(self, index: int, name: str, role: str) -> None:
        self.store.user_revoke_role(name, role)

    def _role_add(self, index: int, name: str) -> None:
        self.store.role_add(name)

    def _role_delete(self, index: int, name: str) -> None:
        self.store.role_delete(name)

    def _role_grant(self, index: int, name: str, ptype: int, key: bytes, end: bytes) -> None:
        if ptype not in (0, 1, 2):
            raise errors.PERMISSION_NOT_GIVEN
        self.store.role_grant_permission(name, Permission(PermType(ptype), key, end))

    def _role_revoke(self, index: int, name: str, key: bytes, end: bytes) -> None:
        self.store.role_revoke_permission(name, key, end)

    def _token(self, index: int, user: str, prefix: str, digest: bytes, issued_ms: int) -> str:
        if not self.store.enabled:
            raise errors.AUTH_NOT_ENABLED
        u = self.store.users.get(user)
        if u is None or hash_digest(u.password_hash) != digest:
            raise errors.AUTH_FAILED
        token = f"{prefix}.{index}"
        self.tokens.assign(token, user, age_s=self._wall() - issued_ms / 1000)
        return token

    _handlers: dict[str, Callable[..., Any]] = {
        "enable": _enable, "disable": _disable, "user_add": _user_add,
        "user_delete": _user_delete, "user_passwd": _user_passwd, "user_grant": _user_grant,
        "user_revoke": _user_revoke, "role_add": _role_add, "role_delete": _role_delete,
        "role_grant": _role_grant, "role_revoke": _role_revoke, "token": _token,
    }

    # --- snapshots ----------------------------------------------------------------------
    def image(self) -> dict[str, object]:
        """The store and the live simple tokens (with their wall-clock issue time)."""
        image = self.store.image()
        now = self._wall()
        image["tokens"] = [[t, u, int((now - age) * 1000)] for t, u, age in self.tokens.live()]
        return image

    def restore(self, image: dict[str, object] | None) -> None:
        """Replace everything by an :meth:`image` (``None``: a snapshot from before auth)."""
        self.store = AuthStore.from_image(image) if image else AuthStore()
        self.tokens.clear()
        now = self._wall()
        for token, user, issued_ms in (image or {}).get("tokens", ()):  # type: ignore[attr-defined]
            self.tokens.assign(token, user, age_s=now - issued_ms / 1000)
        for listener in self.listeners:
            listener()
