"""The node's auth: the meta group's auth store and the guard every call goes through.

Auth changes and simple tokens are meta-group proposals; the guard's freshness barrier
is a ReadIndex on the meta group (``docs/security.md`` has the reasoning and the cost).
"""

from __future__ import annotations

from typing import Any

from accord.node.backend import unavailable
from accord.node.config import Config
from accord.node.members import META_GROUP
from accord.raft.host.multiraft import GroupUnavailable, MultiRaftHost
from accord.services.auth.guard import AuthGuard
from accord.services.auth.statemachine import AuthStateMachine
from accord.services.auth.tokens import SimpleTokens, parse_token_spec


def auth_machine(cfg: Config) -> AuthStateMachine:
    """The auth part of the meta group's state machine, with ``--auth-token-ttl``."""
    return AuthStateMachine(SimpleTokens(ttl_s=cfg.auth_token_ttl))


def auth_guard(cfg: Config, machine: AuthStateMachine, host: MultiRaftHost) -> AuthGuard:
    """The guard of this node: commits and barriers on the meta group."""

    async def commit(command: bytes) -> Any:
        try:
            return await host.propose(META_GROUP, command)
        except GroupUnavailable as e:
            raise unavailable(e) from None

    async def barrier() -> None:
        try:
            await host.read_barrier(META_GROUP)
        except GroupUnavailable as e:
            raise unavailable(e) from None

    spec = parse_token_spec(cfg.auth_token)
    return AuthGuard(
        machine, commit=commit, barrier=barrier,
        jwt=spec.jwt() if spec.kind == "jwt" else None,
        client_cert_auth=cfg.client_cert_auth,
        bcrypt_cost=cfg.bcrypt_cost,
    )
