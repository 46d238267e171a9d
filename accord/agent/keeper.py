"""The keeper: a small process between the agent and each task, so a task never outlives
its agent's supervision.

Without it a task is the agent's child in a session of its own: when the agent is killed
(kill -9, the OOM killer, a crash) or stopped (SIGSTOP, a hung machine), nobody stops its
tasks, while the scheduler, seeing no heartbeats, requeues their jobs elsewhere after its
fence (``SchedulerShard.fenced``): the job would run twice. Slurm's answer is slurmstepd,
one supervisor per job step; this is ours, and it knows only two facts:

* **the lifeline**: its standard input is the read end of a pipe whose only write end the
  agent holds. End of file means the agent is gone (the kernel closes a dead process's
  descriptors), and the keeper stops the task at once;
* **the deadline**: on the lifeline the agent writes one line ``"<t>\\n"`` after each
  heartbeat the cluster took, ``t`` a ``time.monotonic()`` instant (the clock is the
  host's, shared by every process on it): the agent's orphan deadline plus a slack. Past
  the latest one, the keeper stops the task itself. So an agent that is paused, or whose
  own timer never fires, still cannot keep a task running past what the scheduler's
  fence allows.

The task leads a process group of its own (its pid is the group's id, which the agent
signals to stop it as before). To stop it, the keeper sends SIGTERM to that group, and
SIGKILL after ``--grace`` seconds if the task is still there, and once it is gone to
whatever it left in its group. When the task ends the keeper ends the same way (the same
exit code, or killed by the same signal), so the agent reads the task's own exit status
from its child, the keeper.

Standard library only and run with ``python -I`` on its file: it starts in tens of
milliseconds and no variable of the task's environment (``PYTHONPATH``...) can change it.

Usage (by ``runner.TaskProcess``; fd 0 the lifeline, ``--status-fd`` a pipe)::

    python -I keeper.py --status-fd 5 --grace 10 --deadline 1234.5 [--cpus 0,1] -- CMD ARGS

The status pipe gets one line, ``ok <task pid>`` or ``error <errno> <message>`` (the
command could not be started; the keeper then exits 127), and is closed.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from typing import TextIO


def _ignore(_sig: int, _frame: object) -> None:
    """A handler that does nothing (unlike SIG_IGN, not inherited by the task's exec)."""


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("keeper: usage: keeper.py [options] -- COMMAND [ARGS...]")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="keeper.py")
    p.add_argument("--status-fd", type=int, required=True)
    p.add_argument("--grace", type=float, required=True)
    p.add_argument("--deadline", type=float, required=True)
    p.add_argument("--cpus", default="")
    args = p.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        raise SystemExit("keeper: the command is empty")
    return args, command


def _exit_as(status: int) -> None:
    """End this process the way the task ended: its exit code, or its signal."""
    if status >= 0:
        os._exit(status)
    sig = -status
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not end a process (SIGCHLD...)


def _tell(status: TextIO, line: str) -> None:
    """Write the one status line for the agent and close the pipe; an agent that is gone
    reads nothing, and is not waited for."""
    try:
        status.write(line + "\n")
        status.close()
    except OSError:
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 0:  # never our own group, never every process
        raise ValueError(f"not the task's process group: {pgid}")
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class Keeper:
    """One task, its lifeline and its deadline."""

    def __init__(self, group: int, grace: float, deadline: float) -> None:
        self.group = group
        self.grace = grace
        self.deadline = deadline
        self.kill_at: float | None = None
        """When the stop began, plus the grace: SIGKILL then."""
        self.pending = b""
        self.poll = 1.0
        """The longest sleep between two looks at the clock (and, without pidfds, at
        the task)."""

    def read_lifeline(self) -> bool:
        """Take what the agent wrote; False at end of file (the agent is gone)."""
        try:
            data = os.read(0, 4096)
        except OSError:
            return False
        if not data:
            return False
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            try:
                self.deadline = max(self.deadline, float(line))
            except ValueError:
                continue
        return True

    def stop(self, why: str) -> None:
        """SIGTERM to the task's group now, SIGKILL after the grace."""
        if self.kill_at is not None:
            return
        print(f"accord keeper: {why}: stopping the task (SIGTERM, SIGKILL after "
              f"{self.grace:g}s)", file=sys.stderr, flush=True)
        self.kill_at = time.monotonic() + self.grace
        _signal_group(self.group, signal.SIGTERM)

    def next_wake(self, now: float) -> float:
        """Seconds until the next thing to do on a timer (past the SIGKILL, a short
        wait for the task's end, the signal sent again if it has not come)."""
        at = self.kill_at if self.kill_at is not None else self.deadline
        return min(at - now, self.poll) if at > now else 0.05


def main(argv: list[str]) -> None:
    args, command = _parse(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    status = os.fdopen(args.status_fd, "w")
    if args.cpus:
        try:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        except (OSError, ValueError) as e:  # CPUs outside our cgroup: run unpinned
            print(f"accord keeper: cannot pin the task to CPUs {args.cpus}: {e}",
                  file=sys.stderr, flush=True)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
    except OSError as e:
        _tell(status, f"error {e.errno or 0} {e.strerror or e}")
        os._exit(127)
    _tell(status, f"ok {child.pid}")  # (an agent already gone: the lifeline says so below)
    keeper = Keeper(child.pid, args.grace, args.deadline)
    try:
        exited = os.pidfd_open(child.pid)
        watched = [exited, 0]
    except (OSError, AttributeError):  # a kernel before 5.3 (or a Python built without
        # pidfds): look for the task's end on each wake instead
        exited, watched = -1, [0]
        keeper.poll = 0.1
    while True:
        if exited < 0 and child.poll() is not None:
            _exit_as(child.wait())
        now = time.monotonic()
        if keeper.kill_at is not None and now >= keeper.kill_at:
            _signal_group(child.pid, signal.SIGKILL)
        if keeper.kill_at is None and now >= keeper.deadline:
            keeper.stop("no heartbeat of the agent reached the cluster in time")
        ready, _, _ = select.select(watched, [], [], keeper.next_wake(time.monotonic()))
        if exited in ready:
            code = child.wait()
            if keeper.kill_at is not None:  # stopped by us: nothing of it may stay
                _signal_group(child.pid, signal.SIGKILL)
            _exit_as(code)
        if 0 in ready and not keeper.read_lifeline():
            watched.remove(0)
            keeper.stop("the agent is gone")


if __name__ == "__main__":
    main(sys.argv[1:])
