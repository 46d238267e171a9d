"""The process runner: own process group, environment, logs, affinity, stop with grace."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from accord.agent.runner import PREEMPT_FILE_ENV, TaskKey, TaskProcess, kill_leftover, leftovers

PY = sys.executable


async def test_runs_with_env_cwd_logs_and_exit_code(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    # The task lives a second, so its process group is still there to check below (a
    # task that exits at once can be reaped before a loaded machine gets there).
    code = ("import os, sys, time; time.sleep(1); "
            "print(os.environ['ACCORD_JOB_ID'], os.getcwd()); "
            "print('oops', file=sys.stderr); sys.exit(3)")
    t = TaskProcess(TaskKey("j1", 0, 1), [PY, "-c", code], {"ACCORD_JOB_ID": "j1", "PATH": "/usr/bin"},
                    tmp_path / "tasks", cwd=str(work))
    pid = await t.start()
    assert os.getpgid(pid) == pid  # its own process group
    assert await t.wait() == 3
    assert t.stdout_path.read_text() == f"j1 {work}\n"
    assert t.stderr_path.read_text() == "oops\n"
    rec = json.loads((t.dir / "task.json").read_text())
    assert (rec["job_id"], rec["rank"], rec["attempt"], rec["pid"]) == ("j1", 0, 1, pid)


async def test_cpu_affinity_is_applied(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    t = TaskProcess(TaskKey("j", 0, 1), [PY, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                    {}, tmp_path, cpus=str(cpu))
    await t.start()
    assert await t.wait() == 0
    # The pin lands right after the spawn; python prints well after that.
    assert t.stdout_path.read_text().strip() == f"[{cpu}]"


async def test_sigterm_ends_the_whole_group(tmp_path: Path) -> None:
    # The task forks a grandchild that would outlive a plain kill of the task.
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True); time.sleep(60)")
    t = TaskProcess(TaskKey("j", 0, 1), [PY, "-c", code], {}, tmp_path)
    await t.start()
    for _ in range(200):
        if t.stdout_path.read_text().strip():
            break
        await asyncio.sleep(0.05)
    grandchild = int(t.stdout_path.read_text())
    assert await t.stop(10.0) == -signal.SIGTERM
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the grandchild outlived its task's process group")


async def test_sigkill_after_grace_and_preempt_file_first(tmp_path: Path) -> None:
    code = ("import json, os, signal, sys, time\n"
            "def term(*a):\n"
            "    p = os.environ['ACCORD_PREEMPT_FILE']\n"
            "    print('preempt' if os.path.exists(p) else 'cancel', json.load(open(p))['reason'] "
            "if os.path.exists(p) else '', flush=True)\n"
            "signal.signal(signal.SIGTERM, term)\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(0.1)\n")
    t = TaskProcess(TaskKey("j", 0, 2), [PY, "-c", code], {}, tmp_path)
    await t.start()
    assert t.env[PREEMPT_FILE_ENV] == str(t.dir / "preempt")
    for _ in range(200):
        if "ready" in t.stdout_path.read_text():
            break
        await asyncio.sleep(0.05)
    began = time.monotonic()
    code_ = await t.stop(2.0, preempt=True, reason="preempted by j2")
    took = time.monotonic() - began
    assert code_ == -signal.SIGKILL  # it ignored SIGTERM, so the grace ran out
    assert took >= 2.0
    assert "preempt preempted by j2" in t.stdout_path.read_text()


async def test_leftovers_of_a_dead_agent_are_found_and_killed(tmp_path: Path) -> None:
    t = TaskProcess(TaskKey("old", 1, 3), [PY, "-c", "import time; time.sleep(60)"], {}, tmp_path)
    await t.start()
    done = TaskProcess(TaskKey("done", 0, 1), [PY, "-c", "pass"], {}, tmp_path)
    await done.start()
    await done.wait()
    left = leftovers(tmp_path)
    assert [(x.key, x.pid) for x in left] == [(TaskKey("old", 1, 3), t.pid)]
    killer = asyncio.create_task(kill_leftover(left[0], 5.0))
    assert await t.wait() == -signal.SIGTERM
    assert await killer
    assert leftovers(tmp_path) == []


async def test_a_recycled_pid_is_not_a_leftover(tmp_path: Path) -> None:
    d = tmp_path / "x.r0.a1"
    d.mkdir()
    # Our own pid with another process's start time: the record is stale.
    (d / "task.json").write_text(json.dumps({"job_id": "x", "rank": 0, "attempt": 1,
                                             "pid": os.getpid(), "proc_start": 1}))
    assert leftovers(tmp_path) == []


def test_empty_command_is_refused(tmp_path: Path) -> None:
    try:
        TaskProcess(TaskKey("j", 0, 1), [], {}, tmp_path)
    except ValueError as e:
        assert "command is empty" in str(e)
    else:
        raise AssertionError("an empty command was accepted")


async def test_a_command_that_cannot_start_is_an_oserror_naming_it(tmp_path: Path) -> None:
    t = TaskProcess(TaskKey("j", 0, 1), [str(tmp_path / "no-such-program")], {}, tmp_path)
    try:
        await t.start()
    except FileNotFoundError as e:
        assert "No such file" in str(e)
    else:
        raise AssertionError("a missing program started")


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except (OSError, IndexError):
        return True


async def _until(cond: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


AGENT = """
import asyncio, sys, time
from pathlib import Path
from accord.agent.runner import TaskKey, TaskProcess

