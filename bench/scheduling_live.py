"""The live scheduling cell: real daemons, many real agents, 1,000 short real jobs.

A 3-member accord cluster (``harness.AccordCluster``, subprocesses on 127.0.0.1), and
``--agents`` node agents (``accord.agent.daemon.NodeAgent``, the code `accord nodes
agent` runs) hosted in this one process, each with a made-up 8-GPU node. ``--jobs``
one-task, one-GPU jobs running ``true`` are submitted as fast as ``--concurrency``
outstanding submits allow. Every job goes the whole way: submit, placement (a
``place_jobs`` commit), the agent's start of the process, its ``running`` report,
its exit, its ``exited`` report (both commits), the devices freed.

Figures (all times from the scheduler's own records, one clock: everything runs on
this machine): jobs/s placed and started (jobs / time from the first submit to the
last placement or start), p50/p99 submit->placed and submit->started latency (with
more jobs than GPUs, later jobs wait for earlier ones to end), placed->started (the
agent's part: event, spawn, ``running`` report commit), and
CPU seconds per job of the three daemons together and of the agents' process.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accord.agent.daemon import AgentConfig, NodeAgent
from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc
from accord.services.scheduling.topology import make_node
from bench.harness import AccordCluster, cpu_seconds

_stubs: Any = scheduling_pb2_grpc


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime + ch.ru_utime + ch.ru_stime


async def _cell(endpoints: list[str], root: Path, agents_n: int, jobs_n: int, concurrency: int,
                heartbeat: float, timeout: float) -> dict[str, Any]:
    cfg = AgentConfig(heartbeat=heartbeat, reconcile=5.0, listen="127.0.0.1:0",
                      orphan_timeout=120.0)
    agents = [NodeAgent(endpoints, make_node(f"live-{i:02d}", gpus=8, address="127.0.0.1"),
                        root / f"agent-{i:02d}", cfg, base_env={"PATH": "/usr/bin:/bin"})
              for i in range(agents_n)]
    for a in agents:
        await a.start()
    channels = [grpc.aio.insecure_channel(e) for e in endpoints]
    stubs = [_stubs.SchedulerStub(ch) for ch in channels]
    sem = asyncio.Semaphore(concurrency)
    try:
        async def submit(i: int) -> None:
            spec = pb.JobSpec(id=f"live-{i:05d}", devices_per_task=1, command=["true"],
                              estimated_runtime=1.0, grace=1.0)
            req = pb.SubmitJobRequest(job=spec, request_id=f"live-{i}")
            async with sem:
                for attempt in range(20):
                    try:
                        await stubs[(i + attempt) % len(stubs)].SubmitJob(req, timeout=20.0)
                        return
                    except grpc.RpcError as e:
                        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                            grpc.StatusCode.DEADLINE_EXCEEDED):
                            raise
                        await asyncio.sleep(0.1)

        t0 = time.time()
        await asyncio.gather(*(submit(i) for i in range(jobs_n)))
        submitted = time.time()
        deadline = time.monotonic() + timeout
        jobs: list[Any] = []
        while time.monotonic() < deadline:
            resp = await stubs[0].ListJobs(pb.ListJobsRequest(), timeout=30.0)
            jobs = [j for j in resp.jobs if j.spec.id.startswith("live-")]
            if sum(j.status in ("succeeded", "failed", "held") for j in jobs) >= jobs_n:
                break
            await asyncio.sleep(0.5)
        done = time.time()
    finally:
        for a in agents:
            await a.stop(report=False)
        for ch in channels:
            await ch.close()
    placed = [j.start_time - j.spec.submit_time for j in jobs if j.start_time]
    started = [j.task_status[0].start_time - j.spec.submit_time for j in jobs
               if j.task_status and j.task_status[0].start_time]
    launch = [j.task_status[0].start_time - j.start_time for j in jobs
              if j.start_time and j.task_status and j.task_status[0].start_time]
    first = min((j.spec.submit_time for j in jobs), default=t0)
    last_placed = max((j.start_time for j in jobs if j.start_time), default=first)
    last_started = max((j.task_status[0].start_time for j in jobs
                        if j.task_status and j.task_status[0].start_time), default=first)
    ok = sum(j.status == "succeeded" for j in jobs)
    return {
        "agents": agents_n, "jobs": jobs_n, "succeeded": ok,
        "submit_s": round(submitted - t0, 2), "all_done_s": round(done - t0, 2),
        "placed_per_s": round(len(placed) / max(1e-9, last_placed - first), 1),
        "started_per_s": round(len(started) / max(1e-9, last_started - first), 1),
        "submit_to_placed_ms_p50": round(1000 * _pct(placed, 0.5), 1),
        "submit_to_placed_ms_p99": round(1000 * _pct(placed, 0.99), 1),
        "submit_to_started_ms_p50": round(1000 * _pct(started, 0.5), 1),
        "submit_to_started_ms_p99": round(1000 * _pct(started, 0.99), 1),
        "started_mean_ms": round(1000 * statistics.fmean(started), 1) if started else None,
        "placed_to_started_ms_p50": round(1000 * _pct(launch, 0.5), 1),
        "placed_to_started_ms_p99": round(1000 * _pct(launch, 0.99), 1),
    }


def run_live(agents: int = 64, jobs: int = 1000, concurrency: int = 64, heartbeat: float = 1.0,
             timeout: float = 600.0) -> dict[str, Any]:
    """Run the cell on a fresh 3-member cluster; returns its figures."""
    with tempfile.TemporaryDirectory(prefix="accord-live-") as tmp:
        root = Path(tmp)
        cluster = AccordCluster(root / "cluster", 3)
        cluster.start()
        try:
            pids = cluster.pids
            cpu_before = sum(cpu_seconds(p) for p in pids)
            self_before = _self_cpu()
            out = asyncio.run(_cell(cluster.endpoints, root / "agents", agents, jobs, concurrency,
                                    heartbeat, timeout))
            cluster_cpu = sum(cpu_seconds(p) for p in pids) - cpu_before
            self_cpu = _self_cpu() - self_before
        finally:
            cluster.stop()
    out["cluster_cpu_ms_per_job"] = round(1000 * cluster_cpu / max(1, jobs), 2)
    out["agents_cpu_ms_per_job"] = round(1000 * self_cpu / max(1, jobs), 2)
    out["heartbeat_s"] = heartbeat
    return out


def table(f: dict[str, Any]) -> str:
    """The cell's figures as a readable table."""
    rows = [
        ("agents x GPUs", f"{f['agents']} x 8"), ("jobs (succeeded)", f"{f['jobs']} ({f['succeeded']})"),
        ("placed / s", f"{f['placed_per_s']}"), ("started / s", f"{f['started_per_s']}"),
        ("submit->placed p50 / p99 ms", f"{f['submit_to_placed_ms_p50']} / {f['submit_to_placed_ms_p99']}"),
        ("submit->started p50 / p99 ms",
         f"{f['submit_to_started_ms_p50']} / {f['submit_to_started_ms_p99']}"),
        ("placed->started p50 / p99 ms",
         f"{f['placed_to_started_ms_p50']} / {f['placed_to_started_ms_p99']}"),
        ("cluster CPU ms / job (3 daemons)", f"{f['cluster_cpu_ms_per_job']}"),
        ("agents CPU ms / job (incl. tasks)", f"{f['agents_cpu_ms_per_job']}"),
        ("wall: submits / all done s", f"{f['submit_s']} / {f['all_done_s']}"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
