"""Multi-version key-value storage with etcd's revision semantics, free of protobuf.

Every write transaction gets one main revision (``rev``); its changes get sub-revisions
0, 1, 2... in order. Each key keeps its history as plain tuples
``(mod_rev, sub, create_rev, version, value, lease)`` in revision order; a deletion is a
tombstone ``(mod_rev, sub, 0, 0, None, 0)``. A key with a single version maps straight to
its tuple, a key with several to a list of them (always two or more): no object per
revision and no list for the common single-version key (measured ~610 bytes per
256-byte-valued key in all, against ~700 with a list per key). A revision log
(``rev -> keys changed``, parallel arrays) lets watchers replay from any revision
without scanning the key space. Compaction drops every version superseded at or before
the compaction revision, and tombstones there.

Writes go through :class:`WriteTxn`, which can be rolled back until it is committed, so a
request that fails halfway changes nothing.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Final

import crc32c

from accord.services.kv import errors
from accord.services.kv.index import SortedKeys
from accord.services.kv.ranges import KeyRange

Rec = tuple[int, int, int, int, bytes | None, int]
"""One version of a key: (mod_rev, sub, create_rev, version, value, lease); value None =
tombstone."""

MOD: Final = 0
SUB: Final = 1
CREATE: Final = 2
VERSION: Final = 3
VALUE: Final = 4
LEASE: Final = 5


Hist = Rec | list[Rec]
"""A key's versions: one tuple, or a list of two or more in revision order."""

CHANGED_SHARE_FOR_LOG_WALK = 0.05
"""A compaction visits only the keys the revision log names since the previous one while
the log holds fewer entries than this share of the keys, and every key otherwise
(``bench/compaction.py``, 1 M keys: with 1,000 or 30,000 changed the log's keys take 2-3
and 53-61 ms against 93 and 143 ms for every key; with 100,000, 275-299 against 198-234:
a key reached through the log costs more cache misses than one in the pass over all)."""


def _mod(rec: Rec) -> int:
    return rec[MOD]


def _at(h: Hist, rev: int) -> Rec | None:
    """The version of a history current at ``rev`` (maybe a tombstone), or None."""
    if isinstance(h, list):
        rec = h[-1]
        if rec[MOD] <= rev:
            return rec
        i = bisect_right(h, rev, key=_mod)
        return h[i - 1] if i else None
    return h if h[MOD] <= rev else None


def versions(h: Hist) -> list[Rec]:
    """A history as a list of versions."""
    return h if isinstance(h, list) else [h]


