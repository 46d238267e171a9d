"""Permission ranges and the coverage check, as etcd's auth store evaluates them.

A permission names a key (``range_end`` empty), a range ``[key, range_end)``, or every
key from ``key`` on (``range_end == b"\\x00"``). etcd compares interval ends as *affine*
byte strings: an empty end is +infinity. A request for ``[key, range_end)`` is allowed
when the union of the user's permitted intervals of the needed kind covers it whole; a
single key is allowed when some interval holds it. A request whose end is not after its
key (an empty or inverted range) is checked as its first key alone, which is what etcd's
interval tree answers for such a range. A permission with an empty key, or with its end
not after its key, covers nothing (etcd stores it and lists it, and it never matches).

:class:`PermissionSet` merges a user's intervals once (sorted, overlapping and touching
ones joined), so a check is one binary search however many roles and permissions there
are.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable
from dataclasses import dataclass

ALL_KEYS_END = b"\x00"


class PermType(enum.IntEnum):
    """``authpb.Permission.Type``."""

    READ = 0
    WRITE = 1
    READWRITE = 2


@dataclass(frozen=True, slots=True)
class Permission:
    """One grant of a role: a kind over a key, a range or a prefix."""

    perm_type: PermType
    key: bytes
    range_end: bytes = b""

    def interval(self) -> tuple[bytes, bytes | None] | None:
        """``[begin, end)`` with ``None`` for +infinity; ``None`` when it covers nothing."""
        if not self.key:
            return None
        if not self.range_end:
            return (self.key, self.key + b"\x00")
        if self.range_end == ALL_KEYS_END:
            return (self.key, None)
        if self.range_end <= self.key:
            return None
        return (self.key, self.range_end)

    def grants(self, need: PermType) -> bool:
        """Whether this permission's kind includes ``need`` (READ or WRITE)."""
        return self.perm_type == PermType.READWRITE or self.perm_type == need


def request_interval(key: bytes, range_end: bytes) -> tuple[bytes, bytes | None]:
    """The interval a request names (etcd's rules for ``range_end``)."""
    if not range_end:
        return (key, key + b"\x00")
    if range_end == ALL_KEYS_END:
        return (key, None)
    if range_end <= key:
        return (key, key + b"\x00")
    return (key, range_end)


def _end_ge(a: bytes | None, b: bytes | None) -> bool:
    """``a >= b`` where ``None`` is +infinity."""
    if a is None:
        return True
    if b is None:
        return False
    return a >= b


class PermissionSet:
    """The merged intervals one kind (read or write) of a user's permissions covers."""

    __slots__ = ("_begins", "_ends")

    def __init__(self, intervals: Iterable[tuple[bytes, bytes | None]]) -> None:
        merged: list[list[bytes | None]] = []
        for begin, end in sorted(intervals, key=lambda iv: iv[0]):
            if merged:
                last_end = merged[-1][1]
                if last_end is None or begin <= last_end:
                    if not _end_ge(last_end, end):
                        merged[-1][1] = end
                    continue
            merged.append([begin, end])
        self._begins: list[bytes] = [m[0] for m in merged]  # type: ignore[misc]
        self._ends: list[bytes | None] = [m[1] for m in merged]

    @classmethod
    def of(cls, perms: Iterable[Permission], need: PermType) -> PermissionSet:
        """The set of what ``perms`` grant for ``need``."""
        ivs = []
        for p in perms:
            if p.grants(need):
                iv = p.interval()
                if iv is not None:
                    ivs.append(iv)
        return cls(ivs)

    def covers(self, key: bytes, range_end: bytes) -> bool:
        """Whether the request ``(key, range_end)`` lies wholly inside the set."""
        begin, end = request_interval(key, range_end)
        i = bisect.bisect_right(self._begins, begin) - 1
        if i < 0:
            return False
        return _end_ge(self._ends[i], end)

    def __len__(self) -> int:
        return len(self._begins)
