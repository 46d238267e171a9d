"""Real daemons, real agents (`accord nodes agent` processes) running real tasks on 127.0.0.1.

The tasks are small Python programs. The agents either discover this machine (no
accelerator: zero GPUs, its CPUs and memory) or make up a one-GPU node (``--fake``) so
that GPU jobs, preemption and failover have something to compete for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from accord.client import AccordClient, NotFound
from accord.client.sync import SyncClient
from accord.proto import scheduling_pb2 as pb
from tests.integration.cluster import ProcCluster
from tests.integration.test_scheduling_cluster import call, job, shard_leader, wait_for

PY = sys.executable
CPU_TASK = 1500
"""A CPU-only task's share; the fixture raises it past half of a discovered node's CPU, so
two tasks never fit on one node whatever the machine running the suite has."""


@dataclass
class AgentProc:
    """One `accord nodes agent` process, started and ended by PID."""

    name: str
    args: list[str]
    state: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: list[str] = field(default_factory=list)

    def start(self, endpoints: str) -> None:
        orphan = [] if "--orphan-timeout" in self.args else ["--orphan-timeout", "4"]
        cmd = [PY, "-m", "accord", "nodes", "agent", *self.args, *orphan,
               "--endpoints", endpoints, "--state-dir", str(self.state),
               "--listen", "127.0.0.1:0", "--interval", "0.3", "--reconcile", "1",
               "--address", "127.0.0.1"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pid_of(self, job_id: str, rank: int = 0) -> int:
        m = re.findall(rf"started {re.escape(job_id)}\.r{rank}\.a\d+ pid (\d+)", self.output())
        assert m, f"{self.name} started no task of {job_id}: {self.output()[-2000:]}"
        return int(m[-1])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class Agents:
    def __init__(self, root: Path, endpoints: str) -> None:
        self.root = root
        self.endpoints = endpoints
        self.all: dict[str, AgentProc] = {}

    def start(self, name: str, *args: str) -> AgentProc:
        a = self.all.get(name) or AgentProc(name, list(args), self.root / name,
                                            self.root / f"{name}.agent.log")
        self.all[name] = a
        a.start(self.endpoints)
        return a

    def stop_all(self) -> None:
        for a in self.all.values():
            a.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProcCluster, Agents]]:
    root = tmp_path_factory.mktemp("agents")
    c = ProcCluster(root, 3)
    agents = Agents(root, c.endpoints)
    try:
        c.start_all()
        # Two agents that discover this machine: CPU-only nodes.
        for name in ("cpu-a", "cpu-b"):
            agents.start(name, name)
        wait_for(lambda: {"cpu-a", "cpu-b"} <= alive_nodes(c), "the CPU agents to register")
        nodes = call(c, lambda s: s.ListNodes(pb.ListNodesRequest(), timeout=5.0)).nodes
        global CPU_TASK
        CPU_TASK = min(n.spec.cpu_milli for n in nodes if n.spec.name.startswith("cpu-")) // 2 + 1
        yield c, agents
    finally:
        agents.stop_all()
        c.stop_all()


def alive_nodes(c: ProcCluster) -> set[str]:
    nodes = call(c, lambda s: s.ListNodes(pb.ListNodesRequest(), timeout=5.0)).nodes
    return {n.spec.name for n in nodes if n.alive}


def submit(c: ProcCluster, *argv: str) -> str:
    """`accord jobs submit ARGV`; returns the job id it prints."""
    out = cli(c, "jobs", "submit", *argv)
    return out.split()[0]


def cli(c: ProcCluster, *argv: str, check: bool = True) -> str:
    p = subprocess.run([PY, "-m", "accord", *argv, "--endpoints", c.endpoints]
                       if "--" not in argv else
                       [PY, "-m", "accord", *argv[:argv.index("--")], "--endpoints", c.endpoints,
                        *argv[argv.index("--"):]],
                       capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, f"accord {' '.join(argv)}: {p.stderr}"
    return p.stdout


def status(c: ProcCluster, job_id: str) -> str:
    return str(job(c, job_id).status)


def tasks(c: ProcCluster, job_id: str) -> list[Any]:
    return list(job(c, job_id).task_status)


def script(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


ENV_DUMP = """
import json, os
keys = ["ACCORD_JOB_ID", "ACCORD_RANK", "NODE_RANK", "WORLD_SIZE", "NNODES", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "ACCORD_PREEMPT_FILE"]
print(json.dumps({k: os.environ.get(k) for k in keys} | {"cwd": os.getcwd()}))
"""


def test_gang_job_runs_both_ranks_with_rendezvous_env(world: tuple[ProcCluster, Agents],
                                                      tmp_path: Path) -> None:
    c, _ = world
    prog = script(tmp_path, "env.py", ENV_DUMP)
    jid = submit(c, "--id", "gang", "--tasks", "2", "--gpus", "0", "--cpu-milli", str(CPU_TASK),
                 "--workdir", str(tmp_path), "--", PY, prog)
    assert jid == "gang"
    wait_for(lambda: status(c, jid) == "succeeded", "the gang job to succeed", 60)
    ts = tasks(c, jid)
    assert {t.node for t in ts} == {"cpu-a", "cpu-b"}
    ports = set()
    assert [(t.state, t.exit_code) for t in ts] == [("exited", 0), ("exited", 0)]
    assert all(0 < t.start_time <= t.end_time for t in ts)
    for rank in (0, 1):
        env = json.loads(cli(c, "jobs", "logs", jid, "--rank", str(rank)))
        assert env["ACCORD_JOB_ID"] == jid and env["ACCORD_RANK"] == str(rank)
        assert env["NODE_RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and env["NNODES"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert 29500 <= int(env["MASTER_PORT"]) < 30500  # the scheduler's rendezvous ports
        ports.add(env["MASTER_PORT"])
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU-only task sees no GPU
        assert env["cwd"] == str(tmp_path)
    assert len(ports) == 1  # both ranks meet at the same master port
    shown = cli(c, "jobs", "show", jid)
    assert re.search(r"task 0 on cpu-\w: exited start \S+ end \S+ exit 0", shown), shown
    assert re.search(r"task 1 on cpu-\w: exited start \S+ end \S+ exit 0", shown), shown


TORCHRUN = """
import os, socket, sys, time
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["WORLD_SIZE"])
if rank == 0:
    srv = socket.create_server((addr, port))
    srv.settimeout(60)
    peers = []
    while len(peers) < world - 1:
        conn, _ = srv.accept()
        peers.append((int(conn.recv(16).decode()), conn))
    for r, conn in peers:
        conn.sendall(f"hello {r} of {world}".encode())
        conn.close()
    print("master saw ranks", sorted(r for r, _ in peers))
