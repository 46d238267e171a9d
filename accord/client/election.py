"""``client.election(name)``: campaign, proclaim, leader, observe and resign.

The same recipe as etcd's ``concurrency.Election`` (so ``etcdctl elect`` takes part in
the same elections): campaigners queue under ``name/`` by create revision, the first is
the leader and its value is what it proclaimed. A campaign hangs on a session lease kept
alive in the background; :attr:`Election.lost` is set when that session is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from accord.client.session import Session
from accord.locks import election as recipe
from accord.locks import keys
from accord.locks.errors import NoLeader, NotLeader
from accord.locks.recipe import DEFAULT_RECHECK_S
from accord.proto import kv_pb2

if TYPE_CHECKING:
    from accord.client.base import ClientCalls


class Election:
    """One participant of the election ``name``."""

    def __init__(self, client: ClientCalls, name: bytes | str, *, ttl: int = 10,
                 recheck_s: float = DEFAULT_RECHECK_S) -> None:
        self.name = keys.check_name(name)
        self._client = client
        self._ttl = ttl
        self._recheck_s = recheck_s
        self._session: Session | None = None
        self.leadership: recipe.Leadership | None = None
        self.lost = asyncio.Event()

    async def campaign(self, value: bytes | str) -> recipe.Leadership:
        """Block until this participant leads, with ``value`` proclaimed."""
        v = value.encode() if isinstance(value, str) else value
        if self._session is None or self._session.lost.is_set():
            self._session = await Session(self._client, self._ttl).start()
            self.lost.clear()
            self._session.on_lost(self.lost.set)
        self.leadership = await recipe.campaign(
            self._client.lock_store, self.name, self._session.id, v, recheck_s=self._recheck_s
        )
        return self.leadership

    async def proclaim(self, value: bytes | str) -> int:
        """Change the leader's value; :class:`NotLeader` unless this participant leads."""
        if self.leadership is None:
            raise NotLeader()
        v = value.encode() if isinstance(value, str) else value
        return await recipe.proclaim(self._client.lock_store, self.leadership, v)

    async def leader(self) -> kv_pb2.KeyValue | None:
        """The leader's key-value, or ``None`` when nobody leads."""
        try:
            kv, _rev = await recipe.leader(self._client.lock_store, self.name)
        except NoLeader:
            return None
        return kv

    def observe(self) -> AsyncIterator[kv_pb2.KeyValue]:
        """Every change of leader or value, starting with the current one."""
        return recipe.observe(self._client.lock_store, self.name, recheck_s=self._recheck_s)

    async def resign(self) -> None:
        """Step down (if leading) and end the session."""
        try:
            if self.leadership is not None:
                await recipe.resign(self._client.lock_store, self.leadership)
        finally:
            self.leadership = None
            if self._session is not None:
                await self._session.close()
                self._session = None

    async def __aenter__(self) -> Election:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.leadership is not None or self._session is not None:
            try:
                await self.resign()
            except NotLeader:
                if not self.lost.is_set():
                    raise
