"""Callers waiting on the host, and their deadlines.

A proposal or a read waits on a future. With an explicit timeout the wait has its own
timer; with the default (``HostConfig.request_timeout``) it joins a queue ordered by
deadline, swept once per tick: one sweep per tick replaces a timer per request, which
matters at thousands of requests in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, TypeVar

from accord.raft.host.group import GroupUnavailable

T = TypeVar("T")


class Waits:
    """Deadlines of the callers waiting on one host."""

    def __init__(self, loop: asyncio.AbstractEventLoop, default_timeout: float) -> None:
        self._loop = loop
        self._default = default_timeout
        self._expiry: deque[tuple[float, asyncio.Future[Any]]] = deque()
        """(deadline, future) of waits with the default timeout, oldest first."""

    async def wait(self, fut: asyncio.Future[T], timeout: float | None) -> T:
        """Await ``fut``; past the timeout it fails with ``request timed out``."""
        if timeout is None:
            self._expiry.append((self._loop.time() + self._default, fut))
            return await fut
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise GroupUnavailable("request timed out") from None

    def expire(self) -> None:
        """Fail the default-timeout waits whose deadline passed (called every tick)."""
        now = self._loop.time()
        q = self._expiry
        while q and q[0][0] <= now:
            _, fut = q.popleft()
            if not fut.done():
                fut.set_exception(GroupUnavailable("request timed out"))
