"""Key intervals as etcd defines them.

``range_end`` empty means the single key ``key``; ``range_end == b"\\0"`` means every key
``>= key`` (so ``key=b"\\0", range_end=b"\\0"`` is every key); otherwise the half-open
interval ``[key, range_end)``. A prefix's ``range_end`` is the key with its last byte
incremented after dropping trailing ``0xff`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class KeyRange:
    """A single key (``single``) or the interval ``[start, end)``; ``end=None`` is unbounded."""

    start: bytes
    end: bytes | None
    single: bool

    @classmethod
    def of(cls, key: bytes, range_end: bytes) -> KeyRange:
        """The interval a request's ``key``/``range_end`` pair names."""
        if not range_end:
            return cls(key, None, True)
        if range_end == b"\x00":
            return cls(key, None, False)
        return cls(key, range_end, False)

    def contains(self, key: bytes) -> bool:
        """Whether ``key`` lies in this range."""
        if self.single:
            return key == self.start
        return key >= self.start and (self.end is None or key < self.end)

    def overlaps(self, other: KeyRange) -> bool:
        """Whether the two ranges share at least one key."""
        if self.single:
            return other.contains(self.start)
        if other.single:
            return self.contains(other.start)
        lo = max(self.start, other.start)
        his = [e for e in (self.end, other.end) if e is not None]
        return not his or lo < min(his)


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix`` (etcd's rule)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"
