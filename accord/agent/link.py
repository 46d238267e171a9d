"""The agent's async calls to the scheduler, failing over between the cluster's members.

One ``grpc.aio`` channel per endpoint, made on first use, dialed as the client library
dials (``accord.client.tls``: TLS for ``https://`` endpoints, or for any endpoint once
TLS options are given). A call goes to the
endpoint that last answered, then to the others in order; an unreachable member
or one that timed out passes it on (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``), any
other status is the answer. Mutating calls carry a request id the caller keeps
across retries, so the scheduler applies each at most once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc

from accord.client.tls import TLSOptions, aio_channel
from accord.proto import scheduling_pb2_grpc

T = TypeVar("T")
_stubs: Any = scheduling_pb2_grpc  # the generated stubs carry no type annotations
RETRY_ON_NEXT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class SchedulerLink:
    """``Scheduler`` stubs over every endpoint, with failover."""

    def __init__(self, endpoints: list[str], tls: TLSOptions | None = None) -> None:
        if not endpoints:
            raise ValueError("no scheduler endpoint given")
        self.endpoints = list(endpoints)
        self.tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._preferred = 0

    def stub(self, endpoint: str) -> Any:
        """The ``Scheduler`` stub of one endpoint."""
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = self._channels[endpoint] = aio_channel(endpoint, self.tls)
        return _stubs.SchedulerStub(ch)

    def current(self) -> str:
        """The endpoint that last answered (where streams go first)."""
        return self.endpoints[self._preferred]

    def rotate(self) -> None:
        """Prefer the next endpoint (after a stream broke)."""
        self._preferred = (self._preferred + 1) % len(self.endpoints)

    async def call(self, fn: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """``await fn(stub)`` on the first endpoint that answers; the last error otherwise."""
        last: grpc.RpcError | None = None
        n = len(self.endpoints)
        for k in range(n):
            i = (self._preferred + k) % n
            try:
                out = await fn(self.stub(self.endpoints[i]))
            except grpc.RpcError as e:
                last = e
                if e.code() not in RETRY_ON_NEXT:
                    raise
                continue
            self._preferred = i
            return out
        assert last is not None
        raise last

    async def unary(self, method: str, request: Any, timeout: float = 10.0) -> Any:
        """``Scheduler.<method>(request)`` with failover (see ``call``)."""
        async def one(stub: Any) -> Any:
            return await getattr(stub, method)(request, timeout=timeout)
        return await self.call(one)

    async def close(self) -> None:
        """Close every channel."""
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close()
        self._channels.clear()
