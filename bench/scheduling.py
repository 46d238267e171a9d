"""Scheduling benchmark: trace replay against baselines, and cycle latency at 10,000 GPUs.

Three parts, all through the real placement code and state machine:

1. saturation (the FGD-paper experiment): pods of an Alibaba openb trace arrive
   and never leave, each placed at once or dropped, until the arrived GPU demand
   reaches 1.2x the cluster; unallocated GPUs at 100% and 120% arrived demand.
   Every policy sees the same pods in the same (trace) order on the same nodes.
   The issue's goal ("30% fewer unallocated GPUs than FIFO first-fit when the
   cluster saturates") is read at 100%: arrived demand equals capacity, so every
   unallocated GPU is demand that was dropped because the free capacity was in
   the wrong shape (the FGD paper's Fig. 9 metric; its 49% is on this trace).
   120% shows what is still unusable when far more work arrives than fits.
   The placement was designed looking at ``openb_pod_list_default`` (the class
   supply-pressure term after looking at ``gpuspec33``: it has no parameter and
   leaves the default result unchanged, having no device-type constraints to
   weigh); the full run
   also replays the ``gpuspec33``, ``gpushare100`` and ``multigpu50`` variants,
   the default pods on another cluster (the PAI-2020 machine list), and the
   default pods in a shuffled order (the FGD paper shuffles; in trace order
   similar pods come in bursts, which hurts first fit more), as held-out cases
   (accord and FIFO first-fit only).
2. replay: the heterogeneous ``gpuspec33`` pods with their durations, arrivals
   compressed to a chosen offered load on a subset of the nodes (the whole trace
   asks for less than the full cluster even all at once); allocation, idle GPUs
   while jobs wait, fragmentation, queueing delay, JCT, cycle latency.
3. scale: 1,250 nodes x 8 GPUs with 1,000 queued jobs; per-cycle latency.
4. live (``--live``, or ``--live-only``): a real 3-member cluster, 64 node agents in one
   process, 1,000 short real jobs; jobs/s placed and started, submit->start latency,
   CPU per job (``bench/scheduling_live.py``).

Usage: python bench/scheduling.py [--traces DIR] [--quick] [--csv JOBS.csv] [--live|--live-only]
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accord.services.scheduling import simulator, traces
from accord.services.scheduling.fragmentation import Workload
from accord.services.scheduling.model import Job, Topology
from accord.services.scheduling.placement import Policy
from accord.services.scheduling.scheduler import CycleConfig, run_cycle
from accord.services.scheduling.state import SchedulerStateMachine
from accord.services.scheduling.topology import make_cluster


def _r(x: float, n: int = 2) -> float:
    return round(x, n)


HELD_OUT = ("openb_pod_list_gpuspec33.csv", "openb_pod_list_gpushare100.csv",
            "openb_pod_list_multigpu50.csv")


def part_saturation(tdir: Path, pods_file: str, policies: list[str], pai_nodes: bool = False,
                    shuffle_seed: int | None = None) -> dict[str, Any]:
    d = tdir / "alibaba-gpu-v2023-openb"
    if pai_nodes:
        nodes = traces.load_pai_nodes(tdir / "alibaba-gpu-v2020-pai" / "pai_machine_spec.csv")
    else:
        nodes = traces.load_openb_nodes(d / "openb_node_list_all_node.csv")
    pods = traces.load_openb_pods(d / pods_file)
    where = "the PAI-2020 machines" if pai_nodes else "the openb nodes"
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(pods)  # the same shuffled order for every policy
        where += f", arrival order shuffled (seed {shuffle_seed}) as in the FGD paper"
    print(f"\n== saturation: {pods_file} on {where}, {len(nodes)} nodes / {traces.gpu_total(nodes)} GPUs "
          "(arrive until demand = 1.2x capacity, nothing leaves)")
    print(f"{'policy':16} {'unalloc@100%':>13} {'unalloc@120%':>13} {'frag@120%':>10} "
          f"{'failed':>7} {'place ms':>9} {'wall s':>7}")
    out: dict[str, Any] = {}
    for pol in policies:
        r = simulator.saturate(nodes, pods, pol, levels=(1.0, 1.2))
        out[pol] = {"unallocated_at_100": r.unallocated[0], "unallocated_at_120": r.unallocated[1],
                    "fragmented_at_120": r.fragmented[1], "allocation_rate_at_120":
                    _r(r.allocated[1] / r.total_gpus, 4), "failed_jobs": r.failed_jobs,
                    "place_ms_mean": _r(r.place_ms_mean, 3)}
        print(f"{pol:16} {r.unallocated[0]:13.1f} {r.unallocated[1]:13.1f} {r.fragmented[1]:10.1f} "
              f"{r.failed_jobs:7d} {r.place_ms_mean:9.3f} {r.wall_s:7.1f}")
    base = out.get("fifo-first-fit")
    if base and "accord" in out:
        for lvl in ("100", "120"):
            b = base[f"unallocated_at_{lvl}"]
            a = out["accord"][f"unallocated_at_{lvl}"]
            out[f"accord_unallocated_reduction_vs_first_fit_at_{lvl}"] = _r(1 - a / b, 4) if b else 0.0
        print(f"accord vs FIFO first-fit: {out['accord_unallocated_reduction_vs_first_fit_at_100']:.1%} "
              f"fewer unallocated GPUs at 100%, "
              f"{out['accord_unallocated_reduction_vs_first_fit_at_120']:.1%} at 120%")
    return out


def part_replay(jobs: list[traces.TraceJob], nodes: list[Any], label: str, load: float,
                policies: list[str]) -> dict[str, Any]:
    total = traces.gpu_total(nodes)
    scale = simulator.scale_for_load(jobs, total, load)
    print(f"\n== replay: {label}: {len(jobs)} jobs on {len(nodes)} nodes / {total} GPUs, "
          f"arrivals compressed {scale:.0f}x (offered load {load}x)")
    print(f"{'policy':16} {'alloc':>6} {'idle-wait':>9} {'frag':>7} {'qdelay':>8} {'q p99':>8} "
          f"{'JCT':>8} {'JCT p99':>9} {'cyc ms':>7} {'cyc p99':>8} {'wall s':>7}")
    out: dict[str, Any] = {"time_scale": _r(scale, 1), "jobs": len(jobs), "gpus": total}
    for pol in policies:
        r = simulator.replay(nodes, jobs, pol, time_scale=scale, cycle_interval=60.0)
        out[pol] = {k: (_r(v, 3) if isinstance(v, float) else v) for k, v in r.as_dict().items()
                    if k != "policy"}
        print(f"{pol:16} {r.allocation_rate:6.3f} {r.idle_while_waiting:9.1f} {r.fragmentation:7.1f} "
              f"{r.queue_delay_mean:8.0f} {r.queue_delay_p99:8.0f} {r.jct_mean:8.0f} {r.jct_p99:9.0f} "
              f"{r.cycle_ms_mean:7.1f} {r.cycle_ms_p99:8.1f} {r.wall_s:7.1f}")
    if "accord" in out and "fifo-backfill" in out:
        out["accord_jct_vs_fifo_backfill"] = _r(out["accord"]["jct_mean"] / out["fifo-backfill"]["jct_mean"], 4)
        print(f"accord mean JCT / FIFO+backfill mean JCT = {out['accord_jct_vs_fifo_backfill']:.4f}")
    return out


def _scale_job(rng: random.Random, i: int) -> Job:
    r = rng.random()
    if r < 0.5:
        tasks, dpt = 1, rng.choice([1, 1, 2, 4, 8])
    elif r < 0.9:
        tasks, dpt = rng.choice([2, 4, 8]), 8
    else:
        tasks, dpt = rng.choice([16, 32]), 8
    return Job(f"j{i}", tenant=rng.choice("abcd"), priority=rng.choice([0, 0, 1]), tasks=tasks,
               devices_per_task=dpt, selector=rng.choice(["", "vendor == nvidia", "memory >= 80GiB"]),
               topology=Topology(rng.choice([None, "leaf", "spine"]), False),
               estimated_runtime=rng.uniform(600, 36000), preemptible=rng.random() < 0.3,
               submit_time=float(i))


def part_scale(cycles: int) -> dict[str, Any]:
    print("\n== scale: 1,250 nodes x 8 GPUs (10,000 GPUs), 1,000 queued jobs, one cycle each")
    rng = random.Random(7)
    sm = SchedulerStateMachine()
    for i, n in enumerate(make_cluster(1250, nodes_per_leaf=32)):
        sm.apply({"id": f"r{i}", "op": "register_node", "node": n.to_wire()})
    jobs = [_scale_job(rng, i) for i in range(4000)]
    cfg = CycleConfig(Policy("accord"), expected_finish=True)
    cfg.policy.set_workload(Workload.from_jobs(jobs))
    for j in jobs[:1000]:
        sm.apply({"id": "s" + j.id, "op": "submit_job", "job": j.to_wire()})
    t0 = time.perf_counter()
    res = run_cycle(sm.index, sm.pending_jobs(), sm.running_view(), 0.0, cfg)
    fill_ms = (time.perf_counter() - t0) * 1000
    sm.apply({"id": "p0", "op": "place_jobs", "placements": [p.to_wire() for p in res.placements],
              "preemptions": res.preemptions, "now": 0.0})
    fill_placed = len(res.placements)
    print(f"filling an idle cluster: {fill_placed} of 1,000 placed in {fill_ms:.1f} ms")
    # Keep exactly 1,000 queued, saturated cluster; some jobs finish between cycles.
    nxt = 1000
    lat = []
    placed = []
    for c in range(cycles):
        while len(sm.pending) < 1000:
            j = jobs[nxt % len(jobs)]
            nxt += 1
            j2 = Job.from_wire({**j.to_wire(), "id": f"{j.id}-{nxt}", "submit_time": float(nxt)})
            sm.apply({"id": f"s{nxt}", "op": "submit_job", "job": j2.to_wire()})
        now = 100.0 * (c + 1)
        for jid in list(sm.running)[: rng.randint(0, 8)]:
            sm.apply({"id": f"f{c}-{jid}", "op": "job_finished", "job_id": jid, "now": now})
        t0 = time.perf_counter()
        res = run_cycle(sm.index, sm.pending_jobs(), sm.running_view(), now, cfg)
        lat.append((time.perf_counter() - t0) * 1000)
        out = sm.apply({"id": f"p{c + 1}", "op": "place_jobs", "now": now,
                        "placements": [p.to_wire() for p in res.placements],
                        "preemptions": res.preemptions})
        placed.append(len(out["accepted"]))
    lat_sorted = sorted(lat)
    p50 = statistics.median(lat)
    p99 = lat_sorted[min(len(lat) - 1, int(0.99 * len(lat)))]
    print(f"saturated, 1,000 queued: {cycles} cycles, median {p50:.1f} ms, p99 {p99:.1f} ms, "
          f"max {max(lat):.1f} ms; jobs started per cycle {statistics.mean(placed):.1f}")
    return {"fill_cycle_ms": _r(fill_ms, 1), "fill_placed": fill_placed,
            "cycle_ms_median": _r(p50, 1), "cycle_ms_p99": _r(p99, 1), "cycle_ms_max": _r(max(lat), 1),
            "cycles": cycles}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", help="trace directory (default <repo>/../shared/traces)")
    ap.add_argument("--quick", action="store_true", help="smaller replay and fewer scale cycles")
    ap.add_argument("--csv", help="also replay a plain job CSV (arrival,gpus,duration|steps[,gpu_type])")
    ap.add_argument("--csv-nodes", type=int, default=64, help="8-GPU nodes for --csv replay")
    ap.add_argument("--load", type=float, default=1.3, help="offered load for the replay")
    ap.add_argument("--live", action="store_true", help="also run the live cell (real daemons)")
    ap.add_argument("--live-only", action="store_true", help="run only the live cell")
    ap.add_argument("--live-agents", type=int, default=64)
    ap.add_argument("--live-jobs", type=int, default=1000)
    args = ap.parse_args()
    if args.live_only:
        from bench.scheduling_live import run_live, table

        live = run_live(args.live_agents, args.live_jobs)
        print(table(live))
        print(json.dumps({"live": live}, sort_keys=True))
        return
    try:
        tdir = traces.traces_dir(args.traces)
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    t_all = time.perf_counter()
    figures: dict[str, Any] = {}
    figures["saturation"] = part_saturation(
        tdir, "openb_pod_list_default.csv", ["accord", "fifo-first-fit", "random", "best-fit"])
    if not args.quick:
        figures["saturation_held_out"] = {
            f.removeprefix("openb_pod_list_").removesuffix(".csv"):
            part_saturation(tdir, f, ["accord", "fifo-first-fit"]) for f in HELD_OUT}
        figures["saturation_held_out"]["default_on_pai_nodes"] = part_saturation(
            tdir, "openb_pod_list_default.csv", ["accord", "fifo-first-fit"], pai_nodes=True)
        figures["saturation_held_out"]["default_shuffled"] = part_saturation(
            tdir, "openb_pod_list_default.csv", ["accord", "fifo-first-fit"], shuffle_seed=1)
    d = tdir / "alibaba-gpu-v2023-openb"
    stride = 8 if args.quick else 4
    nodes = traces.load_openb_nodes(d / "openb_node_list_all_node.csv")[::stride]
    pods = traces.load_openb_pods(d / "openb_pod_list_gpuspec33.csv")
    pods = [p for p in pods if p.arrival >= pods[len(pods) // 10].arrival]  # skip the sparse start
    if args.quick:
        pods = pods[: len(pods) // 2]
    figures["replay"] = part_replay(pods, nodes, f"gpuspec33, every {stride}th node", args.load,
                                    ["accord", "fifo-backfill", "fifo-first-fit", "random"])
    if args.csv:
        jobs = traces.load_plain_csv(Path(args.csv))
        cl = [n for n in make_cluster(args.csv_nodes, nodes_per_leaf=16)]
        figures["csv"] = part_replay(jobs, cl, Path(args.csv).name, args.load,
                                     ["accord", "fifo-backfill", "fifo-first-fit"])
    figures["scale"] = part_scale(10 if args.quick else 30)
    if args.live:
        from bench.scheduling_live import run_live, table

        figures["live"] = run_live(args.live_agents, args.live_jobs)
        print(table(figures["live"]))
    figures["wall_s"] = _r(time.perf_counter() - t_all, 1)
    sat = figures["saturation"]
    rep = figures["replay"]
    figures["summary"] = {
        "unallocated_reduction_vs_first_fit_at_100": sat.get("accord_unallocated_reduction_vs_first_fit_at_100"),
        "unallocated_reduction_vs_first_fit_at_120": sat.get("accord_unallocated_reduction_vs_first_fit_at_120"),
        "replay_idle_while_waiting_reduction_vs_fifo_first_fit": _r(
            1 - rep["accord"]["idle_while_waiting"] / rep["fifo-first-fit"]["idle_while_waiting"], 4)
        if rep["fifo-first-fit"]["idle_while_waiting"] else None,
        "jct_mean_accord": rep["accord"]["jct_mean"], "jct_mean_fifo_backfill": rep["fifo-backfill"]["jct_mean"],
        "cycle_ms_median_10k_gpus_1k_queued": figures["scale"]["cycle_ms_median"],
    }
    for name, held in figures.get("saturation_held_out", {}).items():
        for lvl in ("100", "120"):
            figures["summary"][f"held_out_{name}_unallocated_reduction_vs_first_fit_at_{lvl}"] = held.get(
                f"accord_unallocated_reduction_vs_first_fit_at_{lvl}")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
