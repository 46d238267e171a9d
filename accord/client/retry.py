"""When the client may send a request again, and how long it waits before it does.

A call that failed is retried only where a retry cannot change what the cluster did:

* **Idempotent calls** (reads: Range, Status, MemberList, the scheduler's and SWIM's
  reads; calls the server deduplicates by request id: every scheduler mutation; and
  writes whose repetition leaves the same state: Defragment, an alarm change, lease
  keepalive) are retried after ``UNAVAILABLE`` or a deadline, on the next endpoint.
* **Other writes** (Put, DeleteRange, Txn, Compact, LeaseGrant, LeaseRevoke, member
  changes) are retried only when the request provably never reached a server: the
  channel could not connect to the endpoint before the call was sent, or gRPC refused
  the call itself because no connection existed ("failed to connect to all addresses",
  the same test as etcd's clientv3 ``isSafeRetryMutableRPC``). Any other failure after
  the request may have gone out (a reply lost, a member killed mid-call, a deadline)
  raises :class:`~accord.client.errors.OutcomeUnknown`: the write may or may not have
  been applied, and only the caller knows how to find out (read the key back, compare
  a revision).

Each retry waits a *full-jitter* exponential backoff, ``uniform(0, min(cap, base *
2**attempt))``: with ``base`` 25 ms and ``cap`` 1 s, the fourth retry waits 0-200 ms and
none ever waits more than a second, while many clients failing over at once spread their
retries instead of arriving together. Retries also draw on a :class:`RetryBudget`, a
token bucket shared by every call of one client: each first attempt deposits ``ratio``
(0.2) tokens, time deposits ``per_second`` (10) tokens a second up to ``cap`` (100), and
each retry takes one. A healthy client's occasional failover always finds tokens (the
bucket starts full), but when the cluster is down a busy client makes at most ~20 %
more calls than it would without retries plus 10 a second, instead of multiplying its
load by the number of attempts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Codes after which another endpoint may answer."""

_NOT_SENT_MARKERS = (
    "failed to connect to all addresses",
    "connection refused",
    "name resolution failure",
    "dns resolution failed",
)
"""Phrases of gRPC's own errors for a call that found no connection to send it on."""


def never_sent(code: grpc.StatusCode, details: str) -> bool:
    """Whether a failed call's error proves its request never left the client."""
    if code != grpc.StatusCode.UNAVAILABLE:
        return False
    d = details.lower()
    return any(m in d for m in _NOT_SENT_MARKERS)


@dataclass(slots=True)
class Backoff:
    """Full-jitter exponential backoff (see the module docstring)."""

    base_s: float = 0.025
    cap_s: float = 1.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry)."""
        ceiling = min(self.cap_s, self.base_s * (2 ** min(attempt, 30)))
        return self.rng.uniform(0.0, ceiling)


class RetryBudget:
    """A token bucket limiting retries to a share of calls plus a steady trickle."""

    def __init__(self, *, ratio: float = 0.2, per_second: float = 10.0, cap: float = 100.0,
                 clock: Callable[[], float] | None = None) -> None:
        if ratio < 0 or per_second < 0 or cap < 1:
            raise ValueError("retry budget: ratio and per_second must be >= 0, cap >= 1")
        self.ratio = ratio
        self.per_second = per_second
        self.cap = cap
        self._clock: Callable[[], float] = clock or time.monotonic
        self._tokens = cap
        self._at = self._clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.cap, self._tokens + (now - self._at) * self.per_second)
        self._at = now

    def on_call(self) -> None:
        """A first attempt was made: it earns ``ratio`` of a retry."""
        self._refill()
        self._tokens = min(self.cap, self._tokens + self.ratio)

    def try_retry(self) -> bool:
        """Take one retry's token; False when the budget is spent."""
        self._refill()
        if self._tokens >= 1.0 - 1e-9:  # 5 calls x 0.2 sum to 0.999...
            self._tokens = max(0.0, self._tokens - 1.0)
            return True
        return False

    @property
    def tokens(self) -> float:
        """Retries available now."""
        self._refill()
        return self._tokens


@dataclass(slots=True)
class RetryPolicy:
    """Everything a client needs to decide on and pace retries."""

    backoff: Backoff = field(default_factory=Backoff)
    budget: RetryBudget = field(default_factory=RetryBudget)
    max_attempts: int = 20
    """Attempts of one call at most (first one included)."""

    def retryable(self, code: grpc.StatusCode, details: str, *, idempotent: bool) -> bool:
        """Whether a call that failed with ``code``/``details`` may be sent again."""
        if code not in RETRYABLE_CODES:
            return False
        return idempotent or never_sent(code, details)
