"""A lease kept alive in the background: the session that locks and elections hang on.

The keepalive task renews the lease every ``ttl / 3`` seconds (through any endpoint). The
session counts as *lost* — :attr:`Session.lost` is set and renewal stops — as soon as
either the cluster answers that the lease is gone (``TTL <= 0``), or the local deadline
passes: ``send time of the last successful renewal + the TTL it granted``. The local
deadline is conservative (it starts when the renewal was sent, before the cluster
stamped it), so a session never believes it is alive after the cluster expired it, as
long as clocks run at the same rate; the cluster may keep the lease a little longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from accord.client import stubs
from accord.client.errors import ClientError
from accord.proto import rpc_pb2

if TYPE_CHECKING:
    from accord.client.base import ClientCalls


class Session:
    """A granted lease with background keepalive; use as ``async with``."""

    def __init__(self, client: ClientCalls, ttl: int) -> None:
        if ttl <= 0:
            raise ValueError(f"session ttl must be a positive number of seconds, got {ttl}")
        self._client = client
        self.requested_ttl = ttl
        self.id = 0
        self.ttl = 0
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._deadline = 0.0
        self._task: asyncio.Task[None] | None = None
        self._callbacks: list[Callable[[], None]] = []

    async def start(self) -> Session:
        """Grant the lease and start renewing it."""
        sent = time.monotonic()
        resp = await self._client.lease_grant(self.requested_ttl)
        self.id, self.ttl = resp.id, resp.ttl
        self._deadline = sent + self.ttl
        self._task = asyncio.create_task(self._keepalive(), name=f"accord-session-{self.id:x}")
        return self

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the session is lost (at once if it already is)."""
        if self.lost.is_set():
            callback()
        else:
            self._callbacks.append(callback)

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        for cb in self._callbacks:
            cb()
        self._callbacks.clear()

    async def _keepalive(self) -> None:
        while not self.lost.is_set():
            now = time.monotonic()
            remaining = self._deadline - now
            if remaining <= 0:
                self._mark_lost(f"lease {self.id:x} not renewed within its {self.ttl}s TTL")
                return
            await asyncio.sleep(min(max(self.ttl / 3.0, 0.05), remaining))
            if time.monotonic() >= self._deadline:
                continue
            sent = time.monotonic()
            try:
                ttl = await asyncio.wait_for(
                    self._renew_once(), timeout=max(0.05, self._deadline - sent)
                )
            except (TimeoutError, ClientError):
                continue
            if ttl <= 0:
                self._mark_lost(f"lease {self.id:x} expired or was revoked in the cluster")
                return
            self._deadline = sent + ttl

    async def _renew_once(self) -> int:
        async def call(ch: object, timeout: float) -> int:
            stub = stubs.lease(ch)
            stream = stub.LeaseKeepAlive(timeout=timeout)
            try:
                await stream.write(rpc_pb2.LeaseKeepAliveRequest(ID=self.id))
                resp = await stream.read()
            finally:
                stream.cancel()
            if resp is None or not isinstance(resp, rpc_pb2.LeaseKeepAliveResponse):
                return 0
            return int(resp.TTL)

        return await self._client.pool.call(call, idempotent=True)  # renewing twice is harmless

    async def stop_keepalive(self) -> None:
        """Stop renewing, without revoking: the lease runs out after its TTL.

        :attr:`lost` is still set when the local deadline passes, so a holder that stops
        renewing learns that it lost its locks.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = asyncio.create_task(self._expire_at_deadline(), name="accord-session-end")

    async def _expire_at_deadline(self) -> None:
        await asyncio.sleep(max(0.0, self._deadline - time.monotonic()))
        self._mark_lost(f"lease {self.id:x} not renewed (keepalive stopped) within its {self.ttl}s TTL")

    async def close(self, *, revoke: bool = True) -> None:
        """Stop renewing; revoke the lease (its keys go with it) unless ``revoke=False``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if revoke and self.id and not self.lost.is_set():
            with contextlib.suppress(ClientError):
                await self._client.lease_revoke(self.id)
        self._mark_lost(self.lost_reason or "session closed")

    async def __aenter__(self) -> Session:
        if self._task is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
