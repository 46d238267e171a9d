"""Running one task: a child process in its own process group, logs to files, stop with grace.

``TaskProcess.start`` runs the command under a keeper (``keeper.py``: the agent's child,
in a session of its own), which starts it as the leader of a new process group (so the
task and everything it forks can be signalled as a whole: the group's id is the task's
pid), with the task's environment, a working directory and stdout/stderr appended to
``stdout.log`` / ``stderr.log`` in the task's directory, pinned to the CPUs of its
devices when they are known (the keeper pins itself before the spawn; threads and
children the task creates inherit it). The keeper holds the read end of a lifeline
pipe whose write end only this process holds: if the agent dies, or stops renewing the
task's deadline (``renew``, after each heartbeat the cluster took), the keeper stops the
task on its own. The keeper ends as the task ended, so ``wait`` returns the task's code.

``stop(grace, preempt)``: a preempted task is told first, by a file at
``ACCORD_PREEMPT_FILE`` (JSON with the reason and the kill deadline) written
before any signal; then SIGTERM goes to the whole process group and SIGKILL
after ``grace`` seconds if anything of the group is left. A task that saves a
checkpoint on SIGTERM can check for the file to know it is being preempted
rather than cancelled.

Each task directory holds ``task.json`` (job, rank, attempt, pid, the process
start time from ``/proc/PID/stat``): after an agent restart ``leftovers`` finds
the tasks an earlier life started whose group is still there (the keeper stops them when
the agent dies, but a keeper can be killed too), and ``kill_leftover`` ends one only if
its pid still belongs to the same process (the start time matches) or, the task itself
gone, its process group still has members, so a recycled pid is never signalled (Linux
gives no new process a pid that is still a process group's id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from accord.agent.discovery.found import parse_cpu_list

log = logging.getLogger("accord.agent")

PREEMPT_FILE_ENV = "ACCORD_PREEMPT_FILE"
STDOUT, STDERR, RECORD = "stdout.log", "stderr.log", "task.json"
KEEPER = Path(__file__).with_name("keeper.py")


@dataclass(slots=True, frozen=True)
class TaskKey:
    """Which task of which run: a job's rank in its ``attempt``-th placement."""

    job_id: str
    rank: int
    attempt: int

    @property
    def dirname(self) -> str:
        """The task's directory name under the agent's task root."""
        return f"{self.job_id}.r{self.rank}.a{self.attempt}"


