"""Checkpoint manifest benchmark on a local 3-node accord cluster.

1. commit: a 4,096-rank job (512 hosts x 8 ranks): each host registers its 8 shards in
   one ``RegisterShards`` call, all hosts at once, then the coordinator commits. The
   figure is the time from the first registration sent to the committed pointer
   returned (goal: under 1 s, median of 5 steps). Each shard carries a 4-entry tensor
   index, so a call is a realistic ~2 KB. Each host's request is built and encoded before
   the clock starts (512 hosts build theirs on their own CPUs; ``--client-api`` builds
   and encodes them inside the clock, through ``client.checkpoints.register_shards``);
   the clock covers sending the requests through the client's endpoint pool, the
   service's work, the answers and the commit. The Raft entries the registrations took
   are read from the members' metrics (concurrent registrations share entries). The
   client runs on uvloop, as the members do.
2. many jobs: ``--jobs`` jobs x ``--steps`` committed steps each (1 shard per step), then
   ``ls`` of one job (ListSteps), ``ls`` of every job (ListJobs), and GC of every job
   with keep-last-5 (one Raft entry deleting 15 of 20 steps per job), a second GC
   (nothing left to delete) and a dry run, with timings (``--cluster-jobs`` fewer jobs
   here when filling 3 RPCs per step takes too long on a loaded machine).
3. state: the same workload on one in-process replica: the apply cost of each
   operation, and the snapshot's size and time.

There is no etcd yardstick here: etcd has no checkpoint service (its nearest is one
Txn per registration against a counter key, which this does not pretend to be).

Usage: python bench/checkpoints.py [--reps 5] [--hosts 512] [--ranks-per-host 8]
                                   [--client-api] [--jobs 1000] [--steps 20] [--parts commit,many] [--quick]
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accord.client.checkpoint_writer import CheckpointCoordinator
from accord.client.checkpoints import shard_message
from accord.client.client import AccordClient
from accord.client.errors import NotHeld
from accord.node.config import METRICS_PORT_OFFSET
from accord.proto import checkpoints_pb2 as pb
from accord.services.checkpoints.checksum import of_bytes
from accord.services.checkpoints.replicated import local_group
from bench.harness import Harness, machine


def _shard(job: str, step: int, rank: int, token: int, tensors: int) -> dict[str, Any]:
    body = f"{job}/{step}/{rank}".encode()
    return {"shard_id": f"rank-{rank:05d}", "rank": rank, "size": 1 << 28,
            "checksum": list(of_bytes(body, "sha256").to_wire()),
            "uri": f"s3://bench-ckpt/{job}/step-{step:010d}/rank-{rank:05d}.t{token}.safetensors",
            "tensors": [[f"layers.{rank % 80}.w{i}", [8192, 8192 * 8], [0, 8192 * (rank % 8)],
                         [8192, 8192], "bfloat16"] for i in range(tensors)]}


def _entries(metrics: list[str]) -> int:
    """Registration entries proposed so far, summed over the members (their /metrics)."""
    total = 0
    for url in metrics:
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("accord_checkpoint_register_batches_total "):
                    total += int(float(line.split()[1]))
    return total


_REGISTER = "/accord.checkpoints.v1.Checkpoints/RegisterShards"
_callables: dict[Any, Any] = {}


async def _register_encoded(client: AccordClient, request: bytes) -> pb.RegisterShardsResponse:
    """Send an encoded ``RegisterShardsRequest`` through the client's endpoint pool (its
    failover and retries; the request id inside makes a resend apply once)."""
    async def call(ch: Any, timeout: float) -> pb.RegisterShardsResponse:
        method = _callables.get(ch)
        if method is None:
            method = _callables[ch] = ch.unary_unary(
                _REGISTER, response_deserializer=pb.RegisterShardsResponse.FromString)
        out = await method(request, timeout=timeout)
        assert isinstance(out, pb.RegisterShardsResponse)
        return out
    return await client.checkpoints.pool.call(call, idempotent=True)


async def part_commit(eps: list[str], metrics: list[str], hosts: int, per_host: int,
                      reps: int, clients: int, client_api: bool) -> dict[str, Any]:
    ranks = hosts * per_host
    print(f"\n== commit: {ranks} ranks ({hosts} hosts x {per_host}), one RegisterShards "
          f"call per host, {clients} client channels; {reps} steps; requests "
          f"{'built and encoded inside the clock' if client_api else 'encoded beforehand'}")
    print(f"{'step':>5} {'register s':>11} {'commit s':>9} {'total s':>8} {'entries':>8} "
          f"{'load':>5}")
    pool = [AccordClient(eps[i % len(eps):] + eps[:i % len(eps)], call_timeout_s=30)
            for i in range(clients)]
    totals, regs, commits, entries = [], [], [], []
    try:
        # Every channel connected before the clock (a host's connection is up long before
        # its checkpoint is written): one read on each.
        await asyncio.gather(*(c.checkpoints.jobs() for c in pool))
        async with CheckpointCoordinator(pool[0], "bench-4096") as coord:
            expected = [(f"rank-{r:05d}", r) for r in range(ranks)]
            for step in range(1, reps + 1):
                await coord.begin(step, layout={"world_size": ranks, "dp": ranks // 64,
                                                "tp": 8, "pp": 8}, expected=expected)
                # Each host builds and encodes its own request in its own process: done
                # before the clock starts, so one client process does not stand in for 512
                # hosts' CPUs (--client-api: built and encoded inside the clock instead).
                calls = [[shard_message(_shard("bench-4096", step, h * per_host + i,
                                               coord.token, 4)) for i in range(per_host)]
                         for h in range(hosts)]
                encoded = [] if client_api else [pb.RegisterShardsRequest(
                    job="bench-4096", step=step, token=coord.token, shards=calls[h],
                    request_id=uuid.uuid4().hex).SerializeToString() for h in range(hosts)]
                e0 = _entries(metrics)
                t0 = time.perf_counter()
                answers = await asyncio.gather(*(
                    pool[h % clients].checkpoints.register_shards("bench-4096", step,
                                                                  coord.token, calls[h])
                    if client_api else _register_encoded(pool[h % clients], encoded[h])
                    for h in range(hosts)))
                t1 = time.perf_counter()
                latest = await coord.commit(step)
                t2 = time.perf_counter()
                assert latest == step and sum(a.registered for a in answers) == ranks
                regs.append(t1 - t0)
                commits.append(t2 - t1)
                totals.append(t2 - t0)
                entries.append(_entries(metrics) - e0)
                print(f"{step:>5} {t1 - t0:>11.3f} {t2 - t1:>9.3f} {t2 - t0:>8.3f} "
                      f"{entries[-1]:>8} {os.getloadavg()[0]:>5.1f}")
    finally:
        for c in pool:
            await c.close()
    med = statistics.median(totals)
    load = os.getloadavg()[0]
    print(f"median {med:.3f} s from the first registration to the committed pointer "
          f"(goal < 1 s: {'met' if med < 1.0 else 'NOT met'}); {hosts} registrations took "
          f"{statistics.median(entries):.0f} Raft entries (median); load average {load:.1f}")
    return {"ranks": ranks, "hosts": hosts, "median_s": round(med, 3),
            "median_register_s": round(statistics.median(regs), 3),
            "median_commit_s": round(statistics.median(commits), 4),
            "all_s": [round(x, 3) for x in totals], "goal_met": med < 1.0,
            "register_entries": entries, "load_average_after": round(load, 2),
            "requests_encoded_in_clock": client_api}


async def _fill_job(client: AccordClient, job: str, steps: int) -> bool:
    """Commit ``steps`` steps of ``job``; False if its session was lost at the end (on an
    overloaded machine a lease can lapse between keepalives: the steps are in, and only
    the release finds the lock gone)."""
    coord = CheckpointCoordinator(client, job, ttl=60)
    await coord.__aenter__()
    for step in range(1, steps + 1):
        await coord.begin(step * 100, layout={"world_size": 1}, expected=[("rank-00000", 0)])
        await client.checkpoints.register_shards(
            job, step * 100, coord.token, [_shard(job, step * 100, 0, coord.token, 1)])
        await coord.commit(step * 100)
    try:
        await coord.__aexit__(None, None, None)
    except NotHeld:
        return False
    return True


async def _timed(n: int, fn: Any) -> float:
    """Median seconds of ``n`` sequential calls of ``fn()``."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