async def main():
    t = TaskProcess(TaskKey("j", 0, 1), [sys.executable, "-c", "import time; time.sleep(120)"],
                    {}, Path(sys.argv[1]), grace=2.0)
    print(await t.start(time.monotonic() + 3600), flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_a_task_stops_when_its_agent_is_killed(tmp_path: Path) -> None:
    """kill -9 of the agent closes the keeper's lifeline: the task is stopped at once,
    not left running while the scheduler gives its job to another node."""
    agent = await asyncio.create_subprocess_exec(PY, "-c", AGENT, str(tmp_path),
                                                 stdout=asyncio.subprocess.PIPE)
    try:
        assert agent.stdout is not None
        pid = int(await asyncio.wait_for(agent.stdout.readline(), 30))
        await asyncio.sleep(1.0)
        assert not _gone(pid)  # the agent lives: so does its task
        os.kill(agent.pid, signal.SIGKILL)
        await agent.wait()
        await _until(lambda: _gone(pid), "the task of the killed agent to stop", 10)
        err = (tmp_path / "j.r0.a1" / "stderr.log").read_text()
        assert "the agent is gone" in err
        # Gone includes a zombie; its group is a leftover until the keeper reaps it.
        await _until(lambda: leftovers(tmp_path) == [], "the task to be reaped", 10)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()


async def test_a_task_runs_while_renewed_and_stops_at_its_deadline(tmp_path: Path) -> None:
    """The agent renews the deadline after each heartbeat the cluster took; a paused or
    cut-off agent renews nothing, and the keeper stops the task past the deadline: SIGTERM,
    then SIGKILL after the grace for a task that ignores it."""
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('term', flush=True))\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(0.05)\n")
    t = TaskProcess(TaskKey("j", 0, 1), [PY, "-c", code], {}, tmp_path, grace=1.0)
    pid = await t.start(time.monotonic() + 1.0)
    waiter = asyncio.create_task(t.wait())
    renewed_until = time.monotonic() + 2.5
    while time.monotonic() < renewed_until:
        t.renew(time.monotonic() + 1.0)
        await asyncio.sleep(0.2)
    assert not waiter.done() and not _gone(pid)  # 2.5 s, past the first deadline: running
    stopped = time.monotonic()
    assert await asyncio.wait_for(waiter, 10) == -signal.SIGKILL
    took = time.monotonic() - stopped
    assert 1.5 <= took < 6.0, took  # the deadline (1 s), then the grace (1 s)
    assert "term" in t.stdout_path.read_text()
    assert "no heartbeat of the agent" in t.stderr_path.read_text()