class MVCCStore:
    """Keys, their version histories, the current and compacted revisions."""

    __slots__ = ("_log_keys", "_log_revs", "compact_rev", "hist", "keys", "rev", "stripe")

    def __init__(self) -> None:
        self.hist: dict[bytes, Hist] = {}
        self.keys = SortedKeys()
        self.rev = 1
        """Current revision: the revision of the last write (1 for an empty store)."""
        self.stripe = (1, 0)
        """``(shard count, this shard)``: ordered writes take revisions congruent to the
        shard modulo the count (configuration, set by the state machine; not snapshot)."""
        self.compact_rev = -1
        """Revision of the last compaction (-1: never compacted, as etcd's compactMainRev)."""
        self._log_revs = array("q")
        self._log_keys: list[bytes | tuple[bytes, ...]] = []

    # --- reads ------------------------------------------------------------------------
    def get(self, key: bytes, rev: int) -> Rec | None:
        """The live version of ``key`` as of ``rev``, or None if absent/deleted then."""
        h = self.hist.get(key)
        if h is None:
            return None
        rec = _at(h, rev)
        return None if rec is None or rec[VALUE] is None else rec

    def versions(self, key: bytes) -> list[Rec]:
        """Every stored version of ``key`` (oldest first; empty if none)."""
        h = self.hist.get(key)
        return [] if h is None else versions(h)

    def scan(self, kr: KeyRange, rev: int) -> Iterator[tuple[bytes, Rec]]:
        """Live ``(key, version)`` pairs of the range as of ``rev``, in key order."""
        if kr.single:
            rec = self.get(kr.start, rev)
            if rec is not None:
                yield kr.start, rec
            return
        if kr.end is not None and kr.end <= kr.start:
            return
        hist = self.hist
        current = rev >= self.rev
        for key in self.keys.irange(kr.start, kr.end):
            if current:
                h = hist[key]
                rec = h[-1] if isinstance(h, list) else h
                if rec[MOD] > rev:  # written by the write txn in progress, after ``rev``
                    found = self.get(key, rev)
                    if found is not None:
                        yield key, found
                elif rec[VALUE] is not None:
                    yield key, rec
            else:
                found = self.get(key, rev)
                if found is not None:
                    yield key, found

    # --- writes -----------------------------------------------------------------------
    def begin(self, min_revision: int = 0) -> WriteTxn:
        """Start a write transaction; its revision is max(rev + 1, min_revision).

        A negative ``min_revision`` is an *ordered stamp* (``revorder.py``): the revision
        is the lowest one at or above max(rev + 1, -min_revision) in this shard's stripe,
        so that no two shards ever write the same revision."""
        if min_revision < 0:
            return WriteTxn(self, self.striped(-min_revision))
        return WriteTxn(self, max(self.rev + 1, min_revision))

    def striped(self, stamp: int, owner: int | None = None) -> int:
        """The lowest revision >= max(rev + 1, ``stamp``) that is ``owner`` (default: this
        shard) modulo the shard count: the revisions only ``owner`` hands out."""
        n, s = self.stripe
        x = max(self.rev + 1, stamp)
        return x + ((s if owner is None else owner) - x) % n

    def begin_at(self, rev: int) -> WriteTxn:
        """Start a *retro* write transaction at ``rev``, which may be below the current
        revision: a multi-shard Txn reserved ``rev`` on this shard when it prepared, and
        its intent kept every key it writes unchanged since (so each key's last version
        is below ``rev``; ``docs/txn.md``). Reads inside it see the state at ``rev``."""
        if rev <= 0:
            raise ValueError("a retro write needs a positive revision")
        return WriteTxn(self, rev, rev - 1)

    def raise_floor(self, rev: int) -> None:
        """Move the current revision up to ``rev`` with no change at it (a revision floor:
        the next write gets a revision above ``rev``); lower values change nothing."""
        if rev > self.rev:
            self.rev = rev

    def recent_revisions(self, n: int) -> list[int]:
        """The ``n`` highest revisions at which something changed (fewer if the history
        since the last compaction holds fewer), lowest first."""
        return [] if n <= 0 else self._log_revs[-n:].tolist()

    # --- compaction -------------------------------------------------------------------
    def compact(self, rev: int) -> None:
        """Drop versions superseded at or before ``rev``; raises etcd's errors.

        While few keys changed since the previous compaction
        (:data:`CHANGED_SHARE_FOR_LOG_WALK`), only those the revision log names up to
        ``rev`` are visited: every other key last changed at or before the previous
        compaction, which left it one version there (a live one: a tombstone went), and
        any newer versions it has are above ``rev``, so nothing of it is superseded at
        ``rev``. The log holds every change since the previous compaction (writes, retro
        writes, a snapshot's load; the keys changed exactly there were compacted then),
        so a large store where few keys changed compacts in time of those."""
        if rev <= self.compact_rev:
            raise errors.COMPACTED
        if rev > self.rev:
            raise errors.FUTURE_REV
        hist = self.hist
        dead: list[bytes] = []
        shrunk: list[tuple[bytes, Rec]] = []
        revs = self._log_revs
        start, stop = bisect_right(revs, self.compact_rev), bisect_right(revs, rev)
        candidates: Iterable[tuple[bytes, Hist]]
        if stop - start < len(hist) * CHANGED_SHARE_FOR_LOG_WALK:
            # (a key the log names may be gone: rolled back, or deleted and compacted)
            candidates = [(k, hist[k]) for k in self._changed(start, stop) if k in hist]
        else:  # most keys changed: one pass over them all costs less than the log's
            candidates = hist.items()
        for key, h in candidates:
            if not isinstance(h, list):
                if h[MOD] <= rev and h[VALUE] is None:
                    dead.append(key)
                continue
            if h[0][MOD] > rev:
                continue
            i = bisect_right(h, rev, key=_mod) - 1
            if h[i][VALUE] is None:
                i += 1
            if i > 0:
                del h[:i]
                if not h:
                    dead.append(key)
                elif len(h) == 1:
                    shrunk.append((key, h[0]))
        for key, rec in shrunk:
            hist[key] = rec
        for key in dead:
            del hist[key]
            self.keys.discard(key)
        cut = bisect_left(self._log_revs, rev)
        if cut:
            del self._log_revs[:cut]
            del self._log_keys[:cut]
        self.compact_rev = rev

    def _changed(self, start: int, stop: int) -> Iterable[bytes]:
        """The keys of the revision log's entries ``start`` to ``stop``, each once, in
        the order they were written (the order their versions were allocated in: a
        visit in a hash set's order instead misses the caches ~3x as often)."""
        out: dict[bytes, None] = {}
        for entry in islice(self._log_keys, start, stop):
            if isinstance(entry, bytes):
                out[entry] = None
            else:
                out.update(dict.fromkeys(entry))
        return out

    # --- replay -----------------------------------------------------------------------
    def changes_since(
        self, start_rev: int, kr: KeyRange, max_events: int, until: int | None = None
    ) -> tuple[list[tuple[int, list[tuple[bytes, Rec, Rec | None]]]], int]:
        """Changes in ``kr`` from ``start_rev`` on, grouped by revision, whole revisions only.

        Returns ``([(rev, [(key, version, previous live version or None)...])...], next_rev)``
        with at most ``max_events`` events unless a single revision alone has more; the
        caller continues from ``next_rev``. Versions compacted away are skipped; with
        ``until``, nothing above it (the watch hub's closed revision).
        """
        out: list[tuple[int, list[tuple[bytes, Rec, Rec | None]]]] = []
        count = 0
        revs = self._log_revs
        i = bisect_left(revs, start_rev)
        last = self.rev if until is None else min(self.rev, until)
        next_rev = max(start_rev, last + 1)
        while i < len(revs):
            rev = revs[i]
            if rev > last:
                break
            entry = self._log_keys[i]
            keys = (entry,) if isinstance(entry, bytes) else entry
            batch: list[tuple[bytes, Rec, Rec | None]] = []
            for key in keys:
                if kr.contains(key):
                    self._changes_at(key, rev, batch)
            if len(batch) > 1:
                batch.sort(key=lambda change: change[1][SUB])
            if batch:
                if out and count + len(batch) > max_events:
                    return out, rev
                out.append((rev, batch))
                count += len(batch)
            i += 1
        return out, next_rev

    def _changes_at(self, key: bytes, rev: int, out: list[tuple[bytes, Rec, Rec | None]]) -> None:
        """Append every change of ``key`` at ``rev`` (usually one) with its previous version."""
        h = self.hist.get(key)
        if h is None:
            return
        if not isinstance(h, list):
            if h[MOD] == rev:
                out.append((key, h, None))
            return
        j = bisect_left(h, rev, key=_mod)
        before = h[j - 1] if j > 0 and h[j - 1][VALUE] is not None else None
        while j < len(h) and h[j][MOD] == rev:
            rec = h[j]
            out.append((key, rec, None if rec[CREATE] == rev else before))
            j += 1

    # --- integrity and persistence ----------------------------------------------------
    def hash(self, rev: int) -> int:
        """CRC32C over every stored version with mod_rev <= ``rev``, in key order."""
        crc = 0
        for key in self.keys:
            for rec in versions(self.hist[key]):
                if rec[MOD] > rev:
                    break
                value = rec[VALUE]
                head = b"%d:%d:%d:%d:%d:%d:" % (
                    len(key), rec[MOD], rec[SUB], rec[CREATE], rec[VERSION], rec[LEASE]
                )
                crc = crc32c.crc32c(head, crc)
                crc = crc32c.crc32c(key, crc)
                crc = crc32c.crc32c(b"\x00" if value is None else b"\x01" + value, crc)
        return crc

    def dump(self) -> list[Any]:
        """A msgpack-able, deterministic image of the store."""
        return self.freeze()()

    def freeze(self) -> Callable[[], list[Any]]:
        """A point-in-time copy, cheap to take (C-level copies plus one pass over the
        keys); the returned function builds :meth:`dump`'s image from it and may run in
        another thread while the store keeps changing."""
        rev, compact_rev = self.rev, self.compact_rev
        keys = list(self.keys)
        frozen = dict(self.hist)
        for key, h in frozen.items():
            if isinstance(h, list):
                frozen[key] = h.copy()

        def image() -> list[Any]:
            return [rev, compact_rev, [[key, versions(frozen[key])] for key in keys]]

        return image

    @classmethod
    def load(cls, image: Sequence[Any]) -> MVCCStore:
        """Rebuild a store from :meth:`dump`'s image (unpacked with tuples for arrays)."""
        store = cls()
        store.rev, store.compact_rev, entries = image
        compact_rev = store.compact_rev
        log: list[tuple[int, int, bytes]] = []
        keys: list[bytes] = []
        hist = store.hist
        last = b""
        for key, recs in entries:
            if not recs or any(len(r) != 6 for r in recs):
                raise ValueError(f"key {key!r}: malformed versions")
            if key <= last and keys:
                raise ValueError("snapshot keys are not in strictly increasing order")
            last = key
            hist[key] = recs[0] if len(recs) == 1 else list(recs)
            keys.append(key)
            for rec in recs:
                if rec[MOD] >= compact_rev:
                    log.append((rec[MOD], rec[SUB], key))
        store.keys = SortedKeys(keys, presorted=True)
        log.sort()
        for rev, _sub, key in log:
            store._log_append(rev, key)
        return store

    def _log_append(self, rev: int, key: bytes) -> None:
        """Record that ``key`` changed at ``rev`` (once per key and revision)."""
        if self._log_revs and self._log_revs[-1] > rev:
            self._log_insert(rev, (key,))
        elif self._log_revs and self._log_revs[-1] == rev:
            prev = self._log_keys[-1]
            if isinstance(prev, bytes):
                if prev != key:
                    self._log_keys[-1] = (prev, key)
            elif key not in prev:
                self._log_keys[-1] = (*prev, key)
        else:
            self._log_revs.append(rev)
            self._log_keys.append(key)

    def _log_append_many(self, rev: int, keys: list[bytes], repeats: bool = True) -> None:
        """Record that ``keys`` changed at ``rev`` (a key once, in first-change order;
        ``repeats=False``: the caller knows no key is there twice)."""
        if self._log_revs and self._log_revs[-1] > rev:
            self._log_insert(rev, tuple(dict.fromkeys(keys)))
            return
        if self._log_revs and self._log_revs[-1] == rev:
            for key in keys:
                self._log_append(rev, key)
            return
        unique = tuple(dict.fromkeys(keys)) if repeats else tuple(keys)
        self._log_revs.append(rev)
        self._log_keys.append(unique[0] if len(unique) == 1 else unique)


    def _log_insert(self, rev: int, keys: tuple[bytes, ...]) -> None:
        """Record a retro write's keys at ``rev``, below the log's last revision."""
        revs = self._log_revs
        i = bisect_left(revs, rev)
        if i < len(revs) and revs[i] == rev:
            prev = self._log_keys[i]
            old = (prev,) if isinstance(prev, bytes) else prev
            merged = tuple(dict.fromkeys((*old, *keys)))
            self._log_keys[i] = merged[0] if len(merged) == 1 else merged
            return
        revs.insert(i, rev)
        self._log_keys.insert(i, keys[0] if len(keys) == 1 else keys)


