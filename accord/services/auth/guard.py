"""The one enforcement point: who a request comes from, and whether it may do what it asks.

The interceptor (``interceptor.py``) calls :meth:`AuthGuard.identify` and
:meth:`AuthGuard.authorize` for every call; the Watch stream calls
:meth:`AuthGuard.watch_refusal` for every watch it creates; the Auth servicer uses the
same guard for Authenticate and the admin checks. Nothing else decides.

Identity (etcd's ``AuthInfoFromCtx``): the ``token`` metadata (``authorization`` as the
gateway sends it) names a simple token or a JWT; a token that is not valid is etcd's
``invalid auth token``, whatever the call. Without a token, and with
``--client-cert-auth``, the common name of the verified client certificate is the user.

Freshness: while auth is on, every check first waits for this member to have applied
everything the meta group committed before the request arrived (``barrier``, a ReadIndex
on the meta group, shared by all requests of one round), so a permission revoked through
any member is refused on every member from the moment the revoke is answered.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any

import msgpack

from accord.services.auth import errors
from accord.services.auth.needs import Need
from accord.services.auth.perms import PermType
from accord.services.auth.statemachine import AuthStateMachine, admin_error
from accord.services.auth.tokens import DEFAULT_BCRYPT_COST, AuthInfo, JWTTokens
from accord.services.kv.errors import EtcdError

Identity = AuthInfo | EtcdError | None
"""Who a call comes from: a user, the error its credential earned, or nobody."""

IDENTITY: ContextVar[Identity] = ContextVar("accord_auth_identity", default=None)
"""Set by the interceptor for the call being served."""

TOKEN_KEYS = ("token", "authorization")
FORWARDED_USER = "accord_forwarded_user"
"""The ``auth_context`` key under which a call forwarded between the worker processes of
one node (``node/forwardgrpc.py``) names the user the receiving worker identified. Only
the forwarding socket's own context sets it; a client's metadata never becomes it."""


async def _no_barrier() -> None:
    return None


class AuthGuard:
    """Identifies callers and checks their permissions against the replicated store."""

    def __init__(
        self,
        machine: AuthStateMachine,
        *,
        commit: Callable[[bytes], Awaitable[Any]],
        barrier: Callable[[], Awaitable[None]] = _no_barrier,
        lease_keys: Callable[[int], Awaitable[list[bytes]]] | None = None,
        jwt: JWTTokens | None = None,
        client_cert_auth: bool = False,
        bcrypt_cost: int = DEFAULT_BCRYPT_COST,
    ) -> None:
        if not 4 <= bcrypt_cost <= 31:
            raise ValueError(f"--bcrypt-cost must be in 4..31, got {bcrypt_cost}")
        self.machine = machine
        self.commit = commit
        self.barrier = barrier
        self.lease_keys = lease_keys
        """The keys attached to a lease (set by the server when not given)."""
        self.jwt = jwt
        self.client_cert_auth = client_cert_auth
        self.bcrypt_cost = bcrypt_cost
        self.lagging = False
        """This member's auth state is a copy that may trail its meta group (a worker
        of a node of several, ``docs/workers.md``): a token it does not know yet is
        looked up again after the barrier (:meth:`identify_fresh`)."""

    @property
    def enabled(self) -> bool:
        """Whether auth is on (on this member, as of its last applied meta entry)."""
        return self.machine.store.enabled

    # --- identity -------------------------------------------------------------------------
    def identify(self, metadata: Iterable[tuple[str, Any]] | None,
                 auth_context: dict[str, list[bytes]] | None) -> AuthInfo | None:
        """The caller, or ``None`` for nobody; raises ``invalid auth token``."""
        token = None
        for key, value in metadata or ():
            if key in TOKEN_KEYS:
                token = value if isinstance(value, str) else bytes(value).decode("latin-1")
                break
        if token is not None:
            info = self._token_info(token)
            if info is None:
                raise errors.INVALID_AUTH_TOKEN
            return info
        if auth_context and (forwarded := auth_context.get(FORWARDED_USER)):
            return AuthInfo(forwarded[0].decode("utf-8", "replace"),
                            self.machine.store.revision, at_lookup=True)
        if self.client_cert_auth and auth_context:
            names = auth_context.get("x509_common_name")
            if names:
                return AuthInfo(names[0].decode("utf-8", "replace"), self.machine.store.revision,
                                at_lookup=True)
        return None

    async def identify_fresh(self, metadata: Iterable[tuple[str, Any]] | None,
                             auth_context: dict[str, list[bytes]] | None) -> AuthInfo | None:
        """:meth:`identify`; on a :attr:`lagging` copy, a token not known yet is looked
        up again once the copy caught up with its meta group (a token issued a moment
        ago through another worker)."""
        try:
            return self.identify(metadata, auth_context)
        except EtcdError as e:
            if not self.lagging or e.message != errors.INVALID_AUTH_TOKEN.message:
                raise
        await self.barrier()
        return self.identify(metadata, auth_context)

    def _token_info(self, token: str) -> AuthInfo | None:
        if self.jwt is not None and token.count(".") == 2:
            return self.jwt.info(token)
        user = self.machine.tokens.user_of(token)
        if user is None:
            return None
        return AuthInfo(user, self.machine.store.revision, token, at_lookup=True)

    def current(self, info: AuthInfo | None) -> AuthInfo | None:
        """``info`` looked up again after the barrier, as etcd looks a caller up only after
        its own: a simple token revoked meanwhile (its user's password changed, the user
        deleted) is ``invalid auth token``, not an old revision; a certificate's user
        speaks for the current revision. A JWT keeps the revision it carries."""
        if info is None or not info.at_lookup:
            return info
        if info.token is None:
            return AuthInfo(info.user, self.machine.store.revision, at_lookup=True)
        again = self._token_info(info.token)
        if again is None:
            raise errors.INVALID_AUTH_TOKEN
        return again

    # --- checks ---------------------------------------------------------------------------
    def check(self, info: AuthInfo | None, needs: Iterable[Need]) -> None:
        """etcd's ``isOpPermitted`` for each need; raises the first refusal."""
        store = self.machine.store
        if not store.enabled:
            return
        if info is None:
            raise errors.USER_EMPTY
        if info.revision < store.revision:
            raise errors.AUTH_OLD_REVISION
        rights = store.rights(info.user)
        if rights is None:
            raise errors.PERMISSION_DENIED
        for key, end, perm in needs:
            if not rights.allows(key, end, perm):
                raise errors.PERMISSION_DENIED

    def check_admin(self, info: AuthInfo | None) -> None:
        """etcd's ``IsAdminPermitted``: while auth is on, only a user holding root."""
        err = admin_error(self.machine.store, info.user if info else "")
        if err is not None:
            raise err

    async def lease_needs(self, lease_ids: Iterable[int]) -> list[Need]:
        """WRITE on every key attached to each lease (etcd's ``checkLeasePuts``)."""
        needs: list[Need] = []
        if self.lease_keys is None:
            return needs
        for lease in lease_ids:
            if lease:
                needs.extend((k, b"", PermType.WRITE) for k in await self.lease_keys(lease))
        return needs

    async def authorize(self, info: AuthInfo | None, needs: Iterable[Need],
                        leases: Iterable[int] = ()) -> None:
        """Wait until this member's auth state is current, then :meth:`check`."""
        if not self.enabled:
            return
        await self.barrier()
        info = self.current(info)
        needs = list(needs)
        leases = list(leases)
        if leases:
            needs.extend(await self.lease_needs(leases))
        self.check(info, needs)

    async def authorize_admin(self, info: AuthInfo | None) -> None:
        """Wait until current, then :meth:`check_admin`."""
        if not self.enabled:
            return
        await self.barrier()
        self.check_admin(self.current(info))

    async def watch_refusal(self, needs: Iterable[Need]) -> str | None:
        """The cancel reason etcd gives a watch the caller may not create, or ``None``."""
        ident = IDENTITY.get()
        if not self.enabled and not isinstance(ident, EtcdError):
            return None
        try:
            if isinstance(ident, EtcdError):
                raise ident
            await self.authorize(ident, needs)
        except EtcdError as e:
            return go_status_text(e)
        return None


def local_guard(**options: Any) -> AuthGuard:
    """A guard whose changes apply at once to an in-process store (no replication)."""
    machine = AuthStateMachine()
    index = itertools.count(1)

    async def commit(command: bytes) -> Any:
        op, *args = msgpack.unpackb(command)
        return machine.apply(next(index), op, args)

    return AuthGuard(machine, commit=commit, **options)


def go_status_text(e: EtcdError) -> str:
    """``e`` as Go's ``status.Error(...).Error()`` prints it (etcd's watch cancel reasons)."""
    code = "".join(part.capitalize() for part in e.code.name.split("_"))
    return f"rpc error: code = {code} desc = {e.message}"


def current_identity() -> AuthInfo | None:
    """The caller of the call being served (the interceptor already refused bad tokens)."""
    ident = IDENTITY.get()
    return ident if isinstance(ident, AuthInfo) else None
