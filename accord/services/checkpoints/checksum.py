"""Streaming checksums of shard bytes: crc32c (the ``crc32c`` library) and sha256 (hashlib).

Writers feed bytes as they write them and verifiers as they read them, so a shard is
hashed in one pass and never held in memory whole.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO, Protocol

import crc32c

from accord.services.checkpoints.model import CHECKSUM_ALGORITHMS, CheckpointError, Checksum

CHUNK = 4 * 1024 * 1024
"""Bytes read per call while hashing a file."""


class Hasher(Protocol):
    """What both algorithms offer."""

    def update(self, data: bytes) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32c:
    def __init__(self) -> None:
        self._h = crc32c.CRC32CHash()

    def update(self, data: bytes) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return format(self._h.checksum, "08x")


def hasher(algorithm: str) -> Hasher:
    """A fresh streaming hasher for ``algorithm`` (``crc32c`` or ``sha256``)."""
    if algorithm == "crc32c":
        return _Crc32c()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise CheckpointError(f"checksum algorithm {algorithm!r} is unknown; use one of "
                          f"{', '.join(CHECKSUM_ALGORITHMS)}")


def of_bytes(data: bytes, algorithm: str = "crc32c") -> Checksum:
    """The checksum of ``data``."""
    h = hasher(algorithm)
    h.update(data)
    return Checksum(algorithm, h.hexdigest())


def of_stream(f: BinaryIO, algorithm: str, limit: int | None = None) -> tuple[Checksum, int]:
    """The checksum and length of what ``f`` yields (at most ``limit + 1`` bytes are read,
    so an over-long file is detected without reading all of it)."""
    h = hasher(algorithm)
    n = 0
    while True:
        want = CHUNK if limit is None else min(CHUNK, limit + 1 - n)
        if want <= 0:
            break
        chunk = f.read(want)
        if not chunk:
            break
        h.update(chunk)
        n += len(chunk)
    return Checksum(algorithm, h.hexdigest()), n
