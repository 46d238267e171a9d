"""The write-ahead log's threads and doorbells (``wal.py`` drives them).

* :class:`LoopLink`: one event loop's completion doorbell. The writer thread queues
  the futures it finished and rings an eventfd the loop watches; ``os.eventfd_write``
  releases the GIL around the syscall, so the loop thread wakes to a free GIL.
* :class:`SyncWaiter`: what a caller without a loop (``append_sync``) waits on.
* :class:`PrepJob`: the next segment, zero-filled on a helper thread ahead of use, so
  that rotation never waits for 64 MiB of zeros on the writer's path.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from pathlib import Path

from accord.raft.storage.format import prep_name, prepare_segment


class PrepJob:
    """The next segment being zero-filled on a helper thread (see ``wal.py``'s docstring)."""

    __slots__ = ("cancelled", "done", "error", "path", "room", "seq", "thread")

    def __init__(self, directory: Path, seq: int, room: int, sync: bool) -> None:
        self.seq = seq
        self.room = room
        self.path = directory / prep_name(seq)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.cancelled = False
        self.thread = threading.Thread(
            target=self._run, args=(sync,), name=f"wal-prepare:{seq}", daemon=True
        )
        self.thread.start()

    def _run(self, sync: bool) -> None:
        try:
            prepare_segment(self.path, self.seq, self.room, sync=sync, cancelled=self._cancelled)
        except BaseException as e:  # handed to the writer, which stops the log
            self.error = e
        finally:
            self.done.set()

    def _cancelled(self) -> bool:
        return self.cancelled

    def discard(self) -> None:
        """Stop (or wait for) the job and remove its file: it will not be used."""
        self.cancelled = True
        self.thread.join()
        self.path.unlink(missing_ok=True)


class SyncWaiter:
    """What ``append_sync`` waits on: set by the writer once the batch is durable (or failed)."""

    __slots__ = ("error", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None


Done = tuple[list[asyncio.Future[None]], BaseException | None]


class LoopLink:
    """One event loop's two doorbells with the writer thread.

    ``done`` holds batches of futures the writer has finished (durable, or failed);
    the writer rings ``fd`` (an eventfd the loop watches with ``add_reader``) after
    queueing them. ``os.eventfd_write`` releases the GIL around the syscall, so the
    loop thread wakes to a free GIL instead of waking, finding the writer still
    holding it, and sleeping again (what ``call_soon_threadsafe`` costs: uvloop rings
    its async handle with the GIL held). ``kick_pending`` is True while a ``_kick``
    of the writer is scheduled on this loop (one per loop turn).
    """

    __slots__ = ("done", "fd", "kick_pending", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.done: deque[Done] = deque()
        self.kick_pending = False
        try:
            loop.add_reader(self.fd, self.drain)
        except BaseException:
            os.close(self.fd)
            raise

    def drain(self) -> None:
        """On the loop: resolve every future the writer has finished."""
        if self.fd < 0:
            return
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        done = self.done
        while done:
            futs, exc = done.popleft()
            resolve(futs, exc)

    def detach(self) -> None:
        """On the loop (or with the loop stopped): settle what is done, stop watching."""
        if self.fd < 0:
            return
        if not self.loop.is_closed():
            self.drain()
            self.loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1


def resolve(futs: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    for f in futs:
        if not f.done():
            if exc is None:
                f.set_result(None)
            else:
                f.set_exception(exc)


def deliver(link: LoopLink, futs: list[asyncio.Future[None]], exc: BaseException | None) -> None:
    """Writer thread: hand settled futures to their loop and ring it.

    ``os.eventfd_write`` releases the GIL around the syscall. Links are closed only
    after the writer has stopped (see ``close``); the check and the guard only keep
    a misuse from killing the writer thread.
    """
    link.done.append((futs, exc))
    if link.fd >= 0:
        try:
            os.eventfd_write(link.fd, 1)
        except OSError:
            pass
