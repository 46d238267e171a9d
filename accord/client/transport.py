"""Channels to a cluster's endpoints, with failover and bounded retries.

Calls go to the current endpoint; on ``UNAVAILABLE`` or a deadline the pool moves to the
next endpoint and retries, with a short growing backoff, until ``attempts`` calls failed
or ``retry_budget_s`` passed. Every call carries a deadline (``call_timeout_s``), so a
member that is paused or partitioned costs one timeout, not a hang.

Retrying writes is safe for what the library sends: its lock, lease and election writes
are guarded transactions or idempotent puts (a retry after an unseen success either
repeats the same value or fails its guard, which the recipes read as "already done").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from accord.client.errors import ClientError, Unavailable, from_rpc_error
from accord.client.tls import TLSOptions, aio_channel, split_endpoint

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


class EndpointPool:
    """One lazily opened ``grpc.aio`` channel per endpoint and the failover policy."""

    def __init__(
        self, endpoints: Sequence[str], *, call_timeout_s: float = 5.0,
        retry_budget_s: float = 30.0, attempts: int = 60, tls: TLSOptions | None = None,
    ) -> None:
        """``endpoints`` are ``host:port``, ``http://host:port`` or ``https://host:port``;
        ``tls`` gives the CA and client certificate for TLS ones (``accord.client.tls``)."""
        given = [e.strip() for e in endpoints if e and e.strip()]
        eps = [split_endpoint(e, tls)[0] for e in given]
        if not eps:
            raise ValueError("no endpoints given: pass e.g. ['127.0.0.1:2379']")
        if call_timeout_s <= 0 or retry_budget_s <= 0 or attempts <= 0:
            raise ValueError("call_timeout_s, retry_budget_s and attempts must be positive")
        self.endpoints = eps
        self.tls = tls
        self._dial = dict(zip(eps, given, strict=True))
        """host:port -> the endpoint as given (its scheme says how to dial it)."""
        self.call_timeout_s = call_timeout_s
        self.retry_budget_s = retry_budget_s
        self.attempts = attempts
        self._current = 0
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closed = False

    @property
    def current(self) -> str:
        """The endpoint calls go to now."""
        return self.endpoints[self._current]

    def channel(self) -> grpc.aio.Channel:
        """The current endpoint's channel (opened on first use)."""
        if self._closed:
            raise ClientError(grpc.StatusCode.CANCELLED, "accord client is closed")
        ep = self.current
        ch = self._channels.get(ep)
        if ch is None:
            ch = aio_channel(self._dial[ep], self.tls, CHANNEL_OPTIONS)
            self._channels[ep] = ch
        return ch

    def fail_over(self, endpoint: str) -> None:
        """Move on from ``endpoint`` (no-op if another call already did)."""
        if self.current == endpoint:
            self._current = (self._current + 1) % len(self.endpoints)

    async def call(self, fn: Callable[[grpc.aio.Channel, float], Awaitable[T]]) -> T:
        """Run ``fn(channel, timeout)``, failing over and retrying retryable errors."""
        deadline = time.monotonic() + self.retry_budget_s
        last: ClientError | None = None
        for attempt in range(self.attempts):
            ep = self.current
            try:
                return await fn(self.channel(), self.call_timeout_s)
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e)
                if e.code() not in RETRYABLE:
                    raise err from None
                last = err
                self.fail_over(ep)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.02 * (attempt + 1), 0.3))
        raise Unavailable(
            grpc.StatusCode.UNAVAILABLE,
            f"no endpoint of {self.endpoints} answered within {self.retry_budget_s:.0f}s "
            f"({self.attempts} attempts max); last error: {last.message if last else 'none'}",
        )

    async def close(self) -> None:
        """Close every channel."""
        self._closed = True
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
