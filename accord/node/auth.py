"""The node's auth: the meta group's auth store and the guard every call goes through.

Auth changes and simple tokens are meta-group proposals; the guard's freshness barrier
is a ReadIndex on the meta group (``docs/security.md`` has the reasoning and the cost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from accord.node.backend import unavailable
from accord.node.config import Config
from accord.node.members import META_GROUP
from accord.raft.host.multiraft import GroupUnavailable, MultiRaftHost
from accord.services.auth.guard import AuthGuard
from accord.services.auth.statemachine import AUTH_FORMAT, AuthStateMachine
from accord.services.auth.tokens import SimpleTokens, parse_token_spec
from accord.services.cluster.members import ClusterStateMachine
from accord.services.kv.errors import EtcdError

GATE_WAIT_S = 5.0
"""How long an auth change waits for every member to advertise ``AUTH_FORMAT`` (members
advertise at start) before it is refused."""
MSG_OLD_MEMBERS = ("accord: auth changes need every member to apply command format "
                   f"{AUTH_FORMAT}; upgrade every member first (docs/operations.md)")


def auth_machine(cfg: Config) -> AuthStateMachine:
    """The auth part of the meta group's state machine, with ``--auth-token-ttl``."""
    return AuthStateMachine(SimpleTokens(ttl_s=cfg.auth_token_ttl))


def auth_guard(cfg: Config, cluster: ClusterStateMachine, host: MultiRaftHost,
               meta_barrier: Callable[[], Awaitable[None]] | None = None) -> AuthGuard:
    """The guard of this node: commits (behind the version gate) and barriers on the
    meta group. ``meta_barrier``: on a worker without the meta group (a node of several,
    ``docs/workers.md``), how its copy of the meta state catches up with the meta group
    (its auth calls themselves are served by worker 0): the guard then knows its state
    may trail (``AuthGuard.lagging``)."""

    async def commit(command: bytes) -> Any:
        for _ in range(int(GATE_WAIT_S / 0.1)):
            if cluster.min_command_format() >= AUTH_FORMAT:
                break
            await asyncio.sleep(0.1)
        else:
            raise EtcdError(grpc.StatusCode.FAILED_PRECONDITION, MSG_OLD_MEMBERS)
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
    guard = AuthGuard(
        cluster.auth, commit=commit, barrier=barrier if meta_barrier is None else meta_barrier,
        jwt=spec.jwt() if spec.kind == "jwt" else None,
        client_cert_auth=cfg.client_cert_auth,
        bcrypt_cost=cfg.bcrypt_cost,
    )
    guard.lagging = meta_barrier is not None
    return guard