async def test_a_leftover_whose_keeper_was_killed_too_is_found_by_its_group(
        tmp_path: Path) -> None:
    """Keeper and task gone, a grandchild left in the group: still a leftover, killed."""
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True); time.sleep(60)")
    t = TaskProcess(TaskKey("g", 0, 1), [PY, "-c", code], {}, tmp_path)
    pid = await t.start()
    await _until(lambda: bool(t.stdout_path.read_text().strip()), "the grandchild", 10)
    grandchild = int(t.stdout_path.read_text())
    assert t.proc is not None
    os.kill(t.proc.pid, signal.SIGKILL)  # the keeper, then the task: only the group is left
    os.kill(pid, signal.SIGKILL)
    await t.wait()
    await _until(lambda: _gone(pid), "the task to be reaped", 10)
    left = leftovers(tmp_path)
    assert [x.key for x in left] == [TaskKey("g", 0, 1)]
    assert await kill_leftover(left[0], 2.0)
    await _until(lambda: _gone(grandchild), "the grandchild to be killed", 10)
    await _until(lambda: leftovers(tmp_path) == [], "the grandchild to be reaped", 10)


async def test_a_stop_during_the_start_waits_for_it_then_stops_the_task(tmp_path: Path) -> None:
    """The agent may cancel a task while its keeper is still starting it: the stop waits
    for the task's pid (it never signals a group it does not know yet, and above all not
    group 0, the agent's own) and then stops it."""
    t = TaskProcess(TaskKey("j", 0, 1), [PY, "-c", "import time; time.sleep(60)"], {},
                    tmp_path)
    starting = asyncio.create_task(t.start())
    await asyncio.sleep(0)  # the start has begun, the pid is not known yet
    assert t.launched and t.pid == 0
    assert await asyncio.wait_for(t.stop(5.0), 30) == -signal.SIGTERM
    pid = await starting
    assert _gone(pid)


async def test_damaged_records_are_no_leftovers(tmp_path: Path) -> None:
    for i, pid in enumerate((0, -1)):
        d = tmp_path / f"x.r{i}.a1"
        d.mkdir()
        (d / "task.json").write_text(json.dumps({"job_id": "x", "rank": i, "attempt": 1,
                                                 "pid": pid, "proc_start": None}))
    assert leftovers(tmp_path) == []


async def test_the_keeper_without_pidfds_still_sees_the_task_end_and_the_agent_go(
        tmp_path: Path) -> None:
    """On a kernel without ``pidfd_open`` (before 5.3) the keeper looks for the task's end
    on a timer: the exit code still comes through, and a closed lifeline still stops it."""
    from accord.agent.runner import KEEPER

    async def keep(code: str) -> tuple[asyncio.subprocess.Process, int]:
        life_r, life_w = os.pipe()
        said_r, said_w = os.pipe()
        shim = ("import os, runpy, sys; del os.pidfd_open; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        proc = await asyncio.create_subprocess_exec(
            PY, "-I", "-c", shim, str(KEEPER), "--status-fd", str(said_w), "--grace", "1",
            "--deadline", "1e15", "--", PY, "-c", code, stdin=life_r, pass_fds=(said_w,),
            stderr=asyncio.subprocess.PIPE)
        os.close(life_r)
        os.close(said_w)
        said = await asyncio.to_thread(os.read, said_r, 100)
        os.close(said_r)
        assert said.startswith(b"ok "), said
        return proc, life_w

    proc, life = await keep("import time, sys; time.sleep(0.3); sys.exit(5)")
    assert await asyncio.wait_for(proc.wait(), 30) == 5
    os.close(life)
    proc, life = await keep("import time; time.sleep(60)")
    await asyncio.sleep(0.3)
    os.close(life)  # the agent is gone
    assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGTERM
    assert proc.stderr is not None
    assert b"the agent is gone" in await proc.stderr.read()
