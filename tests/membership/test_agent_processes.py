"""Five real agent processes on 127.0.0.1: kill -9 one, SIGSTOP/SIGCONT another.

Each agent prints membership events as JSON lines; a reader thread per process feeds
them into one queue, and the test folds them into each agent's view of the others.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from accord.membership.config import SwimConfig

REPO = Path(__file__).resolve().parents[2]
CFG = SwimConfig.local()
# Detection bound for the local profile: a few probe periods to be probed by someone,
# the longest (unconfirmed) Lifeguard suspicion timeout, dissemination, and slack for
# a loaded machine.
DETECTION_BOUND = 10 * CFG.probe_interval + CFG.suspicion_timeout(5) * CFG.suspicion_max_timeout_mult + 5.0


def free_ports(count: int) -> list[int]:
    """Distinct ports free for both UDP and TCP on 127.0.0.1 (held until all are chosen)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(50 * count):
            if len(ports) == count:
                break
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", 0))
            held.append(udp)
            port = int(udp.getsockname()[1])
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(tcp)
            try:
                tcp.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
    finally:
        for sock in held:
            sock.close()
    if len(ports) < count:
        raise RuntimeError("not enough free port pairs")
    return ports


class Cluster:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: queue.Queue[tuple[str, dict[str, object]]] = queue.Queue()
        self.views: dict[str, dict[str, str]] = {}

    def spawn(self, name: str, port: int, seed: int | None) -> None:
        cmd = [
            sys.executable, "-m", "accord.membership.agent",
            "--bind", f"127.0.0.1:{port}", "--name", name, "--profile", "local",
            "--meta", f"role=test-{name}",
        ]
        if seed is not None:
            cmd += ["--seed", f"127.0.0.1:{seed}"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.procs[name] = proc
        self.views[name] = {}
        threading.Thread(target=self._read, args=(name, proc), daemon=True).start()

    def _read(self, name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self.lines.put((name, json.loads(line)))
            except json.JSONDecodeError:
                continue

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}: {self.views}")
            try:
                observer, ev = self.lines.get(timeout=min(0.2, remaining))
            except queue.Empty:
                continue
            if ev.get("event") in ("joined", "updated", "suspect", "dead", "left", "alive"):
                self.views[observer][str(ev["name"])] = str(ev["state"])

    def sees(self, observers: list[str], subject: str, states: set[str]) -> bool:
        return all(self.views[o].get(subject) in states for o in observers)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.stop_all()


def test_kill_and_pause_real_agents(cluster: Cluster) -> None:
    names = [f"a{i}" for i in range(5)]
    ports = free_ports(len(names))
    for i, name in enumerate(names):
        cluster.spawn(name, ports[i], None if i == 0 else ports[0])
    cluster.wait(
        lambda: all(cluster.sees([o], s, {"alive"}) for o in names for s in names if s != o),
        30.0, "all five agents to see each other alive",
    )

    # kill -9: every other agent marks it dead within the configured bound.
    victim = "a4"
    cluster.procs[victim].kill()
    survivors = names[:4]
    cluster.wait(lambda: cluster.sees(survivors, victim, {"dead"}), DETECTION_BOUND, "the killed agent to be dead")

    # SIGSTOP past the suspicion timeout: it is suspected (and may well be declared dead).
    paused = "a3"
    others = names[:3]
    pid = cluster.procs[paused].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        cluster.wait(
            lambda: cluster.sees(others, paused, {"suspect", "dead"}),
            DETECTION_BOUND, "the paused agent to be suspected",
        )
        time.sleep(CFG.suspicion_timeout(4) * 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    # It refutes and is alive everywhere; it sees the others alive too.
    cluster.wait(lambda: cluster.sees(others, paused, {"alive"}), 20.0, "the resumed agent to be alive again")
    cluster.wait(
        lambda: all(cluster.sees([paused], o, {"alive"}) for o in others),
        20.0, "the resumed agent to see the others alive",
    )
    # No permanent false death: every running agent settles on everyone alive (a
    # transient suspicion right after the resume is allowed, and refuted).
    cluster.wait(
        lambda: all(cluster.sees([o], s, {"alive"}) for o in names[:4] for s in names[:4] if s != o),
        20.0, "every running agent to see every other alive",
    )