async def part_many(eps: list[str], jobs: int, steps: int, concurrency: int) -> dict[str, Any]:
    print(f"\n== many jobs: {jobs} jobs x {steps} steps (1 shard each), {concurrency} jobs "
          "filled at a time")
    pool = [AccordClient(eps[i % len(eps):] + eps[:i % len(eps)], call_timeout_s=30)
            for i in range(8)]
    try:
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> bool:
            async with sem:
                return await _fill_job(pool[i % len(pool)], f"job-{i:05d}", steps)

        lost = sum(not ok for ok in await asyncio.gather(*(one(i) for i in range(jobs))))
        fill = time.perf_counter() - t0
        ck = pool[0].checkpoints
        print(f"filled {jobs * steps} committed steps in {fill:.1f} s "
              f"({jobs * steps / fill:.0f} steps/s, 3 RPCs each); {lost} coordinator sessions "
              "lapsed before their release")
        ls_one = await _timed(20, lambda: ck.steps("job-00000"))
        ls_all = await _timed(5, ck.jobs)
        await asyncio.gather(*(pool[i % len(pool)].checkpoints.set_retention(
            f"job-{i:05d}", keep_last=5) for i in range(jobs)))
        dry = await _timed(3, lambda: ck.gc([], dry_run=True, timeout=120))
        t0 = time.perf_counter()
        report = await ck.gc([], timeout=120)
        gc = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = await ck.gc([], timeout=120)
        gc2 = time.perf_counter() - t0
        assert len(report.deleted) == jobs * max(0, steps - 5) and not again.deleted
        print(f"{'operation':<44} {'seconds':>8}")
        for name, v in (("ls of one job (ListSteps, median of 20)", ls_one),
                        (f"ls of all {jobs} jobs (ListJobs, median of 5)", ls_all),
                        ("gc dry run, all jobs (median of 3)", dry),
                        (f"gc, all jobs: {len(report.deleted)} steps deleted", gc),
                        ("gc again, nothing to delete", gc2)):
            print(f"{name:<44} {v:>8.3f}")
        print(f"gc reported {report.deletable_total} objects safe to delete")
        return {"jobs": jobs, "steps": steps, "fill_s": round(fill, 1), "sessions_lapsed": lost,
                "ls_one_job_s": round(ls_one, 4), "ls_all_jobs_s": round(ls_all, 4),
                "gc_dry_run_s": round(dry, 3), "gc_s": round(gc, 3),
                "gc_again_s": round(gc2, 3), "gc_deleted_steps": len(report.deleted),
                "gc_deletable_objects": int(report.deletable_total)}
    finally:
        for c in pool:
            await c.close()


