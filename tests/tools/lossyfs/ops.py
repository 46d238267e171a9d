"""lossyfs's FUSE operations: a passthrough to the backing directory through the layer.

Each operation holds the layer's lock, so a power cut never lands inside one. File
data goes through :meth:`VolatileLayer.write` / ``truncate`` (which remember what
they overwrote), ``fsync``/``fdatasync`` and a directory's ``fsync`` go to the layer
and are not passed on: the backing directory's own durability is not what is
being tested. Files are opened read-write on the backing side whatever the caller
asked (the undo log has to read what a write replaces) and without ``O_APPEND``
(the kernel supplies the offset of an appending write).

Not supported, with an error rather than a silent difference: ``fallocate``
(``EOPNOTSUPP``, which makes ``posix_fallocate`` fall back to writing) and
``rename`` flags (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``: ``EINVAL``).
"""

from __future__ import annotations

import errno
import os
from typing import Any

import mfusepy

from .layer import VolatileLayer

_STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size",
              "st_blocks", "st_blksize", "st_rdev")


def _attrs(st: os.stat_result) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(st, k) for k in _STAT_KEYS}
    out["st_atime"] = st.st_atime_ns
    out["st_mtime"] = st.st_mtime_ns
    out["st_ctime"] = st.st_ctime_ns
    return out


class LossyOperations(mfusepy.Operations):  # type: ignore[misc]
    """The mount's operations (see the module docstring)."""

    use_ns = True

    def __init__(self, layer: VolatileLayer) -> None:
        self.layer = layer
        self._lock = layer.lock

    # -- attributes and names

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self._lock:
            if path is None:
                if fh is None:
                    raise mfusepy.FuseOSError(errno.EBADF)
                return _attrs(os.fstat(fh))
            return _attrs(os.lstat(self.layer.path(path)))

    def access(self, path: str, amode: int) -> int:
        with self._lock:
            if not os.access(self.layer.path(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        """Entries with their inode numbers (with ``use_ino`` a zero one would hide them)."""
        with self._lock:
            d = self.layer.path(path)
            out = []
            for name in (".", "..", *sorted(os.listdir(d))):
                st = os.lstat(d / name)
                out.append((name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0))
            return out

    def opendir(self, path: str) -> int:
        with self._lock:
            if not self.layer.path(path).is_dir():
                raise mfusepy.FuseOSError(errno.ENOTDIR)
        return 0

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    def readlink(self, path: str) -> str:
        with self._lock:
            return os.readlink(self.layer.path(path))

    def mkdir(self, path: str, mode: int) -> int:
        with self._lock:
            self.layer.mkdir(path, mode)
        return 0

    def rmdir(self, path: str) -> int:
        with self._lock:
            self.layer.rmdir(path)
        return 0

    def unlink(self, path: str) -> int:
        with self._lock:
            self.layer.unlink(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._lock:
            self.layer.rename(old, new)
        return 0

    def symlink(self, target: str, source: str) -> int:
        """Create ``target``, a symlink whose content is ``source``."""
        with self._lock:
            os.symlink(source, self.layer.path(target))
        return 0

    def link(self, target: str, source: str) -> int:
        """Create ``target``, a hard link to ``source``."""
        with self._lock:
            os.link(self.layer.path(source), self.layer.path(target))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        with self._lock:
            os.chmod(self.layer.path(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self._lock:
            os.chown(self.layer.path(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self._lock:
            if times is None:
                os.utime(self.layer.path(path))
            else:
                os.utime(self.layer.path(path), ns=(int(times[0]), int(times[1])))
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.layer.backing)
        return {k: getattr(sv, k) for k in (
            "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
            "f_ffree", "f_favail", "f_flag", "f_namemax")}

    # -- files

    @staticmethod
    def _backing_flags(flags: int) -> int:
        acc = flags & os.O_ACCMODE
        keep = flags & ~(os.O_ACCMODE | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_TRUNC)
        return keep | (os.O_RDONLY if acc == os.O_RDONLY else os.O_RDWR) | os.O_CLOEXEC

    def open(self, path: str, flags: int) -> int:
        with self._lock:
            fd = os.open(self.layer.path(path), self._backing_flags(flags))
            if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
                self.layer.truncate(fd, 0)
            return fd

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        with self._lock:
            p = self.layer.path(path)
            new = not os.path.lexists(p)
            fd = os.open(p, self._backing_flags(flags) | os.O_CREAT | (flags & os.O_EXCL), mode)
            if new:
                self.layer.note_new_file(fd)
            if flags & os.O_TRUNC:
                self.layer.truncate(fd, 0)
            return fd

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self._lock:
            return os.pread(fh, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self._lock:
            return self.layer.write(fh, data, offset)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._lock:
            if path is None:
                if fh is None:
                    raise mfusepy.FuseOSError(errno.EBADF)
                self.layer.truncate(fh, length)
                return 0
            fd = os.open(self.layer.path(path), os.O_RDWR | os.O_CLOEXEC)
            try:
                self.layer.truncate(fd, length)
            finally:
                os.close(fd)
        return 0

    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        raise mfusepy.FuseOSError(errno.EOPNOTSUPP)

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def release(self, path: str | None, fh: int) -> int:
        with self._lock:
            os.close(fh)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self._lock:
            self.layer.sync_file(fh)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        if path is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        with self._lock:
            self.layer.sync_dir(self.layer.path(path))
        return 0


class LossyFUSE(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, refusing rename flags instead of dropping them."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        if flags:
            return -errno.EINVAL
        result: int = self.rename_fuse_2(old, new)
        return result
