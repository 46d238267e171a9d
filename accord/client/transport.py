"""Channels to a cluster's endpoints, failover, deadlines, and the retry policy.

The pool keeps one lazily opened ``grpc.aio`` channel per endpoint. A call goes to the
current endpoint with a deadline (``call_timeout_s``, or the call's own ``timeout``), so
a member that is paused or partitioned costs one timeout, not a hang. When it fails
with ``UNAVAILABLE`` or a deadline the pool moves to the next endpoint, and the call is
sent again only where :mod:`accord.client.retry` says a retry is safe: idempotent
calls, or a write whose request provably never left the client. A write that may have
been applied raises :class:`~accord.client.errors.OutcomeUnknown` instead of being sent
twice. Retries wait a jittered backoff, draw on the client's retry budget, and stop
after ``retry_budget_s`` seconds in all.

Before a non-idempotent write the pool makes sure the current endpoint's channel is
connected (waiting at most ``connect_timeout_s``): an endpoint that cannot be reached
is skipped before anything was sent, so failing over past a dead member stays safe for
every write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from accord.client.errors import ClientError, OutcomeUnknown, Unavailable, from_rpc_error
from accord.client.retry import RetryPolicy
from accord.client.tls import TLSOptions, aio_channel, split_endpoint

T = TypeVar("T")

CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]

Call = Callable[[grpc.aio.Channel, float], Awaitable[T]]
"""One attempt of a call: ``fn(channel, timeout)``."""


def normalize(endpoint: str, tls: TLSOptions | None = None) -> str:
    """``host:port`` of an endpoint given as ``host:port`` or ``http(s)://host:port``."""
    return split_endpoint(endpoint, tls)[0]


