"""The supervisor of a node's worker processes (``docs/workers.md``).

A node of several workers is one supervisor and ``N`` worker processes; the supervisor
owns nothing on the data path. It starts every worker, restarts one that dies (its groups
recover from its own WAL, as a restarted node's do, while the other replicas carry on),
and stops them all on ``stop``: SIGTERM, a grace period for their graceful shutdown,
then SIGKILL for any still running.

Restarts back off (``restart_delay``): a worker that keeps dying at once is retried
ever more slowly, up to ``MAX_DELAY_S``, and one that ran for ``STEADY_S`` counts as
healthy again. A worker that exits with ``REMOVED_EXIT`` (its member was removed from the
cluster) stops the node, which then exits 0. A worker that exits with ``CONFIG_EXIT`` (its configuration is refused)
is not restarted: it would be refused again; the supervisor stops the node instead and
says which worker and why (``failed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.1
MAX_DELAY_S = 5.0
STEADY_S = 10.0
"""A worker that ran this long before dying is restarted at once (no backoff)."""
CONFIG_EXIT = 2
"""``accord serve``'s exit status for a refused configuration."""
REMOVED_EXIT = 3
"""A worker's exit status once its member was removed from the cluster: the node stops
(exit 0, as a node of one process does), nothing is restarted."""
MISFIT_EXIT = 4
"""A worker's exit status when its member cannot be part of the cluster (the cluster's
shard count is not the node's): the node stops (exit 1, as a node of one process does),
nothing is restarted."""


def restart_delay(failures: int) -> float:
    """Seconds to wait before restarting a worker that died ``failures`` times in a row
    without running ``STEADY_S`` (0 for the first death after a steady run)."""
    if failures <= 0:
        return 0.0
    return min(FIRST_DELAY_S * float(2 ** (failures - 1)), MAX_DELAY_S)


@dataclass(slots=True)
class WorkerState:
    """What the supervisor knows of one worker."""

    index: int
    argv: list[str]
    pid: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    """The last exit status (negative: killed by that signal)."""
    failures: int = 0
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)


class Supervisor:
    """Runs one process per ``argv`` in ``commands`` (worker ``k`` is ``commands[k]``),
    with ``env`` added to this process's environment and ``ACCORD_WORKER_INDEX`` set."""

    def __init__(self, commands: Sequence[Sequence[str]], env: Mapping[str, str] | None = None,
                 grace_s: float = 10.0) -> None:
        self.workers = [WorkerState(k, list(argv)) for k, argv in enumerate(commands)]
        self._env = dict(env or {})
        self._grace = grace_s
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.removed = False
        """A worker ended because this member was removed (``failed`` says which)."""
        self.exit_code = 2
        """The node's exit status once ``failed``: 0 removed, 1 cannot be part of the
        cluster, 2 a configuration refused."""
        """Set with the reason when a worker cannot be kept running (the node must stop)."""
        self._changed = asyncio.Event()
        self._spawning = asyncio.Lock()
        """Held while a process is being started, so ``stop`` never misses one."""

    async def start(self) -> None:
        """Start every worker and the tasks that watch and restart them."""
        for w in self.workers:
            await self._spawn(w)
        self._tasks = [asyncio.ensure_future(self._watch(w)) for w in self.workers]

    async def _spawn(self, w: WorkerState) -> bool:
        """Start worker ``w``'s process; False (nothing started) once stopping."""
        async with self._spawning:
            if self._stopping:
                return False
            env = {**os.environ, **self._env, "ACCORD_WORKER_INDEX": str(w.index)}
            w.proc = await asyncio.create_subprocess_exec(*w.argv, env=env)
            w.pid = w.proc.pid
        self._changed.set()
        log.info("worker %d started (pid %d)", w.index, w.pid)
        return True

    async def _watch(self, w: WorkerState) -> None:
        loop = asyncio.get_running_loop()
        while True:
            assert w.proc is not None
            started = loop.time()
            code = await w.proc.wait()
            w.last_exit = code
            if self._stopping:
                return
            if code in (REMOVED_EXIT, MISFIT_EXIT):
                why = (f"worker {w.index}: this member was removed from the cluster"
                       if code == REMOVED_EXIT else
                       f"worker {w.index}: this member cannot be part of the cluster; see its log")
                log.warning("%s; stopping the node", why)
                self.exit_code = 0 if code == REMOVED_EXIT else 1
                self.removed = code == REMOVED_EXIT
                if not self.failed.done():
                    self.failed.set_result(why)
                return
            if code == CONFIG_EXIT:
                why = f"worker {w.index} (pid {w.pid}) refused its configuration (exit {code}); see its log"
                log.error("%s; stopping the node", why)
                if not self.failed.done():
                    self.failed.set_result(why)
                return
            w.failures = 0 if loop.time() - started >= STEADY_S else w.failures + 1
            delay = restart_delay(w.failures)
            log.warning("worker %d (pid %d) exited with %s; restarting it in %.1fs",
                        w.index, w.pid, code, delay)
            if delay:
                await asyncio.sleep(delay)
            if not await self._spawn(w):
                return
            w.restarts += 1

    async def changed(self) -> None:
        """Wait until a worker (re)starts (for callers that follow pids, and tests)."""
        self._changed.clear()
        await self._changed.wait()

    async def stop(self) -> None:
        """SIGTERM every worker, wait up to the grace period, SIGKILL what is left."""
        self._stopping = True
        async with self._spawning:
            pass  # a start in progress has finished: its process is in the list below
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self._grace):
                for p in live:
                    await p.wait()
        except TimeoutError:
            for p in live:
                if p.returncode is None:
                    log.warning("worker pid %d did not stop within %.0fs; killing it", p.pid, self._grace)
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            for p in live:
                await p.wait()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
