"""Lifeguard's shrinking suspicion timer.

A suspicion starts with a long timeout (``max_timeout``) and, as independent members
confirm it, shrinks logarithmically toward ``min_timeout``: after ``c`` of the ``k``
expected confirmations the timeout is

    max(min, max - (max - min) * log(c + 1) / log(k + 1))

measured from the start. A member that is really dead is confirmed by many probers
quickly and declared dead about as fast as with a fixed timeout; a healthy member
suspected by one slow observer keeps the long timeout and has time to refute. With
``k = 0`` (or ``min == max``) it is plain SWIM's fixed timeout.
"""

from __future__ import annotations

import math

__all__ = ["Suspicion"]


class Suspicion:
    """One member's suspicion: start time, expected and received confirmations."""

    __slots__ = ("_confirmers", "confirmations", "incarnation", "k", "max_timeout", "min_timeout", "start")

    def __init__(
        self,
        origin: str,
        incarnation: int,
        start: float,
        k: int,
        min_timeout: float,
        max_timeout: float,
    ) -> None:
        if min_timeout <= 0 or max_timeout < min_timeout:
            raise ValueError(f"need 0 < min_timeout <= max_timeout, got {min_timeout}, {max_timeout}")
        self.incarnation = incarnation
        self.start = start
        self.k = max(0, k)
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout if self.k > 0 else min_timeout
        # The origin of the suspicion does not count as a confirmation.
        self._confirmers: set[str] = {origin}
        # Independent confirmations received so far (the origin excluded).
        self.confirmations = 0

    def confirm(self, origin: str) -> bool:
        """Record a confirmation from ``origin``; True if it was new and still counts."""
        if self.confirmations >= self.k or origin in self._confirmers:
            return False
        self._confirmers.add(origin)
        self.confirmations += 1
        return True

    def timeout(self) -> float:
        """The current timeout, from the start, given the confirmations so far."""
        if self.k == 0:
            return self.min_timeout
        frac = math.log(self.confirmations + 1) / math.log(self.k + 1)
        span = self.max_timeout - self.min_timeout
        return max(self.min_timeout, self.max_timeout - span * frac)

    def deadline(self) -> float:
        """When the suspected member is to be declared dead unless it refutes."""
        return self.start + self.timeout()