async def part_state(jobs: int, steps: int) -> dict[str, Any]:
    """The same many-jobs workload on one in-process replica (no Raft, no gRPC): what the
    apply of each operation costs a replica, and the snapshot of that state."""
    print(f"\n== one replica in process: {jobs} jobs x {steps} steps (1 shard each)")
    group = local_group()
    svc = group.service
    t0 = time.perf_counter()
    for i in range(jobs):
        job = f"job-{i:05d}"
        for step in range(1, steps + 1):
            await svc.begin(job, step * 100, 1, {"world_size": 1}, [["rank-00000", 0]])
            await svc.register(job, step * 100, 1, [_shard(job, step * 100, 0, 1, 1)])
            await svc.commit(job, step * 100, 1)
        await svc.set_retention(job, {"keep_last": 5})
    fill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(20):
        svc.steps("job-00000")
    ls_one = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    listed = svc.jobs()
    ls_all = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap = group.sm.snapshot()
    snap_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = svc.plan_gc([])
    dry = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = await svc.gc([])
    gc = time.perf_counter() - t0
    group.sm.snapshot()  # re-encodes the steps GC changed
    t0 = time.perf_counter()
    group.sm.snapshot()
    snap_again_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    group.sm.restore(snap)
    restore_s = time.perf_counter() - t0
    assert len(listed) == jobs and len(report.deleted) == len(plan.deleted)
    print(f"filled in {fill:.1f} s ({jobs * steps * 3 / fill:.0f} commands/s applied)")
    print(f"{'operation (one replica)':<44} {'seconds':>8}")
    for name, v in (("ls of one job", ls_one), (f"ls of all {jobs} jobs", ls_all),
                    ("gc dry run, all jobs", dry),
                    (f"gc apply, all jobs: {len(report.deleted)} steps deleted", gc),
                    (f"snapshot ({len(snap) / 1e6:.1f} MB)", snap_s),
                    ("snapshot again, no step changed", snap_again_s),
                    ("restore of that snapshot", restore_s)):
        print(f"{name:<44} {v:>8.4f}")
    return {"jobs": jobs, "steps": steps, "ls_one_job_s": round(ls_one, 5),
            "ls_all_jobs_s": round(ls_all, 4), "gc_dry_run_s": round(dry, 3),
            "gc_apply_s": round(gc, 3), "gc_deleted_steps": len(report.deleted),
            "snapshot_mb": round(len(snap) / 1e6, 1), "snapshot_s": round(snap_s, 3),
            "snapshot_unchanged_s": round(snap_again_s, 3),
            "restore_s": round(restore_s, 3)}


