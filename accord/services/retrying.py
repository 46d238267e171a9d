"""Calls of a service's own Raft group, retried until the request's deadline.

The scheduler (group 3) and the checkpoint service (group 4) each replicate a state
machine in a group of their own and reach the Multi-Raft host through two calls,
``propose(payload, timeout)`` and ``read_barrier(timeout)``. Either fails with an error
that carries a ``reason`` (the host's ``GroupUnavailable``) while the group has no
leader, a forward was lost or a leader changed: :func:`until_deadline` retries those,
each attempt bounded by ``attempt_timeout``, pausing between them (``first_delay``,
times ``growth`` each time, at most ``max_delay``), until ``request_timeout`` has passed,
and then raises ``unavailable(last reason)``. Any other error goes to the caller at once.
A command retried this way carries the same id, which the state machine answers from
its memory, so it applies at most once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

ProposeBytes = Callable[[bytes, float], Awaitable[object]]
"""``(payload, timeout) -> apply result``; raises an exception with ``reason`` when unavailable."""


async def until_deadline(attempt: Callable[[float], Awaitable[object]], *,
                         request_timeout: float, attempt_timeout: float,
                         unavailable: Callable[[str], Exception], first_delay: float,
                         growth: float = 2.0, max_delay: float = 0.5) -> object:
    """``attempt(timeout)``'s answer, retried as the module says."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request_timeout
    delay = first_delay
    last = "request timed out"
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise unavailable(last)
        try:
            return await attempt(min(left, attempt_timeout))
        except Exception as e:
            reason = getattr(e, "reason", None)
            if reason is None:
                raise
            last = str(reason)
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * growth, max_delay)