class EndpointPool:
    """One channel per endpoint, the current endpoint, and the failover policy."""

    def __init__(
        self, endpoints: Sequence[str], *, call_timeout_s: float = 5.0,
        retry_budget_s: float = 30.0, connect_timeout_s: float = 2.0,
        policy: RetryPolicy | None = None, tls: TLSOptions | None = None,
    ) -> None:
        """``endpoints`` are ``host:port``, ``http://host:port`` or ``https://host:port``;
        ``tls`` gives the CA and client certificate for TLS ones (``accord.client.tls``)."""
        self.tls = tls
        self._dial: dict[str, str] = {}
        """host:port -> the endpoint as given (its scheme says how to dial it)."""
        eps = self._learn(endpoints)
        if not eps:
            raise ValueError("no endpoints given: pass e.g. ['127.0.0.1:2379']")
        if call_timeout_s <= 0 or retry_budget_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("call_timeout_s, retry_budget_s and connect_timeout_s must be "
                             "positive")
        self.endpoints = eps
        self.call_timeout_s = call_timeout_s
        self.retry_budget_s = retry_budget_s
        self.connect_timeout_s = connect_timeout_s
        self.policy = policy or RetryPolicy()
        self._current = 0
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closed = False
        self.retries = 0
        """Attempts after the first, over the pool's life (for tests and metrics)."""

    @property
    def current(self) -> str:
        """The endpoint calls go to now."""
        return self.endpoints[self._current]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _learn(self, endpoints: Sequence[str]) -> list[str]:
        """``host:port`` of each endpoint (in order, once), remembering how to dial it."""
        out: list[str] = []
        for given in endpoints:
            if not given or not given.strip():
                continue
            target = normalize(given, self.tls)
            self._dial.setdefault(target, given.strip())
            if target not in out:
                out.append(target)
        return out

    def add_endpoints(self, endpoints: Sequence[str]) -> list[str]:
        """Add endpoints learnt from the cluster (discovery: members' client URLs, whose
        scheme says how to dial them); the ones that were new."""
        new = [e for e in self._learn(endpoints) if e not in self.endpoints]
        self.endpoints.extend(new)
        return new

    def channel(self, endpoint: str | None = None) -> grpc.aio.Channel:
        """The channel of ``endpoint`` (``host:port`` or a URL; default: the current
        one), opened on first use."""
        if self._closed:
            raise ClientError(grpc.StatusCode.CANCELLED, "accord client is closed",
                              hint="open a new client")
        ep = self._learn([endpoint])[0] if endpoint else self.current
        ch = self._channels.get(ep)
        if ch is None:
            ch = aio_channel(self._dial[ep], self.tls, CHANNEL_OPTIONS)
            self._channels[ep] = ch
        return ch

    def fail_over(self, endpoint: str) -> None:
        """Move on from ``endpoint`` (no-op if another call already did)."""
        if self.current == endpoint:
            self._current = (self._current + 1) % len(self.endpoints)

    async def _connected(self, ch: grpc.aio.Channel, timeout: float) -> bool:
        """Whether ``ch`` is (or becomes, within ``timeout``) connected."""
        state = ch.get_state(try_to_connect=True)
        deadline = time.monotonic() + timeout
        while state != grpc.ChannelConnectivity.READY:
            if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         grpc.ChannelConnectivity.SHUTDOWN):
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(ch.wait_for_state_change(state), left)
            except TimeoutError:
                return False
            state = ch.get_state(try_to_connect=True)
        return True

    async def call(self, fn: Call[T], *, idempotent: bool, timeout: float | None = None) -> T:
        """Run ``fn(channel, timeout)``, failing over and retrying where that is safe."""
        per_call = timeout or self.call_timeout_s
        deadline = time.monotonic() + max(self.retry_budget_s, per_call)
        policy = self.policy
        policy.budget.on_call()
        last: ClientError | None = None
        for attempt in range(policy.max_attempts):
            if attempt:
                if time.monotonic() >= deadline:
                    break
                if not policy.budget.try_retry():
                    raise Unavailable(
                        grpc.StatusCode.UNAVAILABLE,
                        f"retry budget exhausted after {attempt} attempt(s); last error: "
                        f"{last.message if last else 'none'}",
                        endpoint=last.endpoint if last else "",
                        hint="the cluster is failing many calls: wait, then try again")
                self.retries += 1
                await asyncio.sleep(min(policy.backoff.delay(attempt - 1),
                                        max(0.0, deadline - time.monotonic())))
            ep = self.current
            ch = self.channel(ep)
            if not idempotent and not await self._connected(ch, self.connect_timeout_s):
                last = Unavailable(grpc.StatusCode.UNAVAILABLE,
                                   f"could not connect to {ep} (nothing was sent)", endpoint=ep)
                self.fail_over(ep)
                continue
            left = max(0.05, min(per_call, deadline - time.monotonic()))
            try:
                return await fn(ch, left)
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e, ep)
                if not policy.retryable(e.code(), e.details() or "", idempotent=idempotent):
                    if idempotent or e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise err from None
                    self.fail_over(ep)
                    raise OutcomeUnknown(
                        e.code(), f"write sent to {ep} got no answer ({e.details() or ''}); "
                        "it may or may not have been applied, so it was not sent again",
                        endpoint=ep,
                        hint="read the keys back to learn whether it took effect") from None
                last = err
                self.fail_over(ep)
        raise Unavailable(
            grpc.StatusCode.UNAVAILABLE,
            f"no endpoint of {self.endpoints} answered within {self.retry_budget_s:.0f}s "
            f"({policy.max_attempts} attempts max); last error: "
            f"{last.message if last else 'none'}",
            endpoint=last.endpoint if last else "",
            hint="check that the members run and are reachable from here",
        )

    async def call_at(self, endpoint: str, fn: Call[T], *, timeout: float | None = None) -> T:
        """Run ``fn`` once against one given endpoint (no failover: the caller chose it)."""
        ep = normalize(endpoint, self.tls)
        try:
            return await fn(self.channel(endpoint), timeout or self.call_timeout_s)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, ep) from None

    async def close(self) -> None:
        """Close every channel (calls in flight end with ``CANCELLED``)."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        for ch in channels:
            await ch.close()