else:
    for _ in range(600):
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("no master")
    s.sendall(str(rank).encode())
    print(s.recv(64).decode())
"""


def test_torchrun_shaped_rendezvous_over_tcp(world: tuple[ProcCluster, Agents],
                                             tmp_path: Path) -> None:
    c, _ = world
    prog = script(tmp_path, "rdzv.py", TORCHRUN)
    jid = submit(c, "--id", "rdzv", "--tasks", "2", "--gpus", "0", "--cpu-milli", str(CPU_TASK),
                 "--", PY, prog)
    wait_for(lambda: status(c, jid) in ("succeeded", "failed", "held"), "the rendezvous", 90)
    assert status(c, jid) == "succeeded", cli(c, "jobs", "show", jid)
    assert {t.node for t in tasks(c, jid)} == {"cpu-a", "cpu-b"}
    assert cli(c, "jobs", "logs", jid, "--rank", "0").strip() == "master saw ranks [1]"
    assert cli(c, "jobs", "logs", jid, "--rank", "1").strip() == "hello 1 of 2"


BOTH_STREAMS = """
import sys
print("out line", flush=True)
print("err line", file=sys.stderr, flush=True)
"""


async def test_the_client_reads_a_tasks_logs_through_its_agent(
        world: tuple[ProcCluster, Agents], tmp_path: Path) -> None:
    """``client.scheduler.logs`` (what `accord jobs logs` prints) against real agents:
    both streams, from an offset, the agent it went to, and clear errors."""
    c, _ = world
    prog = script(tmp_path, "both.py", BOTH_STREAMS)
    jid = submit(c, "--id", "client-logs", "--gpus", "0", "--cpu-milli", str(CPU_TASK),
                 "--", PY, prog)
    wait_for(lambda: status(c, jid) == "succeeded", "the job to succeed", 60)
    (ran,) = tasks(c, jid)
    async with AccordClient(c.endpoints.split(","), call_timeout_s=10.0) as client:
        agent = await client.scheduler.log_endpoint(jid)
        assert agent == {n.name: n for n in await client.scheduler.nodes()}[
            ran.node].agent_endpoint and agent.startswith("http://")
        chunks = [ch async for ch in client.scheduler.logs(jid)]
        assert b"".join(ch.data for ch in chunks) == b"out line\n"
        assert chunks[0].offset == 0 and chunks[0].attempt == 1 and chunks[-1].end == 9
        err = [ch.data async for ch in client.scheduler.logs(jid, stream="stderr")]
        assert b"".join(err) == b"err line\n"
        rest = [ch async for ch in client.scheduler.logs(jid, offset=4)]
        assert b"".join(ch.data for ch in rest) == b"line\n" and rest[0].offset == 4
        with pytest.raises(NotFound, match="no rank 3 placed yet"):
            _ = [ch async for ch in client.scheduler.logs(jid, rank=3)]
        with pytest.raises(NotFound, match="does not exist"):
            _ = [ch async for ch in client.scheduler.logs("no-such-job")]
        with pytest.raises(NotFound, match="no log of job") as e:  # the agent's answer
            _ = [ch async for ch in client.scheduler.logs(jid, attempt=7)]
        assert e.value.endpoint == agent.removeprefix("http://")
        with pytest.raises(ValueError, match="stream must be one of"):
            _ = [ch async for ch in client.scheduler.logs(jid, stream="stdin")]
    with SyncClient(c.endpoints.split(","), call_timeout_s=10.0) as sync, \
            sync.scheduler.logs(jid, stream="stderr", follow=True) as followed:
        assert b"".join(ch.data for ch in followed) == b"err line\n"  # ended: follow stops


def test_one_rank_exiting_1_fails_the_job_and_stops_the_other(world: tuple[ProcCluster, Agents],
                                                              tmp_path: Path) -> None:
    c, _ = world
    prog = script(tmp_path, "fail.py", """
