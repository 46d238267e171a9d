"""Lifeguard's local health multiplier: how much a member distrusts its own timeliness.

The score rises when this member misses acks it should have got (a failed probe with no
nacks to explain it, a nack that never came, having to refute a suspicion about itself)
and falls with each successful probe. Probe intervals and timeouts are multiplied by
``score + 1``: a member that is itself slow probes less often and waits longer, instead
of accusing healthy members of its own slowness.
"""

from __future__ import annotations

__all__ = ["LocalHealth"]


class LocalHealth:
    """A saturating counter in ``[0, max_score]`` that scales timeouts."""

    __slots__ = ("enabled", "max_score", "score")

    def __init__(self, max_score: int, enabled: bool = True) -> None:
        if max_score < 0:
            raise ValueError(f"max_score must be >= 0, got {max_score}")
        self.max_score = max_score
        self.enabled = enabled
        self.score = 0

    def apply(self, delta: int) -> None:
        """Raise (positive) or lower (negative) the score, clamped to its range."""
        if self.enabled:
            self.score = min(self.max_score, max(0, self.score + delta))

    def scale(self, duration: float) -> float:
        """``duration`` stretched by the current health multiplier."""
        return duration * (self.score + 1)
