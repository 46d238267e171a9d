"""Durable file primitives: a directory's entries made durable, a file replaced atomically.

A file's bytes are durable once the file is fsynced; its *name* (a create, a rename, an
unlink) only once its directory is fsynced. Every small file the node keeps outside the
WAL (its identity, the shard count, certificates it wrote, the command log's snapshot)
is replaced the same way: written to a temporary name, fsynced, renamed over the old
one, and the directory fsynced, so a crash or a power cut leaves either the old file
or the new one, never a torn or a missing one. ``tests/raft/storage/test_files.py``
shows it on lossyfs, the test file system that drops what was not synced.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path | str) -> None:
    """fsync a directory so that file creations, renames and deletions in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, data: bytes, *, mode: int = 0o644) -> Path:
    """Atomically and durably make ``data`` the content of ``path``; returns ``path``.

    The temporary file (``<name>.tmp`` beside it) is created with ``mode`` (0600 for a
    private key: it never exists with wider permissions)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path