async def run(a: argparse.Namespace, eps: list[str], metrics: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine()}
    if "commit" in a.parts:
        out["commit"] = await part_commit(eps, metrics, a.hosts, a.ranks_per_host, a.reps,
                                          a.clients, a.client_api)
    if "many" in a.parts:
        out["many_jobs"] = await part_many(eps, a.cluster_jobs or a.jobs, a.steps,
                                           a.concurrency)
    if "state" in a.parts:
        out["replica"] = await part_state(a.jobs, a.steps)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--hosts", type=int, default=512)
    p.add_argument("--ranks-per-host", type=int, default=8)
    p.add_argument("--clients", type=int, default=16, help="client channels for the ranks")
    p.add_argument("--client-api", action="store_true",
                   help="register through client.checkpoints.register_shards, each request "
                        "built and encoded inside the clock (default: encoded beforehand)")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=16, help="jobs filled at a time")
    p.add_argument("--parts", default="commit,many,state",
                   help="which parts: commit, many (on the cluster), state (one replica)")
    p.add_argument("--cluster-jobs", type=int, default=0,
                   help="jobs for the cluster part (default --jobs; filling takes 3 RPCs "
                        "per step)")
    p.add_argument("--quick", action="store_true", help="100 jobs, 3 reps")
    a = p.parse_args()
    if a.quick:
        a.jobs, a.reps = min(a.jobs, 100), min(a.reps, 3)
    print(f"machine: {machine()}", flush=True)
    import uvloop  # a dependency of accord on Linux; the members run on it too

    with Harness() as h:
        cluster = h.accord()
        metrics = [f"http://127.0.0.1:{m.client_port + METRICS_PORT_OFFSET}/metrics"
                   for m in cluster.members]
        figures = uvloop.run(run(a, list(cluster.endpoints), metrics))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