import os, signal, sys, time
def term(*_):
    print("rank 0 got SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
if os.environ["NODE_RANK"] == "1":
    time.sleep(1)
    sys.exit(1)
time.sleep(120)
""")
    jid = submit(c, "--id", "fail", "--tasks", "2", "--gpus", "0", "--cpu-milli", str(CPU_TASK),
                 "--max-restarts", "0", "--", PY, prog)
    wait_for(lambda: status(c, jid) == "failed", "the job to fail", 60)
    assert "rank 1 exited with 1" in job(c, jid).reason
    wait_for(lambda: tasks(c, jid)[0].state == "exited", "rank 0 to be stopped", 30)
    ts = tasks(c, jid)
    assert (ts[1].state, ts[1].exit_code) == ("exited", 1)
    assert ts[0].exit_code == 143
    assert "rank 0 got SIGTERM" in cli(c, "jobs", "logs", jid, "--rank", "0")
    # Both nodes are free again: a job needing both runs.
    again = submit(c, "--tasks", "2", "--gpus", "0", "--cpu-milli", str(CPU_TASK), "--", "true")
    wait_for(lambda: status(c, again) == "succeeded", "a job on the freed nodes", 60)


def test_cancel_kills_a_task_that_ignores_sigterm_after_the_grace(
        world: tuple[ProcCluster, Agents], tmp_path: Path) -> None:
    c, agents = world
    prog = script(tmp_path, "stubborn.py", """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
while True:
    time.sleep(0.1)
""")
    jid = submit(c, "--id", "long", "--gpus", "0", "--cpu-milli", str(CPU_TASK), "--grace", "1",
                 "--", PY, prog)
    wait_for(lambda: "ignoring" in cli(c, "jobs", "logs", jid, check=False), "the task to run", 60)
    node = tasks(c, jid)[0].node
    pid = agents.all[node].pid_of(jid)
    cancelled_at = time.time()
    cli(c, "jobs", "cancel", jid)
    wait_for(lambda: tasks(c, jid)[0].state == "exited", "the task to be killed", 30)
    t = tasks(c, jid)[0]
    assert t.exit_code == -signal.SIGKILL  # it ignored SIGTERM: killed when the grace ran out
    assert t.end_time - cancelled_at >= 1.0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert status(c, jid) == "cancelled"


CHECKPOINTER = """
import json, os, signal, sys, time
def term(*_):
    p = os.environ["ACCORD_PREEMPT_FILE"]
    if os.path.exists(p):
        print("checkpointing:", json.load(open(p))["reason"], flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("training attempt", os.environ["ACCORD_ATTEMPT"], flush=True)
while True:
    time.sleep(0.1)
"""


def test_preemption_stops_the_victim_runs_the_new_job_and_requeues_the_victim(
        world: tuple[ProcCluster, Agents], tmp_path: Path) -> None:
    c, agents = world
    gpu = agents.start("gpu-p", "--fake", "gpu-p", "--gpus", "1")
    try:
        wait_for(lambda: "gpu-p" in alive_nodes(c), "the GPU agent to register")
        prog = script(tmp_path, "ckpt.py", CHECKPOINTER)
        low = submit(c, "--id", "low", "--gpus", "1", "--preemptible", "--grace", "10", "--",
                     PY, prog)
        wait_for(lambda: "attempt 1" in cli(c, "jobs", "logs", low, check=False),
                 "the victim to train", 60)
        high = submit(c, "--id", "high", "--gpus", "1", "--priority", "10", "--", PY, "-c",
                      "print('urgent work done')")
        wait_for(lambda: status(c, high) == "succeeded", "the high-priority job to run", 60)
        assert "checkpointing: preempted" in cli(c, "jobs", "logs", low, "--attempt", "1")
        assert cli(c, "jobs", "logs", high).strip() == "urgent work done"
        wait_for(lambda: "attempt 2" in cli(c, "jobs", "logs", low, check=False),
                 "the victim to be requeued and run again", 60)
        info = job(c, low)
        assert (info.status, info.starts, info.requeues, info.failures) == ("running", 2, 1, 0)
        cli(c, "jobs", "cancel", low)
        wait_for(lambda: tasks(c, low)[0].state == "exited", "the victim to stop", 30)
    finally:
        gpu.stop()


def test_agent_kill_9_stops_its_task_at_once_and_the_job_moves_to_another_agent(
        world: tuple[ProcCluster, Agents], tmp_path: Path) -> None:
    """kill -9 of an agent: its task's keeper sees the lifeline close and stops the task
    at once, well before the scheduler's fence lets the job run on another agent, so the
    two runs never overlap; the restarted agent finds nothing left to kill."""
    c, agents = world
    k1 = agents.start("gpu-k1", "--fake", "gpu-k1", "--gpus", "1", "--model", "K80")
    k2 = agents.start("gpu-k2", "--fake", "gpu-k2", "--gpus", "1", "--model", "K80")
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    try:
        wait_for(lambda: {"gpu-k1", "gpu-k2"} <= alive_nodes(c), "the K80 agents to register")
        prog = script(tmp_path, "tick.py", TICKER)
        jid = submit(c, "--id", "moves", "--gpus", "1", "--selector", "model == K80",
                     "--grace", "2", "--", PY, prog, str(ticks))
        wait_for(lambda: _ticking(ticks) == 1, "the first run to tick", 60)
        first = tasks(c, jid)[0].node
        victim, other = (k1, k2) if first == "gpu-k1" else (k2, k1)
        orphan = victim.pid_of(jid)
        victim.kill()
        wait_for(lambda: not _alive(orphan), "the killed agent's task to be stopped", 15)
        assert job(c, jid).starts == 1  # gone before the fence let the job move
        err = (victim.state / "tasks" / f"{jid}.r0.a1" / "stderr.log").read_text()
        assert "the agent is gone" in err, err
        try:
            wait_for(lambda: job(c, jid).starts == 2 and tasks(c, jid)[0].node == other.name,
                     "the job to be requeued onto the other agent", 60)
        except AssertionError as e:  # say what the scheduler and the survivor saw
            said = {n.name: [line for line in c.log(n).splitlines() if "scheduling" in line][-15:]
                    for n in c.nodes}
            raise AssertionError(
                f"{e}; job: {job(c, jid)}; alive nodes: {sorted(alive_nodes(c))}; "
                f"the members' scheduling lines: {said}; "
                f"{other.name} said:\n{other.output()[-3000:]}") from None
        wait_for(lambda: _ticking(ticks) == 2, "the second run to tick", 60)
        moved = job(c, jid)
        assert (moved.requeues, moved.failures) == (1, 1)  # a node death counts as a failure
        _runs_did_not_overlap(ticks)
        victim.start(c.endpoints)
        wait_for(lambda: victim.output().count(f"{victim.name} registered") == 2,
                 "the agent to come back", 60)
        assert "killed leftover" not in victim.output()
        assert status(c, jid) == "running" and tasks(c, jid)[0].node == other.name
        cli(c, "jobs", "cancel", jid)
    finally:
        k1.stop()
        k2.stop()


def test_a_paused_agents_task_is_stopped_by_its_keeper_before_it_runs_elsewhere(
        world: tuple[ProcCluster, Agents], tmp_path: Path) -> None:
    """SIGSTOP of an agent: no heartbeat, and no timer of its own either. Its task's keeper
    stops the task at the agent's orphan deadline (which the agent renewed after each
    heartbeat the cluster took), within the scheduler's fence: the job's second run, on
    another agent, starts after the first one's last tick."""
    c, agents = world
    paused = agents.start("gpu-p1", "--fake", "gpu-p1", "--gpus", "1", "--model", "T4")
    spare = agents.start("gpu-p2", "--fake", "gpu-p2", "--gpus", "1", "--model", "T4")
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    assert paused.proc is not None
    try:
        jid = _first_run_on(c, "gpu-p1", "gpu-p2", "T4", "paused", ticks, tmp_path)
        os.kill(paused.proc.pid, signal.SIGSTOP)
        wait_for(lambda: job(c, jid).starts == 2 and tasks(c, jid)[0].node == "gpu-p2",
                 "the job to be requeued onto the spare agent", 90)
        wait_for(lambda: _ticking(ticks) == 2, "the second run to tick", 60)
        _runs_did_not_overlap(ticks)
        err = (paused.state / "tasks" / f"{jid}.r0.a1" / "stderr.log").read_text()
        assert "no heartbeat of the agent reached the cluster" in err, err
        cli(c, "jobs", "cancel", jid)
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
        paused.stop()
        spare.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_scheduler_leader_kill_mid_run_loses_no_task_state(world: tuple[ProcCluster, Agents],
                                                           tmp_path: Path) -> None:
    c, _ = world
    prog = script(tmp_path, "steady.py", """
import os, time
print("rank", os.environ["NODE_RANK"], "up", flush=True)
time.sleep(4)
print("rank", os.environ["NODE_RANK"], "done", flush=True)
""")
    jid = submit(c, "--id", "steady", "--tasks", "2", "--gpus", "0", "--cpu-milli", str(CPU_TASK),
                 "--", PY, prog)
    wait_for(lambda: [t.state for t in tasks(c, jid)] == ["running", "running"],
             "both ranks to report running", 60)
    started = [t.start_time for t in tasks(c, jid)]
    leader = shard_leader(c)
    c.kill(leader)
    try:
        wait_for(lambda: status(c, jid) == "succeeded", "the job to finish after the failover", 90)
        ts = tasks(c, jid)
        assert [(t.state, t.exit_code) for t in ts] == [("exited", 0), ("exited", 0)]
        assert [t.start_time for t in ts] == started  # recorded before the kill, still there
        assert all(t.end_time - t.start_time >= 4.0 for t in ts)
        assert job(c, jid).starts == 1 and job(c, jid).requeues == 0
    finally:
        c.start(leader)
        c.wait_serving(leader)


TICKER = """
import os, signal, sys, time
out = open(os.path.join(sys.argv[1], "%d.ticks" % os.getpid()), "a", buffering=1)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    out.write("%.3f\\n" % time.time())
    time.sleep(0.05)
"""


def _ticking(folder: Path) -> int:
    """Runs of ``TICKER`` that wrote a tick (a file just opened may be empty yet)."""
    return sum(1 for p in folder.iterdir() if p.read_text().strip())


def _first_run_on(c: ProcCluster, first: str, spare: str, model: str, job_id: str,
                  ticks: Path, tmp_path: Path) -> str:
    """Submit a ``TICKER`` job (grace 2 s) that runs on ``first``, ``spare`` drained
    meanwhile and then open to take it; its id once its first run ticks."""
    wait_for(lambda: {first, spare} <= alive_nodes(c), f"the {model} agents to register")
    cli(c, "nodes", "drain", spare)
    prog = script(tmp_path, "tick.py", TICKER)
    jid = submit(c, "--id", job_id, "--gpus", "1", "--selector", f"model == {model}",
                 "--grace", "2", "--", PY, prog, str(ticks))
    wait_for(lambda: _ticking(ticks) == 1, "the first run to tick", 60)
    assert tasks(c, jid)[0].node == first
    cli(c, "nodes", "undrain", spare)
    return jid


def _runs_did_not_overlap(ticks: Path) -> None:
    """The second run's first tick comes after the first run's last."""
    first, second = sorted(ticks.iterdir(), key=lambda p: float(p.read_text().split()[0]))
    first_ticks = [float(x) for x in first.read_text().split()]
    second_ticks = [float(x) for x in second.read_text().split()]
    assert first_ticks[-1] < second_ticks[0], (first_ticks[-1], second_ticks[0])


def test_an_agent_cut_off_from_the_cluster_stops_its_task_before_it_runs_elsewhere(
        world: tuple[ProcCluster, Agents], tmp_path: Path) -> None:
    """A partition, not a crash: the agent lives on but reaches no member. It stops its
    task its orphan timeout after the last heartbeat the cluster took; the scheduler,
    which suspects the node seconds earlier, declares it dead only after that plus the
    job's grace (``SchedulerShard.fenced``), so the job's second run starts after the
    first one's last sign of life: it never runs twice at once. Each run writes the
    time every 50 ms to a file of its own."""
    from tests.integration.proxy import LinkProxies

    c, agents = world
    proxies = LinkProxies()
    ports = [proxies.add("agent", n.name, n.client_port) for n in c.nodes]
    # An orphan timeout longer than the scheduler takes to suspect the node (3-5 s), so
    # that only the fence keeps the two runs apart (the broken variant, requeueing at
    # suspicion, overlaps them).
    cut = AgentProc("gpu-cut", ["--fake", "gpu-cut", "--gpus", "1", "--model", "P100",
                                "--orphan-timeout", "8"],
                    tmp_path / "cut", tmp_path / "cut.agent.log")
    spare = agents.start("gpu-spare", "--fake", "gpu-spare", "--gpus", "1",
                         "--model", "P100")
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    try:
        cut.start(",".join(f"127.0.0.1:{p}" for p in ports))
        jid = _first_run_on(c, "gpu-cut", "gpu-spare", "P100", "twice", ticks, tmp_path)
        proxies.partition(["agent"], [n.name for n in c.nodes])
        wait_for(lambda: job(c, jid).starts == 2 and tasks(c, jid)[0].node == "gpu-spare",
                 "the job to be requeued onto the spare agent", 90)
        wait_for(lambda: _ticking(ticks) == 2, "the second run to tick", 60)
        assert "no contact with the cluster" in cut.output(), cut.output()[-2000:]
        _runs_did_not_overlap(ticks)
        cli(c, "jobs", "cancel", jid)
    finally:
        proxies.heal()
        proxies.close()
        cut.stop()
        spare.stop()
