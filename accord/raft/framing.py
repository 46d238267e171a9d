"""Length-prefixed frames on asyncio streams, shared by the Raft links and snapshot streams.

A frame is a 4-byte big-endian length followed by that many payload bytes. Reading
checks the length against a limit before reading the payload, so a peer cannot
make this node allocate more than the limit; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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
