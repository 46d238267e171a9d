"""Read and write bbolt database files (the page format etcd keeps its store in).

etcd's backend is a bbolt file, and ``etcdctl snapshot save`` writes that file followed
by its SHA-256. accord reads such files (to restore an etcd backup) and writes them (so
``etcdctl snapshot status`` and ``etcdctl snapshot restore`` read accord's backups). No
maintained Python library reads or writes the format (PyPI's ``boltdb`` is a 2020 0.0.2
port), and the format is small, so it is written here from its documented layout:

* the file is an array of pages of ``page_size`` bytes (4096 by default); a page is a
  16-byte header ``id u64, flags u16, count u16, overflow u32`` followed by its body, and
  spans ``overflow + 1`` pages;
* pages 0 and 1 are *meta* pages (flag 0x04): ``magic 0xED0CDAED, version 2, page_size,
  flags, root bucket (root pgid u64, sequence u64), freelist pgid, high-water pgid, txid,
  checksum`` where the checksum is FNV-1a 64 of the 56 bytes before it; the valid meta
  with the highest txid is the current one;
* a *freelist* page (0x10) lists free page ids (``count == 0xFFFF``: the real count is the
  first u64); ``0xFFFFFFFFFFFFFFFF`` as the freelist pgid means none was written;
* a B+tree of *branch* (0x01) and *leaf* (0x02) pages holds each bucket. A branch element
  is ``pos u32, ksize u32, pgid u64``; a leaf element ``flags u32, pos u32, ksize u32,
  vsize u32``, ``pos`` counted from the element itself. A leaf element with flag 0x01 is a
  nested bucket: its value is a bucket header ``root pgid u64, sequence u64``, and with
  root 0 an *inline* leaf page follows the header inside the value;
* the root bucket (the meta's) holds the top-level buckets.

The writer lays a fresh file out in one pass: metas (both with txid 1), an empty freelist
at page 2, then every bucket's leaves and branches, then the root bucket's; every page
below the high-water mark is reachable exactly once, which is what bbolt's consistency
check (``etcdctl snapshot status`` runs it) demands. Values larger than a page go to
overflow pages. Only top-level buckets of plain key/values are written (etcd's layout
has no nested buckets); the reader reads nested ones too.

Everything that does not match the format raises :class:`BoltError` naming what and
where (page id, offset), so a damaged backup is refused with a reason.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = ["BoltDB", "BoltError", "read_db", "write_db"]

MAGIC = 0xED0CDAED
VERSION = 2
PAGE_SIZE = 4096

BRANCH, LEAF, META, FREELIST = 0x01, 0x02, 0x04, 0x10
BUCKET_LEAF = 0x01
NO_FREELIST = 0xFFFFFFFFFFFFFFFF

_PAGE = struct.Struct("<QHHI")
_META = struct.Struct("<IIIIQQQQQQ")
_LEAF_ELEM = struct.Struct("<IIII")
_BRANCH_ELEM = struct.Struct("<IIQ")
_BUCKET = struct.Struct("<QQ")
_U64 = struct.Struct("<Q")
_META_SUMMED = _META.size - 8
_MAX_DEPTH = 64

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


class BoltError(ValueError):
    """The bytes are not a well-formed bbolt database; the message says what is wrong."""


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64, the checksum of bbolt's meta pages."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True, slots=True)
class Meta:
    """A meta page's fields."""

    page_size: int
    flags: int
    root: int
    sequence: int
    freelist: int
    pgid: int
    """High-water mark: pages ``0 .. pgid-1`` are in use or free."""
    txid: int


@dataclass(frozen=True, slots=True)
class BoltDB:
    """A parsed database: its current meta and its top-level buckets, in key order.

    ``buckets[name]`` maps each plain key of top-level bucket ``name`` to its value; a
    top-level bucket that also holds nested buckets (etcd's layout has none) is in
    ``nested[name]`` as well, its own nested buckets in that one's ``nested``."""

    meta: Meta
    buckets: dict[bytes, dict[bytes, bytes]]
    nested: dict[bytes, BoltDB]

    @property
    def size(self) -> int:
        """Bytes the database occupies (bbolt's ``tx.Size()``: high-water pages)."""
        return self.meta.pgid * self.meta.page_size


def _parse_meta(data: bytes, offset: int) -> Meta | str:
    """The meta page at ``offset``, or why it is not valid."""
    if len(data) < offset + _PAGE.size + _META.size:
        return "file too short for a meta page"
    _pid, flags, _count, _overflow = _PAGE.unpack_from(data, offset)
    if not flags & META:
        return f"page at offset {offset} is not a meta page (flags {flags:#x})"
    fields = _META.unpack_from(data, offset + _PAGE.size)
    magic, version, page_size, mflags, root, seq, freelist, pgid, txid, checksum = fields
    if magic != MAGIC:
        return f"bad magic {magic:#x} (a bbolt file starts with {MAGIC:#x})"
    if version != VERSION:
        return f"bbolt version {version} is not supported (expected {VERSION})"
    start = offset + _PAGE.size
    if fnv1a64(data[start : start + _META_SUMMED]) != checksum:
        return "meta page checksum mismatch"
    if page_size < 512 or page_size & (page_size - 1):
        return f"page size {page_size} is not a power of two >= 512"
    return Meta(page_size, mflags, root, seq, freelist, pgid, txid)


