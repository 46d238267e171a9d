"""``async with client.lock(name, ttl=...) as lock``: a fenced lock held by a session.

Entering grants a session lease (kept alive in the background), queues for the lock and
returns once the grant is committed; ``lock.token`` is the fencing token. ``lock.lost``
is set when the lock can no longer be trusted: the session's lease expired or was
revoked (or could not be renewed within its TTL), or the lock key was deleted. Writes
that must not outlive the lock go through :meth:`Lock.guarded_put` /
:meth:`Lock.guarded_txn`: the store applies them only while the token still holds the
lock, atomically, and otherwise raises
:class:`~accord.locks.errors.FencedWriteRejected`. Leaving releases the lock and revokes
the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accord.client.errors import ClientError
from accord.client.session import Session
from accord.locks import keys, recipe
from accord.locks import ops as o
from accord.locks.errors import NotHeld
from accord.proto import rpc_pb2

if TYPE_CHECKING:
    from accord.client.base import ClientCalls


class Lock:
    """One acquisition of a named lock (an async context manager; use it once)."""

    def __init__(
        self, client: ClientCalls, name: bytes | str, *, ttl: int = 10,
        lock_delay: float = 0.0, session: Session | None = None,
        recheck_s: float = recipe.DEFAULT_RECHECK_S,
    ) -> None:
        self.name = keys.check_name(name)
        if lock_delay < 0:
            raise ValueError(f"lock_delay must be >= 0 seconds, got {lock_delay}")
        self._client = client
        self._ttl = ttl
        self._lock_delay_ms = round(lock_delay * 1000)
        self._session = session
        self._own_session = session is None
        self._recheck_s = recheck_s
        self.holding: recipe.Holding | None = None
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._monitor: asyncio.Task[None] | None = None
        self._released = False

    @property
    def token(self) -> int:
        """The fencing token (the lock key's create revision)."""
        if self.holding is None:
            raise NotHeld(f"lock '{self.name.decode(errors='backslashreplace')}' is not held")
        return self.holding.token

    @property
    def key(self) -> bytes:
        """The lock key ``name/<lease hex>``."""
        if self.holding is None:
            raise NotHeld(f"lock '{self.name.decode(errors='backslashreplace')}' is not held")
        return self.holding.key

    @property
    def session(self) -> Session | None:
        """The session (lease) the lock hangs on."""
        return self._session

    async def acquire(self) -> Lock:
        """Queue and wait until granted."""
        if self._session is None:
            self._session = await Session(self._client, self._ttl).start()
        try:
            self.holding = await recipe.acquire(
                self._client.lock_store, self.name, self._session.id,
                lock_delay_ms=self._lock_delay_ms, recheck_s=self._recheck_s,
            )
        except BaseException:
            if self._own_session:
                await self._session.close()
            raise
        self._session.on_lost(lambda: self._mark_lost(self._session.lost_reason if self._session else ""))
        self._monitor = asyncio.create_task(self._watch_key(), name="accord-lock-monitor")
        return self

    def _mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    async def _watch_key(self) -> None:
        """Set :attr:`lost` once the lock key is gone (watch as hint, re-read as truth)."""
        assert self.holding is not None
        h = self.holding
        rev = h.grant_revision
        while not self.lost.is_set():
            await self._client.lock_store.wait_change([(h.key, b"")], rev, self._recheck_s)
            try:
                resp = await self._client.range_raw(rpc_pb2.RangeRequest(key=h.key))
            except ClientError:
                continue
            rev = max(rev, int(resp.header.revision))
            if not resp.kvs or resp.kvs[0].create_revision != h.token:
                self._mark_lost(f"lock key {h.key!r} was deleted (lease expired or revoked)")

    async def guarded_put(self, key: bytes | str, value: bytes | str) -> int:
        """Put ``key`` only while this lock's token holds; the write's revision."""
        k = key.encode() if isinstance(key, str) else key
        v = value.encode() if isinstance(value, str) else value
        resp = await self.guarded_txn([o.put(k, v)])
        return int(resp.header.revision)

    async def guarded_txn(self, ops: Sequence[rpc_pb2.RequestOp]) -> rpc_pb2.TxnResponse:
        """Apply ``ops`` atomically only while this lock's token holds."""
        if self.holding is None:
            raise NotHeld(f"lock '{self.name.decode(errors='backslashreplace')}' is not held")
        return await recipe.guarded_txn(self._client.lock_store, self.holding, ops)

    async def release(self) -> None:
        """Release the lock (and revoke the session this lock created).

        :attr:`token` stays readable afterwards; guarded writes with it are refused.
        Raises :class:`NotHeld` if the lock was lost without :attr:`lost` being set yet.
        """
        if self._released:
            raise NotHeld(
                f"lock '{self.name.decode(errors='backslashreplace')}' was released already"
            )
        self._released = True
        try:
            if self._monitor is not None:
                self._monitor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._monitor
                self._monitor = None
            if self.holding is not None:
                try:
                    await recipe.release(self._client.lock_store, self.holding)
                except NotHeld:
                    if not self.lost.is_set():
                        raise
        finally:
            if self._own_session and self._session is not None:
                await self._session.close()

    async def __aenter__(self) -> Lock:
        return await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        await self.release()
