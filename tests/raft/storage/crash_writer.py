"""A WAL writer to be killed with SIGKILL at random points (used by test_wal_crash.py).

Run as ``python -m tests.raft.storage.crash_writer zygote`` from the repository root:
the process imports everything once, then serves commands on stdin so that each
crash round costs a fork rather than a Python start-up:

* ``run WALDIR ACKFILE SEED CONF_BASE [SEGMENT_BYTES]`` forks a writer child and
  answers ``pid N`` (segments of ``SEGMENT_BYTES``, 4096 unless given).
  The child opens the WAL (recovering it), then four asyncio tasks submit batches
  from ``Workload(SEED, recovered, conf_base=CONF_BASE)`` in a fixed order and,
  after each batch is durable, append its number to ACKFILE (one ``os.write`` per
  line, so a SIGKILL never loses an acknowledgement line that was written). The
  first line is ``open`` once recovery finished.
  A seventh word ``BUILD`` runs a patched build of the log in the child (see
  ``patch_wal``): a slow disk, or a deliberately broken log the power-cut tests catch.
* ``reap N`` waits for child N (which the test has killed) and answers ``reaped N``.

Run as ``python -m tests.raft.storage.crash_writer WALDIR ACKFILE SEED CONF_BASE`` it is
the writer itself, without forking.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

from accord.raft.storage import format as format_module
from accord.raft.storage import threads as threads_module
from accord.raft.storage import wal as wal_module
from accord.raft.storage.wal import WriteAheadLog

from .model import Workload

TASKS = 4
SEGMENT_BYTES = 4096
MAX_BATCHES_PER_TASK = 400


BUILDS = ("slow-sync", "ack-before-sync", "no-dir-fsync")


def _no_sync(fd: Any) -> None:
    """An fdatasync that does nothing (the broken ``ack-before-sync`` build's write)."""


def patch_wal(mode: str) -> None:
    """Monkeypatch ``WriteAheadLog`` (in this process only) into another build.

    * ``slow-sync`` (correct): every fdatasync starts 20 ms late, as on a slow disk,
      so that a kill often lands between a write and its fdatasync;
    * ``ack-before-sync`` (broken): a batch is acknowledged after its write, and
      fdatasynced 20 ms later (a writer that answers first and syncs behind);
    * ``no-dir-fsync`` (broken): the log's directory is never fsynced after a segment
      is created (prepared), renamed into place or deleted; the segment files' own
      fsyncs stay. (Skipping only the rename's fsync would be caught only when a cut
      lands before the next segment's preparation fsyncs the directory anyway.)

    Only a power cut tells the broken builds from the real log: a SIGKILL keeps the
    page cache.
    """
    if mode == "slow-sync":
        def slow_sync(fd: Any) -> None:
            time.sleep(0.02)
            os.fdatasync(fd)

        init = WriteAheadLog.__init__

        def slow_init(self: WriteAheadLog, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self._sync_file = slow_sync

        WriteAheadLog.__init__ = slow_init  # type: ignore[method-assign]
    elif mode == "ack-before-sync":
        write, notify = WriteAheadLog._write, WriteAheadLog._notify

        def late_write(self: WriteAheadLog, work: Any) -> None:
            self._sync_file = _no_sync
            try:
                write(self, work)
            finally:
                self._sync_file = os.fdatasync

        def early_notify(self: WriteAheadLog, work: Any, exc: BaseException | None) -> None:
            notify(self, work, exc)
            time.sleep(0.02)
            if self._fd >= 0:
                os.fdatasync(self._fd)

        WriteAheadLog._write = late_write  # type: ignore[method-assign]
        WriteAheadLog._notify = early_notify  # type: ignore[method-assign]
    elif mode == "no-dir-fsync":
        prepare = format_module.prepare_segment

        def prepare_without_dir_fsync(path: Path, seq: int, room: int, *, sync: bool,
                                      cancelled: Any = None) -> bool:
            done: bool = prepare(path, seq, room, sync=False, cancelled=cancelled)
            if done and sync:  # the file's own fsync, not its directory's
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            return done

        for module in (wal_module, threads_module):  # the names they imported
            module.__dict__["prepare_segment"] = prepare_without_dir_fsync
        WriteAheadLog._fsync_dir = lambda self: None  # type: ignore[method-assign]
    else:
        raise ValueError(f"unknown build {mode!r}; known: {', '.join(BUILDS)}")


def write_acks(
    waldir: str, ackfile: str, seed: int, conf_base: int, segment_bytes: int = SEGMENT_BYTES
) -> None:
    fd = os.open(ackfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    async def main() -> None:
        wal, rec = WriteAheadLog.open(waldir, segment_bytes=segment_bytes, sync=True)
        os.write(fd, b"open\n")
        gen = Workload(seed, rec, conf_base=conf_base)
        numbers = itertools.count()

        async def task() -> None:
            for _ in range(MAX_BATCHES_PER_TASK):
                j = next(numbers)
                batch = gen.next_batch()
                await wal.append(batch)
                os.write(fd, f"{j}\n".encode())

        try:
            await asyncio.gather(*(task() for _ in range(TASKS)))
        finally:
            wal.close()

    asyncio.run(main())


def zygote() -> None:
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "run":
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    seg = int(cmd[5]) if len(cmd) > 5 else SEGMENT_BYTES
                    if len(cmd) > 6:
                        patch_wal(cmd[6])
                    write_acks(cmd[1], cmd[2], int(cmd[3]), int(cmd[4]), seg)
                except BaseException:
                    code = 1
                os._exit(code)
            print(f"pid {pid}", flush=True)
        elif cmd[0] == "reap":
            pid = int(cmd[1])
            _, status = os.waitpid(pid, 0)
            print(f"reaped {pid} {status}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["zygote"]:
        zygote()
    else:
        write_acks(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
