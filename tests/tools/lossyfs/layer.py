"""The volatile layer of lossyfs: what a power cut forgets, and how the disk is rewound.

Every operation goes straight through to the backing directory, so reads see the
page cache's view (everything written). Beside it the layer keeps what is needed to
return to the *durable* view, the one a machine finds after it lost power:

* per file (by inode), the writes and truncations since its last ``fsync`` or
  ``fdatasync``, each with the bytes and the size it replaced (an undo log);
* per directory (by inode), its entries as of its last ``fsync`` (name -> inode,
  kind, symlink target). A create, rename, link, unlink, mkdir or rmdir changes
  only the current entries; an ``fsync`` of the directory makes them durable.
  The rule is strict (POSIX's, not ext4's journal order): a file's own ``fsync``
  does not make its name durable, and a rename between two directories is durable
  in each of them only once that one is fsynced.

An inode that loses its last current name while a durable entry still names it
is kept alive by a hard link in ``stash/`` (a directory: moved there), so that a
power cut can bring it back with its contents.

``power_cut`` rewinds every file's unsynced writes (newest first; with ``torn``,
a seeded random prefix of each file's unsynced bytes is kept, cut at any byte, as
a disk that lost power mid-flush may keep), then rebuilds the tree from the
durable entries (hard links to the same inodes, fresh directories, symlinks) and
swaps it in. Afterwards everything on the backing directory is durable.
File modes, owners and times are passed through and not rewound.

The layer is not thread-safe by itself: the FUSE operations hold ``lock``.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CutReport", "VolatileLayer"]

Entry = tuple[int, str, str]
"""A directory entry: (inode, kind ``f``/``d``/``l``, symlink target or "")."""


@dataclass(slots=True)
class _Write:
    offset: int
    length: int
    pre_size: int
    old: bytes
    """The bytes ``[offset, offset + len(old))`` held before (only those below pre_size)."""


@dataclass(slots=True)
class _Truncate:
    length: int
    pre_size: int
    old: bytes
    """The bytes ``[length, pre_size)`` cut off (empty when the file grew)."""


_Op = _Write | _Truncate


@dataclass(slots=True)
class CutReport:
    """What one power cut threw away."""

    seed: int | None
    torn: bool
    files_rewound: int = 0
    bytes_dropped: int = 0
    """Unsynced bytes written that the cut took back."""
    bytes_kept: int = 0
    """Unsynced bytes a torn cut kept (a prefix of each file's unsynced writes)."""
    vanished: list[str] = field(default_factory=list)
    """Paths that existed before the cut and do not after it."""
    reappeared: list[str] = field(default_factory=list)
    """Paths that did not exist before the cut and do after it (undone unlinks, renames)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "seed": self.seed, "torn": self.torn, "files_rewound": self.files_rewound,
            "bytes_dropped": self.bytes_dropped, "bytes_kept": self.bytes_kept,
            "vanished": self.vanished, "reappeared": self.reappeared,
        }


def _kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "d"
    if stat.S_ISLNK(st.st_mode):
        return "l"
    return "f"


def _entries(directory: Path) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    with os.scandir(directory) as it:
        for de in it:
            st = de.stat(follow_symlinks=False)
            k = _kind(st)
            out[de.name] = (st.st_ino, k, os.readlink(de.path) if k == "l" else "")
    return out


def _listing(root: Path) -> set[str]:
    """Every path under ``root``, relative, with a trailing ``/`` for directories."""
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel + "/"
        out.update(prefix + d + "/" for d in dirnames)
        out.update(prefix + f for f in filenames)
    return out


class VolatileLayer:
    """The undo state over ``<state>/backing`` (see the module docstring)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.backing = state / "backing"
        self.stash = state / "stash"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.stash.mkdir(exist_ok=True)
        self.lock = threading.RLock()
        self.cuts = 0
        self._durable: dict[int, dict[str, Entry]] = {}
        self._unsynced: dict[int, list[_Op]] = {}
        self._root_ino = 0
        self._rescan()

    def _rescan(self) -> None:
        """Take everything on the backing directory as durable."""
        self._durable.clear()
        self._unsynced.clear()
        self._root_ino = self.backing.stat().st_ino
        for dirpath, _dirs, _files in os.walk(self.backing):
            p = Path(dirpath)
            self._durable[p.stat().st_ino] = _entries(p)

    def path(self, rel: str) -> Path:
        """The backing path of a mount path (``/a/b``)."""
        return self.backing / rel.lstrip("/")

    # -- file data

    def note_new_file(self, fd: int) -> None:
        """A file was just created: its durable content is empty (forget a reused inode)."""
        self._unsynced.pop(os.fstat(fd).st_ino, None)

    def write(self, fd: int, data: bytes, offset: int) -> int:
        """pwrite ``data`` at ``offset``, remembering what it overwrote."""
        st = os.fstat(fd)
        pre = st.st_size
        old = os.pread(fd, min(len(data), pre - offset), offset) if offset < pre else b""
        self._unsynced.setdefault(st.st_ino, []).append(_Write(offset, len(data), pre, old))
        view = memoryview(data)
        done = 0
        while done < len(data):
            done += os.pwrite(fd, view[done:], offset + done)
        return len(data)

    def truncate(self, fd: int, length: int) -> None:
        """ftruncate to ``length``, remembering the bytes (and size) it replaced."""
        st = os.fstat(fd)
        pre = st.st_size
        old = os.pread(fd, pre - length, length) if length < pre else b""
        self._unsynced.setdefault(st.st_ino, []).append(_Truncate(length, pre, old))
        os.ftruncate(fd, length)

    def sync_file(self, fd: int) -> None:
        """fsync/fdatasync: the file's current contents and size are durable."""
        self._unsynced.pop(os.fstat(fd).st_ino, None)

    # -- names

    def sync_dir(self, directory: Path) -> None:
        """fsync of a directory: its current entries are durable."""
        self._durable[directory.stat().st_ino] = _entries(directory)

    def _durably_named(self, ino: int) -> bool:
        return any(e[0] == ino for m in self._durable.values() for e in m.values())

    def _keep(self, p: Path, st: os.stat_result) -> None:
        """``p`` (a file or an empty directory) is about to lose its last name: if a
        durable entry names it, keep it in the stash."""
        if not self._durably_named(st.st_ino):
            return
        if stat.S_ISDIR(st.st_mode):
            os.rename(p, self.stash / f"d{st.st_ino}")
        elif st.st_nlink == 1 and not stat.S_ISLNK(st.st_mode):
            keep = self.stash / f"f{st.st_ino}"
            if not keep.exists():
                os.link(p, keep)

    def mkdir(self, rel: str, mode: int) -> None:
        p = self.path(rel)
        os.mkdir(p, mode)
        self._durable[p.stat().st_ino] = {}  # a new directory is empty on disk

    def rmdir(self, rel: str) -> None:
        p = self.path(rel)
        st = os.lstat(p)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(20, "Not a directory", rel)
        if any(True for _ in os.scandir(p)):
            raise OSError(39, "Directory not empty", rel)
        self._keep(p, st)
        if p.exists():
            os.rmdir(p)

    def unlink(self, rel: str) -> None:
        p = self.path(rel)
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory", rel)
        self._keep(p, st)
        os.unlink(p)

    def rename(self, old: str, new: str) -> None:
        src, dst = self.path(old), self.path(new)
        s = os.lstat(src)
        try:
            d = os.lstat(dst)
        except FileNotFoundError:
            d = None
        if d is not None and d.st_ino != s.st_ino:
            if stat.S_ISDIR(d.st_mode):
                if not stat.S_ISDIR(s.st_mode):
                    raise IsADirectoryError(21, "Is a directory", new)
                if any(True for _ in os.scandir(dst)):
                    raise OSError(39, "Directory not empty", new)
            elif stat.S_ISDIR(s.st_mode):
                raise NotADirectoryError(20, "Not a directory", new)
            self._keep(dst, d)
        os.rename(src, dst)

    # -- the cut

    def power_cut(self, seed: int | None = None, torn: bool = False) -> CutReport:
        """Throw the volatile layer away (see the module docstring)."""
        report = CutReport(seed, torn)
        before = _listing(self.backing)
        where = self._locate()
        for ino in sorted(self._unsynced, key=lambda i: where.get(i, "")):
            ops = self._unsynced[ino]
            loc = where.get(ino)
            if not ops or loc is None:
                continue
            rel = os.path.relpath(loc, self.state)
            rng = random.Random(f"{seed}/{rel}")
            report.files_rewound += 1
            fd = os.open(loc, os.O_RDWR | os.O_CLOEXEC)
            try:
                kept, dropped = _rewind(fd, ops, rng if torn else None)
            finally:
                os.close(fd)
            report.bytes_kept += kept
            report.bytes_dropped += dropped
        fresh = self.state / "rebuild"
        old = self.state / "old"
        for leftover in (fresh, old):
            if leftover.exists():
                shutil.rmtree(leftover)
        fresh.mkdir()
        shutil.copymode(self.backing, fresh)
        self._build(fresh, self._root_ino, where, {self._root_ino})
        os.rename(self.backing, old)
        os.rename(fresh, self.backing)
        shutil.rmtree(old)
        shutil.rmtree(self.stash)
        self.stash.mkdir()
        self._rescan()
        after = _listing(self.backing)
        report.vanished = sorted(before - after)
        report.reappeared = sorted(after - before)
        self.cuts += 1
        return report

    def _locate(self) -> dict[int, Path]:
        """Inode -> one current path, over the backing tree and the stash."""
        where: dict[int, Path] = {}
        for top in (self.backing, self.stash):
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                for name in (*sorted(dirnames), *sorted(filenames)):
                    p = Path(dirpath) / name
                    where.setdefault(os.lstat(p).st_ino, p)
        where.setdefault(self._root_ino, self.backing)
        return where

    def _build(self, dst: Path, dir_ino: int, where: dict[int, Path], seen: set[int]) -> None:
        for name, (ino, kind, target) in sorted(self._durable.get(dir_ino, {}).items()):
            out = dst / name
            if kind == "l":
                os.symlink(target, out)
            elif kind == "d":
                if ino in seen:  # two durable entries for one directory: keep the first
                    continue
                seen.add(ino)
                out.mkdir()
                src = where.get(ino)
                if src is not None:
                    shutil.copymode(src, out)
                self._build(out, ino, where, seen)
            else:
                src = where.get(ino)
                if src is None:
                    raise RuntimeError(
                        f"lossyfs: durable entry {out} names inode {ino}, which is gone "
                        f"(the stash missed it)"
                    )
                os.link(src, out)

    # -- introspection

    def status(self) -> dict[str, int]:
        """How much is volatile now."""
        dirty_dirs = 0
        for dirpath, _d, _f in os.walk(self.backing):
            p = Path(dirpath)
            if self._durable.get(p.stat().st_ino) != _entries(p):
                dirty_dirs += 1
        return {
            "unsynced_files": sum(1 for ops in self._unsynced.values() if ops),
            "unsynced_bytes": sum(op.length for ops in self._unsynced.values()
                                  for op in ops if isinstance(op, _Write)),
            "dirty_dirs": dirty_dirs,
            "cuts": self.cuts,
        }


def _units(op: _Op) -> int:
    return op.length if isinstance(op, _Write) else 1


def _rewind(fd: int, ops: list[_Op], rng: random.Random | None) -> tuple[int, int]:
    """Undo ``ops`` (newest first) on ``fd``; with ``rng``, keep a random prefix of them.

    The prefix is measured in written bytes (a truncation counts as one unit), so the
    kept part can end inside a write: that write is kept up to the chosen byte.
    Returns (bytes kept, bytes dropped).
    """
    total = sum(_units(op) for op in ops)
    keep = rng.randint(0, total) if rng is not None else 0
    acc, cut, partial = 0, len(ops), 0
    for i, op in enumerate(ops):
        u = _units(op)
        if acc + u <= keep:
            acc += u
            continue
        cut, partial = i, keep - acc
        break
    for op in reversed(ops[cut + 1:]):
        _undo(fd, op, 0)
    if cut < len(ops):
        _undo(fd, ops[cut], partial)
    written = sum(op.length for op in ops if isinstance(op, _Write))
    kept = sum(op.length for op in ops[:cut] if isinstance(op, _Write))
    if cut < len(ops) and isinstance(ops[cut], _Write):
        kept += partial
    return kept, written - kept


def _undo(fd: int, op: _Op, keep: int) -> None:
    """Undo ``op`` except its first ``keep`` bytes (writes only)."""
    if isinstance(op, _Truncate):
        os.ftruncate(fd, op.pre_size)
        if op.old:
            os.pwrite(fd, op.old, op.length)
        return
    os.ftruncate(fd, op.pre_size if keep == 0 else max(op.pre_size, op.offset + keep))
    if keep < len(op.old):
        os.pwrite(fd, op.old[keep:], op.offset + keep)
