"""Things another worker opens by name with its first long poll, and their sweep.

A watch feed (``workerwatch.py``) and a pulled server stream (``forwardstream.py``) are
both opened by the first poll of the worker that wants them, named by that worker, and
kept while it polls; one nobody polled for ``abandoned_s`` belongs to a worker that
died, and is closed at the next open.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import grpc

from accord.node.forward import ForwardedError

T = TypeVar("T")


class PolledTable(Generic[T]):
    """Named entries opened by a first poll (see the module docstring)."""

    def __init__(self, what: str, abandoned_s: float, close: Callable[[T], None]) -> None:
        self._what = what
        self._abandoned_s = abandoned_s
        self._close = close
        self._entries: dict[str, tuple[T, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def polled(self, name: str, spec: Any, open_: Callable[[Any], T]) -> T:
        """The entry ``name``, opened from ``spec`` when the poll is its first (the
        abandoned ones swept first); NOT_FOUND for an unknown name polled without one."""
        got = self._entries.get(name)
        if got is None:
            if spec is None:
                raise ForwardedError(grpc.StatusCode.NOT_FOUND, f"no {self._what} {name!r}")
            self.sweep()
            entry = open_(spec)
        else:
            entry = got[0]
        self._entries[name] = (entry, time.monotonic())
        return entry

    def touch(self, name: str) -> None:
        """Note a poll of ``name`` (after a long wait: it is not abandoned)."""
        got = self._entries.get(name)
        if got is not None:
            self._entries[name] = (got[0], time.monotonic())

    def get(self, name: str) -> T | None:
        """The entry ``name``, if open."""
        got = self._entries.get(name)
        return got[0] if got is not None else None

    def forget(self, name: str) -> T | None:
        """Drop ``name`` (it ended by itself); the entry, if it was open."""
        got = self._entries.pop(name, None)
        return got[0] if got is not None else None

    def close(self, name: str) -> None:
        """Drop and close ``name``."""
        entry = self.forget(name)
        if entry is not None:
            self._close(entry)

    def sweep(self) -> None:
        """Close every entry nobody polled for ``abandoned_s``."""
        cutoff = time.monotonic() - self._abandoned_s
        for name in [n for n, (_e, at) in self._entries.items() if at < cutoff]:
            self.close(name)
