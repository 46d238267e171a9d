"""Length-prefixed frames on asyncio streams, shared by the Raft links and snapshot streams.

A frame is a 4-byte big-endian length followed by that many payload bytes. Reading
checks the length against a limit before reading the payload, so a peer cannot
make this node allocate more than the limit; every wait has a deadline.

Two ways to read: ``read_frame`` awaits one frame on a ``StreamReader`` (handshakes,
snapshot streams); ``FrameReceiver`` takes a connection over after its handshake and
hands every complete frame to a callback straight from ``data_received``, with no
task switch and no stream buffer in between (the Raft message links, where each
hop's latency counts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class FrameError(Exception):
    """The connection must be closed; the message is the reason to log."""


def frame(payload: bytes) -> bytes:
    """``payload`` with its length prefix."""
    return len(payload).to_bytes(4, "big") + payload


async def within(aw: Awaitable[T], seconds: float) -> T:
    """``await aw`` with a deadline; unlike ``wait_for`` on 3.11, never swallows a cancellation."""
    async with asyncio.timeout(seconds):
        return await aw


async def read_frame(reader: asyncio.StreamReader, max_bytes: int, wait_s: float | None) -> bytes:
    """One frame's payload.

    Raises ``FrameError`` for a length above ``max_bytes`` or a truncated frame,
    ``EOFError`` for a clean end of stream between frames, ``TimeoutError`` when
    a part takes longer than ``wait_s`` seconds (None: the caller keeps the deadline).
    """
    if wait_s is None:
        try:
            header = await reader.readexactly(4)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise FrameError(f"truncated frame header ({len(exc.partial)} of 4 bytes)") from exc
            raise EOFError from exc
        n = int.from_bytes(header, "big")
        if n > max_bytes:
            raise FrameError(f"frame length {n} exceeds the limit of {max_bytes} bytes")
        try:
            return await reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise FrameError(f"truncated frame ({len(exc.partial)} of {n} bytes)") from exc
    try:
        header = await within(reader.readexactly(4), wait_s)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError(f"truncated frame header ({len(exc.partial)} of 4 bytes)") from exc
        raise EOFError from exc
    n = int.from_bytes(header, "big")
    if n > max_bytes:
        raise FrameError(f"frame length {n} exceeds the limit of {max_bytes} bytes")
    try:
        return await within(reader.readexactly(n), wait_s)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"truncated frame ({len(exc.partial)} of {n} bytes)") from exc


def close_writer(writer: asyncio.StreamWriter | None) -> None:
    """Close a stream unless it is already closing (never waits)."""
    if writer is not None and not writer.is_closing():
        writer.close()


def take_buffered(reader: asyncio.StreamReader) -> bytes:
    """Bytes ``reader`` received beyond what was read (a peer that wrote ahead of the
    handshake reply), emptied out of it, so a protocol taking the connection over
    loses nothing. ``StreamReader`` has no public call for this; its buffer is read."""
    buf = getattr(reader, "_buffer", None)
    if not buf:
        return b""
    data = bytes(buf)
    buf.clear()
    return data


class FrameReceiver(asyncio.Protocol):
    """Protocol that splits a connection's bytes into frames and calls ``on_frame`` on each.

    Made for a connection whose handshake was read through streams: ``attach`` moves
    the transport over to it, with whatever the stream had buffered beyond the
    handshake. ``on_frame`` runs inside ``data_received``; if it raises, the
    connection closes and ``closed()`` raises that error. ``closed()`` also raises
    ``FrameError`` for a length above ``max_bytes`` or a frame cut short by the
    close, ``EOFError`` for a clean close between frames, ``OSError`` for a
    connection error and ``TimeoutError`` after ``idle_timeout`` seconds without a
    byte; it returns normally after ``detach``.
    """

    def __init__(self, on_frame: Callable[[bytes], None], max_bytes: int,
                 idle_timeout: float) -> None:
        self._on_frame = on_frame
        self._max = max_bytes
        self._idle = idle_timeout
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._need = 4
        """Bytes ``_buf`` must hold before a frame in it can be complete."""
        self._transport: asyncio.BaseTransport | None = None
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._error: BaseException | None = None
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None

    def attach(self, transport: asyncio.BaseTransport, buffered: bytes = b"", *,
               eof: bool = False) -> None:
        """Take ``transport`` over (``set_protocol``); ``buffered`` is read first, and
        ``eof`` says the previous protocol already saw the peer close its side."""
        self._transport = transport
        transport.set_protocol(self)
        self._timer = self._loop.call_at(self._last + self._idle, self._check_idle)
        if buffered:
            self.data_received(buffered)
        if eof or transport.is_closing():
            self.connection_lost(None)

    async def closed(self) -> None:
        """Wait until the connection ends; raises why (see the class docstring)."""
        await asyncio.shield(self._done)
        if self._error is not None:
            raise self._error

    def detach(self) -> None:
        """Stop: cancel the idle timer and end ``closed()`` (the caller closes the transport)."""
        self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        if self._done.done():
            return
        self._error = error
        self._done.set_result(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if error is not None and self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _check_idle(self) -> None:
        self._timer = None
        if self._done.done():
            return
        due = self._last + self._idle
        if self._loop.time() >= due:
            self._finish(TimeoutError(f"no frame for {self._idle:.1f}s"))
        else:
            self._timer = self._loop.call_at(due, self._check_idle)

    def data_received(self, data: bytes) -> None:
        """Split ``data`` (after what was left over) into frames and hand each on."""
        if self._done.done():
            return
        self._last = self._loop.time()
        if self._buf:
            # A frame spans reads: gather in a bytearray (amortized appends) until the
            # frame is complete, instead of re-joining the whole prefix on every read.
            self._buf += data
            if len(self._buf) < self._need:
                return
            buf = bytes(self._buf)
            self._buf = bytearray()
        else:
            buf = data
        pos, end = 0, len(buf)
        self._need = 4
        while end - pos >= 4:
            n = int.from_bytes(buf[pos:pos + 4], "big")
            if n > self._max:
                self._finish(FrameError(f"frame length {n} exceeds the limit of {self._max} bytes"))
                return
            stop = pos + 4 + n
            if stop > end:
                self._need = 4 + n
                break
            payload = buf[pos + 4:stop]
            pos = stop
            try:
                self._on_frame(payload)
            except Exception as exc:
                self._finish(exc)
                return
            if self._done.done():
                return
        if pos < end:
            self._buf = bytearray(buf[pos:])

    def eof_received(self) -> bool | None:
        """The peer closed its side: the connection ends (``connection_lost`` follows)."""
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """End ``closed()``: with the error, a truncation, or ``EOFError``."""
        if exc is not None:
            self._finish(exc if isinstance(exc, OSError) else OSError(str(exc)))
        elif len(self._buf) >= 4:
            n = int.from_bytes(self._buf[:4], "big")
            self._finish(FrameError(f"truncated frame ({len(self._buf) - 4} of {n} bytes)"))
        elif self._buf:
            self._finish(FrameError(f"truncated frame header ({len(self._buf)} of 4 bytes)"))
        else:
            self._finish(EOFError())
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
