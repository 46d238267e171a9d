"""Power cuts under the write-ahead log: the writer is SIGKILLed on a lossyfs mount, then
the mount loses everything that was not synced (a torn, seeded prefix of each file's
unsynced writes survives), and the log is recovered.

Each round checks what ``test_wal_crash`` checks after a kill, now against the disk a
machine finds after losing power: every acknowledged batch is there, what is there is
the acknowledged state plus a record prefix of the in-flight batches, and
``accord wal check`` on the cut directory reports a clean end or a torn tail, never
damage. Small segments make every round create, preallocate, rotate into and delete
segments; a slow-disk build (``crash_writer.patch_wal``) makes kills land between a
write and its fdatasync, so cuts tear records. Two deliberately broken builds
(acknowledging before the fdatasync; never fsyncing the directory after a segment is
created, renamed into place or deleted) must each be caught by the same check.

Seeds: the writer's and the cut's seeds of every round are printed; set
``WAL_POWER_CUT_SEED`` to replay a run.
"""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.raft.core.types import PersistentState
from accord.raft.storage import walcheck
from accord.raft.storage.wal import WriteAheadLog
from tests.tools.lossyfs.control import LossyFS

from .crash_writer import TASKS
from .model import Workload, prefix_models
from .test_wal_crash import Zygote, zygote  # noqa: F401 - fixture


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LossyFS]:
    with LossyFS(tmp_path / "disk", tmp_path / "mnt") as fs:
        yield fs


def _recover(waldir: Path, segment_bytes: int) -> dict[int, PersistentState]:
    wal, rec = WriteAheadLog.open(waldir, segment_bytes=segment_bytes, sync=True)
    wal.close()
    return rec


def _wait_open(ackfile: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ackfile.exists() and b"open" in ackfile.read_bytes():
            return
        time.sleep(0.005)


def cut_rounds(tmp_path: Path, zygote: Zygote, disk: LossyFS, seed: int, rounds: int,  # noqa: F811
               segment_bytes: int, build: str | None = None) -> tuple[list[str], dict[str, int]]:
    """Kill, cut, check ``rounds`` times; returns (problems found, counts)."""
    rng = random.Random(seed)
    waldir = disk.mountpoint / "wal"
    ackfile = tmp_path / "acks"  # the client's notes: on the real disk, not the lossy one
    state: dict[int, PersistentState] = {}
    problems: list[str] = []
    counts = {"cuts": 0, "acked_batches": 0, "clean_ends": 0, "torn_tails": 0}
    for rnd in range(rounds):
        wseed, cseed = rng.getrandbits(32), rng.getrandbits(32)
        where = f"round {rnd} (writer seed {wseed}, cut seed {cseed}, run seed {seed})"
        conf_base = (rnd + 1) * 1_000_000
        ackfile.unlink(missing_ok=True)
        zygote.run(waldir, ackfile, wseed, conf_base, segment_bytes, build)
        _wait_open(ackfile)
        time.sleep(0.03 + 0.15 * rng.random())
        zygote.kill_child()
        disk.power_cut(seed=cseed, torn=True)
        counts["cuts"] += 1
        out = io.StringIO()
        if walcheck.check(waldir, out) != 0:
            problems.append(f"{where}: `accord wal check` called the cut log damaged:\n"
                            f"{out.getvalue()}")
            break
        report = out.getvalue()
        counts["torn_tails" if "torn tail" in report else "clean_ends"] += 1
        rec = _recover(waldir, segment_bytes)
        lines = ackfile.read_text().split() if ackfile.exists() else []
        if "open" not in lines:
            if rec != state:
                problems.append(f"{where}: the state changed before the writer opened")
                break
            continue
        acked = [int(x) for x in lines if x != "open"]
        a = max(acked, default=-1)
        counts["acked_batches"] += len(acked)
        gen = Workload(wseed, state, conf_base=conf_base)
        for _ in range(a + 1):
            gen.next_batch()
        floor = gen.model.copy()
        inflight = [gen.next_batch() for _ in range(TASKS + 1)]
        if not any(m.expected() == rec for m in prefix_models(floor, inflight)):
            problems.append(f"{where}: the recovered log is not the acknowledged state "
                            f"(batch {a} of {len(acked)} acknowledged) plus a prefix of "
                            f"the in-flight batches: an acknowledged batch was lost")
            break
        state = rec
    return problems, counts


def _seed(default: int) -> int:
    seed = int(os.environ.get("WAL_POWER_CUT_SEED", default))
    print(f"WAL_POWER_CUT_SEED={seed}")
    return seed


@pytest.mark.parametrize(("segment_bytes", "build"), [(4096, None), (4096, "slow-sync"),
                                                      (1 << 16, None)])
def test_power_cuts_lose_no_acknowledged_batch_and_wal_check_sees_no_damage(
    tmp_path: Path, zygote: Zygote, disk: LossyFS, segment_bytes: int,  # noqa: F811
    build: str | None,
) -> None:
    problems, counts = cut_rounds(tmp_path, zygote, disk, _seed(2301 + segment_bytes), 5,
                                  segment_bytes, build)
    print(f"power cuts: {counts['cuts']}, acknowledged batches checked: "
          f"{counts['acked_batches']}, wal check: {counts['clean_ends']} clean end(s), "
          f"{counts['torn_tails']} torn tail(s), unsynced bytes dropped: "
          f"{sum(c['bytes_dropped'] for c in disk.cuts)}")
    assert not problems, "\n".join(problems)
    assert counts["cuts"] == 5 and counts["acked_batches"] > 0
    if build == "slow-sync":
        assert counts["torn_tails"] > 0, "no cut tore a record: the slow disk did not slow"


@pytest.mark.parametrize("broken", ["ack-before-sync", "no-dir-fsync"])
def test_power_cuts_catch_a_deliberately_broken_log(
    tmp_path: Path, zygote: Zygote, disk: LossyFS, broken: str,  # noqa: F811
) -> None:
    problems, counts = cut_rounds(tmp_path, zygote, disk, _seed(77), 5, 4096, broken)
    print(f"{broken}: power cuts: {counts['cuts']}, found: {problems[:1]}")
    assert problems, f"five power cuts did not catch the {broken} build"
    assert "acknowledged batch was lost" in problems[0]
