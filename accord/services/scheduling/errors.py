"""The scheduler's error for bad input, apart so every scheduling module can raise it."""

from __future__ import annotations


class SchedulingError(ValueError):
    """Bad input to the scheduler: the message says what was wrong."""
