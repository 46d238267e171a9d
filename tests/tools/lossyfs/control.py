"""The test's handle on a lossyfs process: start, power cut, status, stop.

::

    with LossyFS(tmp_path / "disk1", tmp_path / "mnt1") as fs:
        ...                      # run something that writes under fs.mountpoint
        kill -9 it               # nothing may hold the mount while it is cut
        report = fs.power_cut(seed=7, torn=True)
        ...                      # fs.mountpoint now shows what a reboot would find

The process is the test's child, started by PID and stopped by unmounting its
mount point (then SIGKILL by PID if it does not exit); if the test dies, the child
sees its control connection close and unmounts itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .__main__ import unmount

REPO = Path(__file__).resolve().parents[3]


class LossyFSError(RuntimeError):
    """The lossyfs process failed to mount or refused a command."""


class LossyFS:
    """One lossyfs mount over ``state/backing`` at ``mountpoint`` (see the module docstring)."""

    def __init__(self, state: Path, mountpoint: Path) -> None:
        self.state = Path(state)
        self.mountpoint = Path(mountpoint)
        self.proc: subprocess.Popen[bytes] | None = None
        self._conn: socket.socket | None = None
        self._file: Any = None
        self.cuts: list[dict[str, Any]] = []
        """The report of every cut made through this handle."""

    @property
    def backing(self) -> Path:
        return self.state / "backing"

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until the mount serves."""
        self.state.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        log = open(self.state / "lossyfs.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.tools.lossyfs", str(self.mountpoint),
                 "--state", str(self.state), "--control-fd", str(theirs.fileno())],
                cwd=REPO, pass_fds=[theirs.fileno()], stdout=log, stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
            theirs.close()
        ours.settimeout(60.0)
        self._conn = ours
        self._file = ours.makefile("rwb", buffering=0)
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None:
                raise LossyFSError(f"lossyfs exited with {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise LossyFSError(f"lossyfs did not mount within {timeout}s: {self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        try:
            return (self.state / "lossyfs.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        if self._file is None:
            raise LossyFSError("lossyfs is not running")
        self._file.write(json.dumps(req).encode() + b"\n")
        line = self._file.readline()
        if not line:
            raise LossyFSError(f"lossyfs closed its control connection: {self.log()}")
        resp: dict[str, Any] = json.loads(line)
        if not resp.get("ok"):
            raise LossyFSError(f"lossyfs refused {req}: {resp.get('error')}\n"
                               f"{resp.get('trace', '')}")
        return resp

    def power_cut(self, seed: int | None = None, torn: bool = False) -> dict[str, Any]:
        """Lose everything not synced (kill every process using the mount first).

        With ``torn``, each file keeps a random prefix (chosen by ``seed`` and its
        path) of its unsynced writes. Returns the cut's report.
        """
        report: dict[str, Any] = self._call({"cmd": "cut", "seed": seed, "torn": torn})["report"]
        self.cuts.append(report)
        return report

    def status(self) -> dict[str, Any]:
        """How much the mount holds that a cut would lose."""
        status: dict[str, Any] = self._call({"cmd": "status"})["status"]
        return status

    def stop(self, timeout: float = 30.0) -> None:
        """Unmount and wait for the process (SIGKILL by PID after ``timeout``)."""
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout
        while os.path.ismount(self.mountpoint) and time.monotonic() < deadline:
            if unmount(str(self.mountpoint), lazy=False) == 0:
                break
            time.sleep(0.1)  # busy: a killed user's files are still being released
        if os.path.ismount(self.mountpoint):
            unmount(str(self.mountpoint), lazy=True)
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, 9)
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> LossyFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
