"""The snapshot stream protocol: resumable, CRC-checked pieces on a connection of their own.

After the handshake (``kind="snapshot"``) the sender writes one ``SnapshotPiece``
per frame and waits for the receiver's ack, ``(next_offset, complete)``, before the
next one. The first piece is an empty probe: its ack tells where the receiver's
storage left off, so a transfer cut by a dropped connection (or a restart)
resumes there. An ack at an unexpected offset makes the sender seek to it. Each
piece carries the CRC32C of its bytes, checked before the receiver sees it.

``PeerTransport`` dials, retries and owns the tasks; this module only speaks the
protocol on an established stream, so it can be read (and tested) on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import crc32c

from accord.raft.core.types import SnapshotMeta
from accord.raft.transport import codec
from accord.raft.transport.codec import CodecError, SnapshotPiece
from accord.raft.transport.framing import FrameError, frame, read_frame, within

_ACK_MAX = 64

OnSnapshotChunk = Callable[[int, SnapshotPiece], Awaitable[int]]
"""``(from_node, piece) -> next offset wanted``.

Contract for the receiver: store ``piece.data`` if ``piece.offset`` is the offset
it expects and return the next one; for a probe (empty, not done) or an offset it
does not expect, store nothing and return the offset it expects (0 to start over).
When ``piece.done``, verify and install, then return ``piece.offset + len(piece.data)``
to report success. Raising closes the stream; the sender retries and resumes.
"""


class SnapshotSource(Protocol):
    """The sending side's view of a snapshot: its size and random-access reads."""

    @property
    def size(self) -> int:
        """Total number of bytes."""

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes starting at ``offset`` (non-empty before the end)."""


class BytesSnapshotSource:
    """A ``SnapshotSource`` over bytes already in memory."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    @property
    def size(self) -> int:
        """Total number of bytes."""
        return len(self._data)

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """A slice of the data."""
        return self._data[offset:offset + max_bytes]


class SnapshotSendError(Exception):
    """A snapshot could not be delivered; the message says why."""


async def push(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, group_id: int,
               meta: SnapshotMeta, source: SnapshotSource, *, chunk_size: int,
               io_timeout: float, on_piece: Callable[[], None]) -> None:
    """Send a snapshot on an open stream until the receiver reports it complete.

    Raises ``FrameError``/``CodecError``/``OSError``/``TimeoutError`` if the stream
    fails (the caller may retry: the receiver resumes), ``SnapshotSendError`` if the
    source itself is short.
    """
    size = source.size
    piece = SnapshotPiece(group_id, meta, 0, b"", False)  # probe: where to start?
    # Every piece either advances the offset or is answered with a rewind; bound
    # the rounds so that a confused receiver cannot keep the sender forever.
    for _ in range(4 * (size // chunk_size + 2)):
        writer.write(frame(codec.encode_piece(piece, crc32c.crc32c(piece.data))))
        on_piece()
        await within(writer.drain(), io_timeout)
        try:
            payload = await read_frame(reader, _ACK_MAX, io_timeout)
        except EOFError as exc:
            raise FrameError("receiver closed the snapshot stream") from exc
        offset, complete = codec.decode_ack(payload)
        if complete:
            return
        if offset > size:
            raise FrameError(f"receiver asked for offset {offset} beyond the size {size}")
        data = await source.read(offset, chunk_size) if offset < size else b""
        if offset < size and not data:
            raise SnapshotSendError(f"snapshot source returned no data at offset {offset}")
        piece = SnapshotPiece(group_id, meta, offset, data, offset + len(data) >= size)
    raise FrameError("snapshot stream made no progress")


async def receive(frm: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  on_chunk: OnSnapshotChunk, *, max_frame: int, idle_timeout: float,
                  io_timeout: float, on_piece: Callable[[], None]) -> None:
    """Serve one snapshot stream from node ``frm`` until it closes.

    Raises ``FrameError`` for malformed or corrupt pieces, ``EOFError`` at the end.
    """
    while True:
        payload = await read_frame(reader, max_frame, idle_timeout)
        try:
            piece, crc = codec.decode_piece(payload, max_frame)
        except CodecError as exc:
            raise FrameError(f"malformed snapshot piece from node {frm}: {exc}") from exc
        if crc32c.crc32c(piece.data) != crc:
            raise FrameError(f"snapshot piece from node {frm} at offset {piece.offset}: CRC mismatch")
        on_piece()
        want = await on_chunk(frm, piece)
        complete = piece.done and want == piece.offset + len(piece.data)
        writer.write(frame(codec.encode_ack(want, complete)))
        await within(writer.drain(), io_timeout)