def _current_meta(data: bytes) -> Meta:
    first = _parse_meta(data, 0)
    candidates: list[Meta] = []
    reasons: list[str] = []
    if isinstance(first, Meta):
        candidates.append(first)
    else:
        reasons.append(f"meta page 0: {first}")
    page_size = first.page_size if isinstance(first, Meta) else PAGE_SIZE
    second = _parse_meta(data, page_size)
    if isinstance(second, Meta):
        candidates.append(second)
    else:
        reasons.append(f"meta page 1: {second}")
    if not candidates:
        raise BoltError("not a bbolt database: " + "; ".join(reasons))
    meta = max(candidates, key=lambda m: m.txid)
    if meta.pgid * meta.page_size > len(data):
        raise BoltError(
            f"bbolt database is truncated: its meta page says {meta.pgid} pages of "
            f"{meta.page_size} bytes ({meta.pgid * meta.page_size} bytes), the file holds "
            f"{len(data)}")
    return meta


class _Reader:
    def __init__(self, data: bytes, meta: Meta) -> None:
        self.data = data
        self.meta = meta

    def page(self, pgid: int) -> tuple[int, int, int]:
        """``(offset, flags, count)`` of page ``pgid``, bounds-checked."""
        if pgid < 2 or pgid >= self.meta.pgid:
            raise BoltError(f"page id {pgid} is out of range (2..{self.meta.pgid - 1})")
        off = pgid * self.meta.page_size
        pid, flags, count, overflow = _PAGE.unpack_from(self.data, off)
        if pid != pgid:
            raise BoltError(f"page {pgid} at offset {off} says it is page {pid}")
        if pgid + overflow >= self.meta.pgid:
            raise BoltError(f"page {pgid} overflows past the end of the database")
        return off, flags, count

    def elements(self, buf: bytes, off: int, flags: int, count: int, pgid: object,
                 depth: int) -> Iterator[tuple[bytes, bytes, int]]:
        """Leaf elements ``(key, value, flags)`` of the tree whose page is at ``off``."""
        if depth > _MAX_DEPTH:
            raise BoltError(f"page {pgid}: tree deeper than {_MAX_DEPTH} (a cycle?)")
        if flags & LEAF:
            for i in range(count):
                eoff = off + _PAGE.size + i * _LEAF_ELEM.size
                eflags, pos, ksize, vsize = _LEAF_ELEM.unpack_from(buf, eoff)
                kstart = eoff + pos
                if kstart + ksize + vsize > len(buf):
                    raise BoltError(f"page {pgid}: element {i} runs past the end of the data")
                key = bytes(buf[kstart : kstart + ksize])
                yield key, bytes(buf[kstart + ksize : kstart + ksize + vsize]), eflags
        elif flags & BRANCH:
            for i in range(count):
                eoff = off + _PAGE.size + i * _BRANCH_ELEM.size
                _pos, _ksize, child = _BRANCH_ELEM.unpack_from(buf, eoff)
                coff, cflags, ccount = self.page(child)
                yield from self.elements(self.data, coff, cflags, ccount, child, depth + 1)
        else:
            raise BoltError(f"page {pgid}: expected a branch or leaf page, found flags {flags:#x}")

    def bucket(self, root: int, inline: bytes | None, name: bytes, depth: int = 0) -> BoltDB:
        if inline is not None:
            if len(inline) < _PAGE.size:
                raise BoltError(f"bucket {name!r}: inline page is truncated")
            _pid, flags, count, _ov = _PAGE.unpack_from(inline, 0)
            elems = self.elements(inline, 0, flags, count, f"inline:{name!r}", depth)
        else:
            off, flags, count = self.page(root)
            elems = self.elements(self.data, off, flags, count, root, depth)
        plain: dict[bytes, bytes] = {}
        nested: dict[bytes, BoltDB] = {}
        last: bytes | None = None
        for key, value, eflags in elems:
            if last is not None and key <= last:
                raise BoltError(f"bucket {name!r}: keys out of order at {key!r}")
            last = key
            if eflags & BUCKET_LEAF:
                if len(value) < _BUCKET.size:
                    raise BoltError(f"bucket {name!r}: nested bucket {key!r} has no header")
                sub_root, _seq = _BUCKET.unpack_from(value, 0)
                nested[key] = self.bucket(
                    sub_root, value[_BUCKET.size:] if sub_root == 0 else None, key, depth + 1)
            else:
                plain[key] = value
        return BoltDB(self.meta, {name: plain}, nested)


