"""Which synced watchers a changed key concerns, without scanning every watcher.

Single-key watches are found by a dict lookup, prefix watches (``range_end`` is the
prefix's end, by far the most common range) by looking up the key's prefixes of the
lengths in use, and only the remaining arbitrary ranges are scanned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator
from typing import Generic, Protocol, TypeVar

from accord.services.kv.ranges import KeyRange, prefix_end


class _HasRange(Hashable, Protocol):
    kr: KeyRange


W = TypeVar("W", bound=_HasRange)


class WatcherIndex(Generic[W]):
    """A set of watchers queryable by key."""

    __slots__ = ("_by_key", "_by_prefix", "_other", "_prefix_lens")

    def __init__(self) -> None:
        self._by_key: dict[bytes, set[W]] = {}
        self._by_prefix: dict[bytes, set[W]] = {}
        self._prefix_lens: Counter[int] = Counter()
        self._other: set[W] = set()

    @staticmethod
    def _prefix_of(kr: KeyRange) -> bytes | None:
        if kr.single or kr.end is None or not kr.start:
            return None
        return kr.start if kr.end == prefix_end(kr.start) else None

    def add(self, w: W) -> None:
        """Index a watcher."""
        kr = w.kr
        if kr.single:
            self._by_key.setdefault(kr.start, set()).add(w)
            return
        prefix = self._prefix_of(kr)
        if prefix is None:
            self._other.add(w)
            return
        ws = self._by_prefix.setdefault(prefix, set())
        if w not in ws:
            ws.add(w)
            self._prefix_lens[len(prefix)] += 1

    def discard(self, w: W) -> None:
        """Remove a watcher (no-op if absent)."""
        kr = w.kr
        if kr.single:
            ws = self._by_key.get(kr.start)
            bucket, table = kr.start, self._by_key
        else:
            prefix = self._prefix_of(kr)
            if prefix is None:
                self._other.discard(w)
                return
            ws = self._by_prefix.get(prefix)
            bucket, table = prefix, self._by_prefix
            if ws is not None and w in ws:
                self._prefix_lens[len(prefix)] -= 1
                if not self._prefix_lens[len(prefix)]:
                    del self._prefix_lens[len(prefix)]
        if ws is not None:
            ws.discard(w)
            if not ws:
                del table[bucket]

    def matching(self, key: bytes) -> Iterator[W]:
        """Every indexed watcher whose range contains ``key`` (each once)."""
        ws = self._by_key.get(key)
        if ws:
            yield from ws
        if self._by_prefix:
            n = len(key)
            for length in self._prefix_lens:
                if length <= n:
                    ps = self._by_prefix.get(key[:length])
                    if ps:
                        yield from ps
        for w in self._other:
            if w.kr.contains(key):
                yield w
