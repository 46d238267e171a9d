"""The dissemination queue: updates waiting to be piggybacked, each sent a bounded number of times.

Every update (alive, suspect, dead about one member) is keyed by the member's name: a
newer update about a member replaces the older one still queued, since it supersedes
it. Each packet takes as many updates as fit, those sent the fewest times first and,
among equals, the most recent first (the newest arrival at that transmit count); an
update is dropped after riding on ``limit`` packets
(``retransmit_mult * ceil(log10(n + 1))``), which is enough for an epidemic to reach
everyone with high probability while keeping packets small.

Updates are kept in one bucket per transmit count, so taking ``k`` updates costs O(k),
not a sort of the whole queue per packet. Each queued update is one small mutable
``Update`` record (its encoded bytes, the decoded message when the protocol has it, and
whether it is still current), moved from bucket to bucket as it is sent: a take
allocates nothing per update, which matters when thousands of simulated members each
hand out tens of updates per packet.
"""

from __future__ import annotations

__all__ = ["TransmitQueue", "Update"]


class Update:
    """One queued update: the member it is about, its wrapped encoding, its message.

    ``msg`` is the decoded message (``wire.Alive | Suspect | Dead``) when known, so an
    in-process driver can hand it to the receiver without decoding ``blob``; ``size``
    is ``len(blob)``; ``live`` turns False once a newer update about the same member
    replaced it (or it was shed or used up).
    """

    __slots__ = ("blob", "key", "live", "msg", "size")

    def __init__(self, key: str, blob: bytes, msg: object = None) -> None:
        self.key = key
        self.blob = blob
        self.msg = msg
        self.size = len(blob)
        self.live = True


class TransmitQueue:
    """Encoded updates keyed by member name, handed out fewest-transmits, newest first."""

    __slots__ = ("_buckets", "_where", "max_items")

    def __init__(self, max_items: int = 1024) -> None:
        # _buckets[t]: updates sent t times, newest last. An entry is current while its
        # ``live`` flag is set (then _where[key] is that entry); superseded ones are
        # skipped and swept lazily.
        self._buckets: list[list[Update]] = [[]]
        self._where: dict[str, Update] = {}
        self.max_items = max_items

    def __len__(self) -> int:
        return len(self._where)

    def __bool__(self) -> bool:
        return bool(self._where)

    def queue(self, key: str, payload: bytes, msg: object = None) -> None:
        """Queue an update about ``key``, replacing any older one about the same member."""
        self.queue_update(Update(key, payload, msg))

    def queue_update(self, entry: Update) -> None:
        """Queue a fresh ``Update`` record (not sent yet), replacing any older one about its key."""
        where = self._where
        old = where.get(entry.key)
        if old is not None:
            old.live = False
        where[entry.key] = entry
        self._buckets[0].append(entry)
        if len(where) > self.max_items:
            self._shed()

    def _shed(self) -> None:
        """Drop the update that has travelled the most (the oldest among equals)."""
        for t in range(len(self._buckets) - 1, -1, -1):
            for entry in self._buckets[t]:
                if entry.live:
                    entry.live = False
                    del self._where[entry.key]
                    return

    def pending(self, key: str) -> bytes | None:
        """The queued update about ``key``, if any."""
        entry = self._where.get(key)
        return entry.blob if entry is not None else None

    def transmits(self, key: str) -> int | None:
        """How many packets the update about ``key`` has ridden on (None: not queued).

        Found by its bucket (a scan: for tests and diagnostics, not the hot path), so a
        take need not count on every record it moves.
        """
        entry = self._where.get(key)
        if entry is None:
            return None
        for t, bucket in enumerate(self._buckets):
            if any(e is entry for e in bucket):
                return t
        raise AssertionError(f"queued update about {key!r} is in no bucket")

    def take(self, budget: int, limit: int) -> list[bytes]:
        """Updates fitting in ``budget`` bytes; each counts one transmission, up to ``limit``."""
        return [entry.blob for entry in self.take_updates(budget, limit)[0]]

    def take_updates(self, budget: int, limit: int) -> tuple[list[Update], int]:
        """Like ``take``, but the ``Update`` records themselves, and their total size in bytes.

        Each bucket is a stack (newest on top), so a take removes what it sends from the
        top, and every superseded entry is discarded exactly once: O(updates taken)
        amortized. It stops at the first update that does not fit.
        """
        if not self._where or budget <= 0:
            return [], 0
        out: list[Update] = []
        append = out.append
        used = 0
        buckets = self._buckets
        ends: list[int] = []  # out[ends[t-1]:ends[t]] came from bucket t
        for bucket in buckets:
            i = len(bucket)
            while i:
                entry = bucket[i - 1]
                if entry.live:
                    size = entry.size
                    if size > budget:
                        budget = 0
                        break
                    budget -= size
                    used += size
                    append(entry)
                i -= 1  # sent now, or superseded: off the stack
            del bucket[i:]
            ends.append(len(out))
            if budget < 8:
                break
        where = self._where
        lo = 0
        for t, hi in enumerate(ends):
            if hi == lo:
                continue
            nxt = t + 1
            if nxt >= limit:
                for entry in out[lo:hi]:
                    entry.live = False
                    del where[entry.key]
            else:
                if nxt == len(buckets):
                    buckets.append([])
                buckets[nxt].extend(out[lo:hi])
            lo = hi
        return out, used

    def clear(self) -> None:
        """Forget every queued update."""
        for entry in self._where.values():
            entry.live = False
        self._buckets = [[]]
        self._where.clear()