def read_db(data: bytes) -> BoltDB:
    """Parse a whole bbolt file (without any trailer: pass ``data[:-32]`` for an etcd
    snapshot). Raises :class:`BoltError` naming what is wrong."""
    meta = _current_meta(data)
    reader = _Reader(data, meta)
    root = reader.bucket(meta.root, None, b"")
    buckets: dict[bytes, dict[bytes, bytes]] = {}
    nested: dict[bytes, BoltDB] = {}
    if root.buckets[b""]:
        raise BoltError("the root bucket holds plain keys (only buckets belong there)")
    for name, sub in root.nested.items():
        buckets[name] = sub.buckets[name]
        if sub.nested:
            nested[name] = sub
    return BoltDB(meta, buckets, nested)


class _Writer:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.pages: list[bytes] = []
        self.next_id = 3

    def _emit(self, flags: int, count: int, body: bytes) -> int:
        pgid = self.next_id
        size = _PAGE.size + len(body)
        n = -(-size // self.page_size)
        head = _PAGE.pack(pgid, flags, count, n - 1)
        self.pages.append(head + body + b"\x00" * (n * self.page_size - size))
        self.next_id += n
        return pgid

    def tree(self, items: list[tuple[bytes, bytes, int]]) -> int:
        """Write a bucket's B+tree; returns its root page id."""
        level = self._leaves(items)
        while len(level) > 1:
            level = self._branches(level)
        return level[0][1]

    def _leaves(self, items: list[tuple[bytes, bytes, int]]) -> list[tuple[bytes, int]]:
        out: list[tuple[bytes, int]] = []
        batch: list[tuple[bytes, bytes, int]] = []
        used = _PAGE.size
        for item in items:
            need = _LEAF_ELEM.size + len(item[0]) + len(item[1])
            if batch and used + need > self.page_size:
                out.append((batch[0][0], self._leaf(batch)))
                batch, used = [], _PAGE.size
            batch.append(item)
            used += need
        out.append((batch[0][0] if batch else b"", self._leaf(batch)))
        return out

    def _leaf(self, batch: list[tuple[bytes, bytes, int]]) -> int:
        n = len(batch)
        elems = bytearray()
        data = bytearray()
        for i, (key, value, flags) in enumerate(batch):
            pos = (n - i) * _LEAF_ELEM.size + len(data)
            elems += _LEAF_ELEM.pack(flags, pos, len(key), len(value))
            data += key + value
        return self._emit(LEAF, n, bytes(elems + data))

    def _branches(self, level: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        out: list[tuple[bytes, int]] = []
        batch: list[tuple[bytes, int]] = []
        used = _PAGE.size
        for child in level:
            need = _BRANCH_ELEM.size + len(child[0])
            if len(batch) >= 2 and used + need > self.page_size:
                out.append((batch[0][0], self._branch(batch)))
                batch, used = [], _PAGE.size
            batch.append(child)
            used += need
        out.append((batch[0][0], self._branch(batch)))
        return out

    def _branch(self, batch: list[tuple[bytes, int]]) -> int:
        n = len(batch)
        elems = bytearray()
        data = bytearray()
        for i, (key, child) in enumerate(batch):
            pos = (n - i) * _BRANCH_ELEM.size + len(data)
            elems += _BRANCH_ELEM.pack(pos, len(key), child)
            data += key
        return self._emit(BRANCH, n, bytes(elems + data))

    def meta_page(self, pgid: int, root: int) -> bytes:
        fields = [MAGIC, VERSION, self.page_size, 0, root, 0, 2, self.next_id, 1]
        body = _META.pack(*fields, 0)[:_META_SUMMED]
        body += _U64.pack(fnv1a64(body))
        page = _PAGE.pack(pgid, META, 0, 0) + body
        return page + b"\x00" * (self.page_size - len(page))


def write_db(buckets: Mapping[bytes, Mapping[bytes, bytes]], page_size: int = PAGE_SIZE) -> bytes:
    """A bbolt file holding ``buckets`` (top-level bucket name -> keys -> values)."""
    if page_size < 512 or page_size & (page_size - 1):
        raise ValueError(f"page size {page_size} is not a power of two >= 512")
    w = _Writer(page_size)
    root_items: list[tuple[bytes, bytes, int]] = []
    for name in sorted(buckets):
        if not name:
            raise ValueError("a bucket name must not be empty")
        content = buckets[name]
        items = [(k, bytes(content[k]), 0) for k in sorted(content)]
        if any(not k for k, _v, _f in items):
            raise ValueError(f"bucket {name!r}: a key must not be empty")
        root_items.append((name, _BUCKET.pack(w.tree(items), 0), BUCKET_LEAF))
    root = w.tree(root_items)
    freelist = _PAGE.pack(2, FREELIST, 0, 0)
    head = (w.meta_page(0, root) + w.meta_page(1, root)
            + freelist + b"\x00" * (page_size - len(freelist)))
    return head + b"".join(w.pages)
