"""Calls of a service's Raft group retried until the deadline (``accord.services.retrying``)."""

from __future__ import annotations

import pytest

from accord.services.retrying import until_deadline


class Unavailable(Exception):
    """What the host raises while a group has no leader: it carries a ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Down(Exception):
    pass


async def test_errors_with_a_reason_are_retried_until_an_answer() -> None:
    timeouts: list[float] = []

    async def attempt(timeout: float) -> object:
        timeouts.append(timeout)
        if len(timeouts) < 3:
            raise Unavailable("no leader")
        return {"ok": True}

    out = await until_deadline(attempt, request_timeout=5, attempt_timeout=0.5,
                               unavailable=Down, first_delay=0.001)
    assert out == {"ok": True} and len(timeouts) == 3
    assert all(0 < t <= 0.5 for t in timeouts)  # each attempt within its own bound


async def test_other_errors_go_to_the_caller_at_once() -> None:
    calls = 0

    async def attempt(timeout: float) -> object:
        nonlocal calls
        calls += 1
        raise ValueError("bad command")

    with pytest.raises(ValueError, match="bad command"):
        await until_deadline(attempt, request_timeout=5, attempt_timeout=1,
                             unavailable=Down, first_delay=0.001)
    assert calls == 1


async def test_past_the_deadline_it_raises_unavailable_with_the_last_reason() -> None:
    calls = 0

    async def attempt(timeout: float) -> object:
        nonlocal calls
        calls += 1
        raise Unavailable(f"leader changed ({calls})")

    with pytest.raises(Down) as e:
        await until_deadline(attempt, request_timeout=0.2, attempt_timeout=0.05,
                             unavailable=lambda last: Down(f"group unavailable: {last}"),
                             first_delay=0.01, growth=1.0)
    assert calls >= 2 and str(e.value) == f"group unavailable: leader changed ({calls})"
