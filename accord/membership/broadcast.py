"""The dissemination queue: updates waiting to be piggybacked, each sent a bounded number of times.

Every update (alive, suspect, dead about one member) is keyed by the member's name: a
newer update about a member replaces the older one still queued, since it supersedes
it. Each packet takes as many updates as fit, those sent the fewest times first and,
among equals, the most recent first (the newest arrival at that transmit count); an
update is dropped after riding on ``limit`` packets
(``retransmit_mult * ceil(log10(n + 1))``), which is enough for an epidemic to reach
everyone with high probability while keeping packets small.

Updates are kept in one bucket per transmit count, so taking ``k`` updates costs O(k),
not a sort of the whole queue per packet.
"""

from __future__ import annotations

__all__ = ["TransmitQueue"]


class TransmitQueue:
    """Encoded updates keyed by member name, handed out fewest-transmits, newest first."""

    __slots__ = ("_buckets", "_token", "_where", "max_items")

    def __init__(self, max_items: int = 1024) -> None:
        # _buckets[t]: updates sent t times, as (key, token, payload), newest last. An
        # entry is current only while _where[key] == (t, token); stale ones are skipped
        # and swept lazily.
        self._buckets: list[list[tuple[str, int, bytes]]] = [[]]
        self._where: dict[str, tuple[int, int]] = {}
        self._token = 0
        self.max_items = max_items

    def __len__(self) -> int:
        return len(self._where)

    def __bool__(self) -> bool:
        return bool(self._where)

    def queue(self, key: str, payload: bytes) -> None:
        """Queue an update about ``key``, replacing any older one about the same member."""
        self._token += 1
        self._where[key] = (0, self._token)
        self._buckets[0].append((key, self._token, payload))
        if len(self._where) > self.max_items:
            self._shed()

    def _shed(self) -> None:
        """Drop the update that has travelled the most (the oldest among equals)."""
        for t in range(len(self._buckets) - 1, -1, -1):
            for key, token, _ in self._buckets[t]:
                if self._where.get(key) == (t, token):
                    del self._where[key]
                    return

    def pending(self, key: str) -> bytes | None:
        """The queued update about ``key``, if any."""
        where = self._where.get(key)
        if where is None:
            return None
        for k, token, payload in reversed(self._buckets[where[0]]):
            if k == key and token == where[1]:
                return payload
        return None

    def transmits(self, key: str) -> int | None:
        """How many packets the update about ``key`` has ridden on (None: not queued)."""
        where = self._where.get(key)
        return where[0] if where is not None else None

    def take(self, budget: int, limit: int) -> list[bytes]:
        """Updates fitting in ``budget`` bytes; each counts one transmission, up to ``limit``.

        Each bucket is a stack (newest on top), so a take pops what it sends and every
        superseded entry is discarded exactly once: O(updates taken) amortized. It
        stops at the first update that does not fit.
        """
        where = self._where
        if not where or budget <= 0:
            return []
        out: list[bytes] = []
        moved: list[tuple[int, str, int, bytes]] = []
        for t, bucket in enumerate(self._buckets):
            while bucket:
                key, token, payload = bucket[-1]
                if where.get(key) != (t, token):
                    bucket.pop()  # superseded
                    continue
                if len(payload) > budget:
                    budget = 0
                    break
                bucket.pop()
                budget -= len(payload)
                out.append(payload)
                moved.append((t, key, token, payload))
            if budget < 8:
                break
        buckets = self._buckets
        for t, key, token, payload in moved:
            if t + 1 >= limit:
                del where[key]
                continue
            if t + 1 == len(buckets):
                buckets.append([])
            buckets[t + 1].append((key, token, payload))
            where[key] = (t + 1, token)
        return out

    def clear(self) -> None:
        """Forget every queued update."""
        self._buckets = [[]]
        self._where.clear()
