"""A sorted set of keys for range scans: a list of sorted chunks.

A single sorted Python list makes inserting a new key O(n) in memory moved (8 MB per
insert at a million keys); chunks of at most ``CHUNK`` keys keep an insert at O(CHUNK)
plus a bisect over the chunks' first keys, and a range scan is a bisect then a walk.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

CHUNK = 512


class SortedKeys:
    """Bytes keys in lexicographic order with insert, remove and range iteration."""

    __slots__ = ("_chunk", "_chunks", "_firsts", "_len")

    def __init__(
        self, keys: Iterable[bytes] = (), chunk: int = CHUNK, presorted: bool = False
    ) -> None:
        """``presorted``: ``keys`` are already strictly increasing (skips the sort)."""
        if chunk < 2:
            raise ValueError("chunk must be >= 2")
        self._chunk = chunk
        half = chunk // 2
        ordered = list(keys) if presorted else sorted(set(keys))
        self._chunks: list[list[bytes]] = [
            ordered[i : i + half] for i in range(0, len(ordered), half)
        ]
        self._firsts: list[bytes] = [c[0] for c in self._chunks]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or not self._chunks:
            return False
        chunk = self._chunks[max(0, bisect_right(self._firsts, key) - 1)]
        i = bisect_left(chunk, key)
        return i < len(chunk) and chunk[i] == key

    def add(self, key: bytes) -> None:
        """Insert ``key`` (no-op if present)."""
        if not self._chunks:
            self._chunks.append([key])
            self._firsts.append(key)
            self._len = 1
            return
        ci = max(0, bisect_right(self._firsts, key) - 1)
        chunk = self._chunks[ci]
        i = bisect_left(chunk, key)
        if i < len(chunk) and chunk[i] == key:
            return
        chunk.insert(i, key)
        if i == 0:
            self._firsts[ci] = key
        self._len += 1
        if len(chunk) > self._chunk:
            half = len(chunk) // 2
            self._chunks[ci : ci + 1] = [chunk[:half], chunk[half:]]
            self._firsts[ci : ci + 1] = [chunk[0], chunk[half]]

    def discard(self, key: bytes) -> None:
        """Remove ``key`` if present."""
        if not self._chunks:
            return
        ci = max(0, bisect_right(self._firsts, key) - 1)
        chunk = self._chunks[ci]
        i = bisect_left(chunk, key)
        if i >= len(chunk) or chunk[i] != key:
            return
        del chunk[i]
        self._len -= 1
        if not chunk:
            del self._chunks[ci]
            del self._firsts[ci]
        else:
            self._firsts[ci] = chunk[0]

    def irange(self, start: bytes, end: bytes | None) -> Iterator[bytes]:
        """Keys ``k`` with ``start <= k < end`` in order; ``end=None`` means no upper bound."""
        if not self._chunks:
            return
        ci = max(0, bisect_right(self._firsts, start) - 1)
        chunk = self._chunks[ci]
        i = bisect_left(chunk, start)
        chunks = self._chunks
        nchunks = len(chunks)
        while ci < nchunks:
            chunk = chunks[ci]
            if end is None:
                yield from chunk[i:]
            else:
                j = bisect_left(chunk, end, i)
                yield from chunk[i:j]
                if j < len(chunk):
                    return
            ci += 1
            i = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            yield from chunk
