"""The supervisor of a node's workers (accord/node/supervisor.py), with real child processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from accord.node.supervisor import (
    CONFIG_EXIT,
    MAX_DELAY_S,
    MISFIT_EXIT,
    REMOVED_EXIT,
    Supervisor,
    restart_delay,
)

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
STUBBORN = [sys.executable, "-c",
            "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "while True: time.sleep(1)"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_killed_worker_is_restarted_and_the_others_are_left_alone() -> None:
    sup = Supervisor([SLEEPER, SLEEPER], grace_s=5)
    await sup.start()
    try:
        first = [w.pid for w in sup.workers]
        assert all(p is not None and alive(p) for p in first)
        assert first[1] is not None
        changed = asyncio.ensure_future(sup.changed())
        await asyncio.sleep(0)
        os.kill(first[1], signal.SIGKILL)
        await asyncio.wait_for(changed, 30)
        w0, w1 = sup.workers
        assert w1.pid != first[1] and w1.pid is not None and alive(w1.pid)
        assert w1.restarts == 1 and w1.last_exit == -signal.SIGKILL
        assert w0.pid == first[0] and w0.restarts == 0
    finally:
        await sup.stop()
    assert all(w.proc is not None and w.proc.returncode is not None for w in sup.workers)
    assert not any(alive(w.pid) for w in sup.workers if w.pid is not None)


async def test_stop_kills_a_worker_that_ignores_sigterm_after_the_grace() -> None:
    sup = Supervisor([STUBBORN], grace_s=0.5)
    await sup.start()
    proc = sup.workers[0].proc
    assert proc is not None
    # Wait until it has installed its handler (a SIGTERM before that would end it).
    for _ in range(300):
        if sup.workers[0].pid is not None and _ignores_term(sup.workers[0].pid):
            break
        await asyncio.sleep(0.02)
    await sup.stop()
    assert proc.returncode == -signal.SIGKILL
    assert sup.workers[0].restarts == 0


def _ignores_term(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


async def test_a_worker_refusing_its_config_stops_the_node_instead_of_looping() -> None:
    sup = Supervisor([SLEEPER, [sys.executable, "-c", f"raise SystemExit({CONFIG_EXIT})"]])
    await sup.start()
    try:
        why = await asyncio.wait_for(sup.failed, 30)
        assert "worker 1" in why and "configuration" in why
        assert sup.workers[1].restarts == 0
    finally:
        await sup.stop()


@pytest.mark.parametrize(("code", "node_exit", "says"), [
    (REMOVED_EXIT, 0, "removed"), (MISFIT_EXIT, 1, "cannot be part of the cluster")])
async def test_a_worker_of_a_member_out_of_the_cluster_stops_the_node(
        code: int, node_exit: int, says: str) -> None:
    """A worker whose member was removed from the cluster (``REMOVED_EXIT``) or cannot be
    part of it (``MISFIT_EXIT``): not restarted, the node stops, saying why, with the
    exit status a node of one process gives (0, 1)."""
    sup = Supervisor([[sys.executable, "-c", f"raise SystemExit({code})"], SLEEPER])
    await sup.start()
    try:
        why = await asyncio.wait_for(sup.failed, 30)
        assert "worker 0" in why and says in why
        assert sup.exit_code == node_exit and sup.workers[0].restarts == 0
    finally:
        await sup.stop()
    sleeper = sup.workers[1].pid
    assert sleeper is not None and not alive(sleeper)


@pytest.mark.parametrize(("failures", "delay"), [(0, 0.0), (1, 0.1), (2, 0.2), (4, 0.8), (50, MAX_DELAY_S)])
def test_restarts_back_off_up_to_a_cap(failures: int, delay: float) -> None:
    assert restart_delay(failures) == pytest.approx(delay)
