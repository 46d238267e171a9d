"""The retry policy's pieces: what counts as never sent, backoff bounds, the budget."""

from __future__ import annotations

import random

import grpc
import pytest

from accord.client.retry import Backoff, RetryBudget, RetryPolicy, never_sent

U = grpc.StatusCode.UNAVAILABLE
REFUSED = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
           "Failed to connect to remote host: Connection refused")


def test_only_grpcs_own_connection_errors_prove_a_call_unsent() -> None:
    assert never_sent(U, REFUSED)
    assert not never_sent(U, "Socket closed")
    assert not never_sent(U, "etcdserver: leader changed")  # the server had it
    assert not never_sent(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert not never_sent(grpc.StatusCode.INVALID_ARGUMENT, REFUSED)


def test_policy_retries_writes_only_when_unsent_and_reads_after_any_transient_error() -> None:
    p = RetryPolicy()
    assert p.retryable(U, "Socket closed", idempotent=True)
    assert p.retryable(grpc.StatusCode.DEADLINE_EXCEEDED, "", idempotent=True)
    assert not p.retryable(U, "Socket closed", idempotent=False)
    assert not p.retryable(grpc.StatusCode.DEADLINE_EXCEEDED, "", idempotent=False)
    assert p.retryable(U, REFUSED, idempotent=False)
    assert not p.retryable(grpc.StatusCode.INVALID_ARGUMENT, "bad", idempotent=True)


def test_backoff_is_full_jitter_under_a_growing_capped_ceiling() -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    b = Backoff(base_s=0.025, cap_s=1.0, rng=random.Random(seed))
    for attempt in range(40):
        ceiling = min(1.0, 0.025 * 2 ** attempt)
        samples = [b.delay(attempt) for _ in range(50)]
        assert all(0.0 <= s <= ceiling for s in samples)
    # jitter: the delays of one attempt are spread, not one value
    assert len({round(b.delay(5), 6) for _ in range(20)}) > 10


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_budget_caps_retries_at_a_share_of_calls_plus_a_trickle() -> None:
    clock = Clock()
    b = RetryBudget(ratio=0.2, per_second=10.0, cap=100.0, clock=clock)
    assert sum(b.try_retry() for _ in range(200)) == 100  # starts full, then empty
    assert not b.try_retry()
    for _ in range(50):  # 50 calls earn 10 retries
        b.on_call()
    assert sum(b.try_retry() for _ in range(50)) == 10
    clock.t += 0.5  # half a second earns 5
    assert sum(b.try_retry() for _ in range(50)) == 5
    clock.t += 1000.0  # never more than the cap
    assert b.tokens == pytest.approx(100.0)
    with pytest.raises(ValueError):
        RetryBudget(cap=0.5)