def proc_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks since boot); None when the
    process is gone or a zombie (it has exited; only its exit status waits to be reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = text[text.rfind(")") + 2:].split()
    try:
        return None if rest[0] in ("Z", "X") else int(rest[19])
    except (IndexError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    """Is any process of group ``pgid`` left?"""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_all(fd: int) -> bytes:
    """Everything written on a pipe until its write ends are closed; then closes ``fd``
    (here, in the reading thread: a caller cancelled meanwhile must not close it under
    the read)."""
    try:
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    if pgid <= 0:  # 0 or -1 would be our own group or every process we may signal
        raise ValueError(f"not a task's process group: {pgid}")
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


class TaskProcess:
    """One task's process, its logs and its record."""

    def __init__(self, key: TaskKey, command: Sequence[str], env: Mapping[str, str], root: Path,
                 *, cwd: str = "", cpus: str = "", grace: float = 10.0) -> None:
        if not command:
            raise ValueError(f"task {key.dirname}: the command is empty")
        self.key = key
        self.command = list(command)
        self.dir = root / key.dirname
        self.cwd = cwd
        self.cpus = cpus
        self.grace = grace
        """What the keeper waits between its SIGTERM and its SIGKILL when it stops the task."""
        self.env = dict(env)
        self.env[PREEMPT_FILE_ENV] = str(self.dir / "preempt")
        self.env.setdefault("ACCORD_TASK_DIR", str(self.dir))
        self.proc: asyncio.subprocess.Process | None = None
        """The keeper (the task's exit status is its own)."""
        self.pid = 0
        """The task's pid, also its process group's id."""
        self._lifeline = -1
        self.launched = False
        """:meth:`start` was called (the task may be starting: :meth:`stop` waits)."""
        self._start_done = asyncio.Event()
        self.started_at = 0.0
        self.exit_code: int | None = None
        self.stopping = False

    @property
    def stdout_path(self) -> Path:
        """The task's stdout log."""
        return self.dir / STDOUT

    @property
    def stderr_path(self) -> Path:
        """The task's stderr log."""
        return self.dir / STDERR

    async def start(self, deadline: float = float("inf")) -> int:
        """Spawn the task under its keeper; returns the task's pid. ``OSError`` when it
        cannot be started. ``deadline`` (``time.monotonic()``) is when the keeper stops it
        unless :meth:`renew` moves it on."""
        self.launched = True
        try:
            return await self._start(deadline)
        finally:
            self._start_done.set()

    async def _start(self, deadline: float) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        cwd = self.cwd or str(self.dir)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        try:
            cpus = ",".join(str(c) for c in sorted(parse_cpu_list(self.cpus)))
        except ValueError as e:
            log.info("task %s: cannot pin to CPUs %r: %s", self.key.dirname, self.cpus, e)
            cpus = ""
        argv = [sys.executable, "-I", str(KEEPER), "--grace", repr(self.grace),
                "--deadline", repr(min(deadline, 1e15)), "--cpus", cpus]
        life_r, life_w = os.pipe()
        said_r, said_w = os.pipe()
        try:
            out = os.open(self.stdout_path, flags, 0o644)
            try:
                err = os.open(self.stderr_path, flags, 0o644)
                try:
                    self.proc = await asyncio.create_subprocess_exec(
                        *argv, "--status-fd", str(said_w), "--", *self.command,
                        stdin=life_r, stdout=out, stderr=err, env=self.env, cwd=cwd,
                        start_new_session=True, pass_fds=(said_w,))
                finally:
                    os.close(err)
            finally:
                os.close(out)
        except BaseException:
            for fd in (life_r, life_w, said_r, said_w):
                os.close(fd)
            raise
        os.close(life_r)
        os.close(said_w)
        os.set_blocking(life_w, False)
        self._lifeline = life_w
        said = (await asyncio.to_thread(_read_all, said_r)).decode(errors="replace").split(" ", 2)
        if said[0] != "ok":
            await self.proc.wait()
            self._close_lifeline()
            if said[0] == "error" and len(said) == 3 and said[1].isdigit():
                raise OSError(int(said[1]), said[2].strip())
            raise OSError(f"task {self.key.dirname}: its keeper failed to start it "
                          f"(exit {self.proc.returncode}; see {self.stderr_path})")
        self.pid = int(said[1])
        self.started_at = time.time()
        record = {"job_id": self.key.job_id, "rank": self.key.rank, "attempt": self.key.attempt,
                  "pid": self.pid, "proc_start": proc_start_time(self.pid),
                  "keeper": self.proc.pid, "started_at": self.started_at,
                  "command": self.command}
        tmp = self.dir / (RECORD + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.dir / RECORD)
        return self.pid

    def renew(self, deadline: float) -> None:
        """Tell the keeper the task may run until ``deadline`` (``time.monotonic()``)."""
        if self._lifeline < 0:
            return
        try:
            os.write(self._lifeline, f"{deadline!r}\n".encode())
        except BlockingIOError:
            pass  # the keeper is behind: it keeps the older (earlier) deadline
        except OSError:  # the keeper is gone: the task has ended
            self._close_lifeline()

    def _close_lifeline(self) -> None:
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1

    async def wait(self) -> int:
        """The exit code (``-N`` when killed by signal N), once the process has ended."""
        assert self.proc is not None, "start() first"
        code = await self.proc.wait()
        self._close_lifeline()
        self.exit_code = code
        return code

    async def stop(self, grace: float, *, preempt: bool = False, reason: str = "") -> int:
        """Tell (if preempted), SIGTERM the group, SIGKILL after ``grace``; returns the exit
        code. A stop that arrives while the task is starting waits for the start; one of a
        task that could not start returns 127 (as :meth:`start`'s ``OSError`` said)."""
        assert self.launched, "start() first"
        self.stopping = True
        await self._start_done.wait()
        if self.proc is None or self.pid <= 0:
            return 127
        if preempt:
            note = {"reason": reason or "preempted", "deadline": time.time() + grace}
            with contextlib.suppress(OSError):
                tmp = self.dir / "preempt.tmp"
                tmp.write_text(json.dumps(note))
                tmp.replace(self.dir / "preempt")
        _signal_group(self.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(max(0.0, grace)):
                code = await self.proc.wait()
        except TimeoutError:
            _signal_group(self.pid, signal.SIGKILL)
            code = await self.proc.wait()
        # The leader is gone; anything it left in its group goes too.
        _signal_group(self.pid, signal.SIGKILL)
        self._close_lifeline()
        self.exit_code = code
        return code


@dataclass(slots=True, frozen=True)
class Leftover:
    """A task an earlier agent life started, as its ``task.json`` says."""

    key: TaskKey
    pid: int
    proc_start: int | None
    dir: Path

    def alive(self) -> bool:
        """Is that very process (not a recycled pid) still there, or, the task gone, its
        process group (what it forked)?"""
        now = proc_start_time(self.pid)
        if now is not None:
            return self.proc_start is None or now == self.proc_start
        return group_alive(self.pid)


def leftovers(root: Path) -> list[Leftover]:
    """Every recorded task under ``root`` whose process is still running."""
    out = []
    try:
        dirs = sorted(root.iterdir())
    except OSError:
        return []
    for d in dirs:
        try:
            rec = json.loads((d / RECORD).read_text())
            left = Leftover(TaskKey(str(rec["job_id"]), int(rec["rank"]), int(rec["attempt"])),
                            int(rec["pid"]), rec.get("proc_start"), d)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if left.pid <= 0:  # a damaged record: no process group to look for
            continue
        if left.alive():
            out.append(left)
    return out


async def kill_leftover(left: Leftover, grace: float) -> bool:
    """End a leftover task's process group (SIGTERM, SIGKILL after ``grace``); False if gone."""
    if not left.alive():
        return False
    _signal_group(left.pid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, grace)
    while loop.time() < deadline and left.alive():
        await asyncio.sleep(0.05)
    _signal_group(left.pid, signal.SIGKILL)
    return True
