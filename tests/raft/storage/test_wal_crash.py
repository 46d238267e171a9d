"""Crash test: a writer process SIGKILLed at random points, hundreds of times.

After every kill the log is recovered and compared with the deterministic
workload the writer ran: every acknowledged batch must be there, and what is
there must be a record prefix of what was submitted (nothing invented).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.raft.core.types import PersistentState
from accord.raft.storage.wal import WriteAheadLog

from .crash_writer import SEGMENT_BYTES, TASKS
from .model import Workload, prefix_models

ROOT = Path(__file__).resolve().parents[3]
DIRS = 4
ROUNDS_PER_DIR = 50


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.raft.storage.crash_writer", "zygote"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.child: int | None = None

    def ask(self, line: str) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        assert answer, f"crash_writer zygote died (exit {self.proc.poll()})"
        return answer

    def run(
        self, waldir: Path, ackfile: Path, seed: int, conf_base: int,
        segment_bytes: int = SEGMENT_BYTES, build: str | None = None,
    ) -> int:
        """Fork a writer child; ``build`` names a ``crash_writer.patch_wal`` mode."""
        line = f"run {waldir} {ackfile} {seed} {conf_base} {segment_bytes}"
        pid = int(self.ask(line + (f" {build}" if build else ""))[1])
        self.child = pid
        return pid

    def kill_child(self) -> None:
        if self.child is None:
            return
        try:
            os.kill(self.child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.ask(f"reap {self.child}")
        self.child = None

    def stop(self) -> None:
        try:
            self.kill_child()
        finally:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    try:
        yield z
    finally:
        z.stop()


def _recover(waldir: Path, segment_bytes: int = SEGMENT_BYTES) -> dict[int, PersistentState]:
    wal, rec = WriteAheadLog.open(waldir, segment_bytes=segment_bytes, sync=False)
    wal.close()
    return rec


def test_sigkill_at_random_points_loses_no_acknowledged_batch(
    tmp_path: Path, zygote: Zygote
) -> None:
    _kill_rounds(tmp_path, zygote, random.Random(20240601), DIRS, ROUNDS_PER_DIR, SEGMENT_BYTES)


def test_sigkill_while_writing_into_a_large_preallocated_segment(
    tmp_path: Path, zygote: Zygote
) -> None:
    """Segments of 64 KiB: most kills land mid-segment, over preallocated zeros, or
    while the helper thread zero-fills the next segment (a half-prepared file)."""
    _kill_rounds(tmp_path, zygote, random.Random(7031), 2, 20, 1 << 16)


def _kill_rounds(
    tmp_path: Path, zygote: Zygote, rng: random.Random, dirs: int, rounds: int, segment_bytes: int
) -> None:
    kills = 0
    acked_total = 0
    for d in range(dirs):
        waldir = tmp_path / f"wal{d}"
        ackfile = tmp_path / f"acks{d}"
        state: dict[int, PersistentState] = {}
        for rnd in range(rounds):
            seed = rng.getrandbits(32)
            conf_base = (rnd + 1) * 1_000_000
            ackfile.unlink(missing_ok=True)
            zygote.run(waldir, ackfile, seed, conf_base, segment_bytes)
            time.sleep(rng.choice([0.0, 0.005, 0.02, 0.05, 0.1]) * rng.random())
            zygote.kill_child()
            kills += 1
            rec = _recover(waldir, segment_bytes)
            lines = ackfile.read_text().split() if ackfile.exists() else []
            if "open" not in lines:
                assert rec == state, f"dir {d} round {rnd}: state changed before the writer opened"
                continue
            acked = [int(x) for x in lines if x != "open"]
            a = max(acked, default=-1)
            assert len(set(acked)) == len(acked)
            acked_total += len(acked)
            gen = Workload(seed, state, conf_base=conf_base)
            for _ in range(a + 1):
                gen.next_batch()
            floor = gen.model.copy()
            inflight = [gen.next_batch() for _ in range(TASKS + 1)]
            matches = [m for m in prefix_models(floor, inflight) if m.expected() == rec]
            assert matches, (
                f"dir {d} round {rnd}: recovered state is not the acknowledged state "
                f"(batch {a}) plus a prefix of the in-flight ones"
            )
            state = rec
    assert kills == dirs * rounds
    assert acked_total > 0