class WriteTxn:
    """The changes of one revision, applied in place and undoable until committed."""

    __slots__ = ("base", "changes", "events", "repeats", "replaced", "rev", "store")

    def __init__(self, store: MVCCStore, rev: int, base: int | None = None) -> None:
        self.store = store
        self.rev = rev
        """The revision this transaction's changes get."""
        self.base = store.rev if base is None else base
        """The revision whose state it builds on: the store's latest, or ``rev - 1`` for a
        retro write (:meth:`MVCCStore.begin_at`)."""
        self.changes: list[bytes] = []
        """Keys changed, in sub-revision order (a key may appear twice: etcd lets a Txn
        delete a range ending in ``"\\0"`` and put a key inside it)."""
        self.events: list[tuple[bytes, Rec, Rec | None]] = []
        """``(key, new version, prev_kv for watchers)`` per change: as etcd, the key's
        version before this revision, none for a creation."""
        self.replaced: list[Rec | None] = []
        """The live version each change replaced (inside this transaction)."""
        self.repeats = False
        """Whether some key changed twice (then :attr:`changes` holds it twice)."""

    @property
    def read_rev(self) -> int:
        """The revision reads inside this transaction see (its own changes included)."""
        if self.changes or self.base < self.store.rev:
            return self.rev
        return self.store.rev

    def put(self, key: bytes, value: bytes, lease: int) -> Rec | None:
        """Write ``key``; returns the previous live version (None if new).

        The hot path of every write: one dictionary lookup, one tuple, three appends.
        """
        store = self.store
        hist = store.hist
        rev = self.rev
        h = hist.get(key)
        sub = len(self.changes)
        rec: Rec
        prev: Rec | None
        before: Rec | None
        if h is None:
            rec = (rev, sub, rev, 1, value, lease)
            hist[key] = rec
            store.keys.add(key)
            prev = before = None
        else:
            last = h[-1] if isinstance(h, list) else h
            if last[MOD] == rev:
                self.repeats = True
            if last[VALUE] is None:  # deleted before (maybe in this transaction): a creation
                prev = before = None
                rec = (rev, sub, rev, 1, value, lease)
            else:
                prev = last
                rec = (rev, sub, last[CREATE], last[VERSION] + 1, value, lease)
                if last[MOD] == rev:  # changed earlier in this transaction
                    found = _at(h, self.base)
                    before = found if found is not None and found[VALUE] is not None else None
                else:  # ``last`` is the version as of ``store.rev``
                    before = last
            if isinstance(h, list):
                h.append(rec)
            else:
                hist[key] = [h, rec]
        self.replaced.append(prev)
        self.changes.append(key)
        self.events.append((key, rec, before))
        return prev

    def _add(self, key: bytes, rec: Rec, prev: Rec | None) -> None:
        store = self.store
        hist = store.hist
        h = hist.get(key)
        self.replaced.append(prev)
        if h is not None and (h[-1] if isinstance(h, list) else h)[MOD] == self.rev:
            self.repeats = True
        if rec[CREATE] == self.rev:
            before = None
        elif h is None:
            before = None
        else:
            found = _at(h, self.base)
            before = found if found is not None and found[VALUE] is not None else None
        if h is None:
            hist[key] = rec
            self.store.keys.add(key)
        elif isinstance(h, list):
            h.append(rec)
        else:
            hist[key] = [h, rec]
        self.changes.append(key)
        self.events.append((key, rec, before))

    def delete(self, kr: KeyRange) -> list[tuple[bytes, Rec]]:
        """Delete the live keys of ``kr``; returns the deleted ``(key, version)`` pairs."""
        victims = list(self.store.scan(kr, self.read_rev))
        for key, rec in victims:
            self._add(key, (self.rev, len(self.changes), 0, 0, None, 0), rec)
        return victims

    def rollback(self) -> None:
        """Undo every change of this transaction."""
        store = self.store
        for key in reversed(self.changes):
            h = store.hist[key]
            if isinstance(h, list):
                h.pop()
                if len(h) == 1:
                    store.hist[key] = h[0]
            else:
                del store.hist[key]
                store.keys.discard(key)
        self.changes.clear()
        self.events.clear()
        self.replaced.clear()
        self.repeats = False

    def retag(self, subs: Sequence[int]) -> None:
        """Give change ``j`` the sub-revision ``subs[j]`` instead of its place here: a
        multi-shard Txn's share numbers its changes by their operation's place in the
        whole Txn, so the merged watch can order one revision's events from several shards
        as one etcd orders them (``docs/txn.md``). ``subs`` must not decrease (the changes
        stay in their order). Before :meth:`commit`; never on the single-shard path."""
        if len(subs) != len(self.changes):
            raise ValueError(f"{len(subs)} sub-revisions for {len(self.changes)} changes")
        hist = self.store.hist
        for j, (key, rec, before) in enumerate(self.events):
            sub = subs[j]
            if rec[SUB] == sub:
                continue
            new: Rec = (rec[MOD], sub, rec[CREATE], rec[VERSION], rec[VALUE], rec[LEASE])
            h = hist[key]
            if isinstance(h, list):
                i = next(i for i in range(len(h) - 1, -1, -1) if h[i] is rec)
                h[i] = new
            else:
                hist[key] = new
            self.events[j] = (key, new, before)

    def commit(self) -> list[tuple[bytes, Rec, Rec | None]]:
        """Make the changes current; returns :attr:`events`."""
        changes = self.changes
        if not changes:
            return []
        store = self.store
        if len(changes) == 1:
            store._log_append(self.rev, changes[0])
        else:
            store._log_append_many(self.rev, changes, self.repeats)
        if self.rev > store.rev:
            store.rev = self.rev
        return self.events
