"""Benchmark: SWIM vs SWIM + Lifeguard in the deterministic simulator.

For each cluster size, with 1% packet loss and 5% slow members (members that process
every packet late, by a lag drawn from 0-20 s that changes every 10-60 s, while their
own timers run on time; at n=5000 only with ``--slow-at-5000``, see PLAN), the same
seeded scenario runs twice, plain SWIM and SWIM with
Lifeguard, both on the LAN profile (1 s probe period). A few healthy members crash
(kill -9) at staggered times. Measured:

* time to first detection: crash -> the first member declares it dead (periods);
* time to full dissemination: crash -> every running member (healthy ones; and all,
  slow ones included) holds it dead (periods), against the goal 3*log2(n);
* false positives: declarations of death (a suspicion timing out) about members that
  did not crash, per member-hour: about healthy members (the Lifeguard paper's metric)
  and, separately, about slow members;
* traffic: UDP packets and bytes (plus TCP push-pull bytes) per member per second.

The simulator carries packets as decoded messages with their exact encoded size (the
same history, byte for byte, as sending the encoded packets; ``--wire`` sends the real
bytes through msgpack instead, slower at large n).

Usage: ``python bench/membership.py [--sizes 100,1000,5000] [--seed 1] [--quick] [--wire]``.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accord.membership.config import SwimConfig
from accord.membership.simulator import Simulator
from accord.membership.state import EventKind, MemberEvent

# Simulated seconds per size, crash times, and the fraction of slow members. Long
# enough for detection plus dissemination, short enough for minutes of Python.
#
# n=5000 runs without slow members by default: slow members keep the whole group busy
# with suspicions and refutations (each one applied by all n members, and every update
# relayed ~16 times by each of them), so the simulation cost grows as n^2. Measured on
# a shared 2-core machine after the simulator's fast paths (decoded packets, an
# allocation-free transmit queue): the full n=5000 pair with slow members
# (``--slow-at-5000``) took 4,308 s of wall time for plain SWIM (~46 CPU minutes: its
# suspicion storm grows) and 682 s for Lifeguard, 7.7 GB of memory, on 2026-12-01;
# n=1000 with slow members takes ~1.5 s of CPU per simulated second.
PLAN = {
    100: (600.0, [30.0 + 50.0 * k for k in range(10)], 0.05),
    1000: (60.0, [10.0, 12.0, 14.0], 0.05),
    5000: (34.0, [3.0, 4.0, 5.0], 0.0),
}


@dataclass
class Run:
    """Everything observed in one simulated run."""

    n: int
    lifeguard: bool
    duration: float
    slow_fraction: float
    crashes: dict[str, float] = field(default_factory=dict)
    first_detect: dict[str, float] = field(default_factory=dict)
    dead_views: dict[str, set[int]] = field(default_factory=dict)
    full_healthy: dict[str, float] = field(default_factory=dict)
    full_all: dict[str, float] = field(default_factory=dict)
    fp_healthy: int = 0
    fp_slow: int = 0
    false_dead_views: int = 0
    wall: float = 0.0
    totals: dict[str, int] = field(default_factory=dict)


def run_one(
    n: int,
    lifeguard: bool,
    seed: int,
    duration: float,
    crash_at: list[float],
    slow_fraction: float,
    wire: bool = False,
) -> Run:
    """One seeded scenario; returns what was measured."""
    cfg = SwimConfig.lan().with_lifeguard(lifeguard)
    run = Run(n, lifeguard, duration, slow_fraction)
    slow: set[int] = set()
    crashed: set[int] = set()
    healthy_target = 0
    all_target = 0
    healthy_seen: dict[str, int] = {}

    def on_declare(t: float, observer: int, subject: str) -> None:
        idx = int(subject[1:])
        if idx in crashed:
            run.first_detect.setdefault(subject, t)
        elif idx in slow:
            run.fp_slow += 1
        else:
            run.fp_healthy += 1

    def on_event(t: float, observer: int, ev: MemberEvent) -> None:
        if ev.kind is not EventKind.DEAD:
            return
        idx = int(ev.member.name[1:])
        if idx not in crashed:
            if idx not in slow:
                run.false_dead_views += 1
            return
        views = run.dead_views.setdefault(ev.member.name, set())
        views.add(observer)
        if observer not in slow:
            healthy_seen[ev.member.name] = healthy_seen.get(ev.member.name, 0) + 1
        if healthy_seen.get(ev.member.name, 0) >= healthy_target:
            run.full_healthy.setdefault(ev.member.name, t)
        if len(views) >= all_target:
            run.full_all.setdefault(ev.member.name, t)

    # Thousands of members hold n^2 references: the cyclic GC would spend most of the run
    # traversing them. The simulation creates no garbage cycles worth collecting.
    gc.collect()
    gc.disable()
    sim = Simulator(
        cfg, n, seed=seed, loss=0.01, latency=(0.0005, 0.002),
        slow_fraction=slow_fraction, slow_lag=(0.0, 20.0), slow_episode=(10.0, 60.0),
        on_event=on_event, on_declare_dead=on_declare, wire=wire,
    )
    slow.update(node.idx for node in sim.nodes if node.slow)
    victims = [node.idx for node in sim.nodes if not node.slow][: len(crash_at)]
    start = time.perf_counter()
    for at, victim in zip(crash_at, victims, strict=True):
        sim.run_until(at)
        sim.crash(victim)
        crashed.add(victim)
        run.crashes[f"n{victim}"] = at
        running = n - len(crashed)
        all_target = running
        healthy_target = running - len(slow)
    sim.run_until(duration)
    run.wall = time.perf_counter() - start
    run.totals = sim.totals()
    gc.enable()
    return run


def summarize(run: Run) -> dict[str, float | int | None]:
    """Figures of one run, in protocol periods (1 s on the LAN profile)."""

    def delays(found: dict[str, float]) -> list[float]:
        return [found[s] - t for s, t in run.crashes.items() if s in found]

    def mean(xs: list[float]) -> float | None:
        return round(statistics.fmean(xs), 2) if xs else None

    def worst(xs: list[float]) -> float | None:
        return round(max(xs), 2) if xs else None

    det, full_h, full_a = delays(run.first_detect), delays(run.full_healthy), delays(run.full_all)
    member_hours = run.n * run.duration / 3600.0
    return {
        "n": run.n,
        "lifeguard": run.lifeguard,
        "sim_seconds": run.duration,
        "loss": 0.01,
        "slow_fraction": run.slow_fraction,
        "crashes": len(run.crashes),
        "detected": len(det),
        "first_detection_mean": mean(det),
        "first_detection_max": worst(det),
        "full_dissemination_healthy_mean": mean(full_h),
        "full_dissemination_healthy_max": worst(full_h),
        "fully_disseminated_healthy": len(full_h),
        "full_dissemination_all_mean": mean(full_a),
        "full_dissemination_all_max": worst(full_a),
        "fp_healthy": run.fp_healthy,
        "fp_healthy_per_member_hour": round(run.fp_healthy / member_hours, 3),
        "fp_slow_per_member_hour": round(run.fp_slow / member_hours, 3),
        "false_dead_views_of_healthy": run.false_dead_views,
        "msgs_per_member_s": round(run.totals["packets"] / (run.n * run.duration), 2),
        "bytes_per_member_s": round(
            (run.totals["udp_bytes"] + run.totals["tcp_bytes"]) / (run.n * run.duration), 1
        ),
        "udp_bytes_per_member_s": round(run.totals["udp_bytes"] / (run.n * run.duration), 1),
        "tcp_bytes_per_member_s": round(run.totals["tcp_bytes"] / (run.n * run.duration), 1),
        "wall_s": round(run.wall, 1),
    }


def main() -> None:
    """Run the plan, print a table, then the JSON figures as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="comma-separated cluster sizes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tenth of the simulated time")
    parser.add_argument(
        "--slow-at-5000", action="store_true",
        help="5%% slow members at n=5000 too (about 80 minutes)",
    )
    parser.add_argument(
        "--wire", action="store_true", help="send real msgpack packets in the simulator (slower)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results: list[dict[str, float | int | None]] = []
    comparison: dict[str, dict[str, float | bool | None]] = {}
    header = (
        f"{'n':>5} {'slow':>4} {'mode':>9} {'det.mean':>8} {'det.max':>7} {'full.h':>7} {'full.all':>8} "
        f"{'goal':>5} {'FP/m-h':>8} {'FPslow':>7} {'msg/m/s':>7} {'B/m/s':>8} {'wall':>6}"
    )
    print(header, flush=True)
    for n in sizes:
        duration, crash_at, slow_fraction = PLAN.get(n, (60.0, [10.0, 12.0], 0.05))
        if args.slow_at_5000:
            slow_fraction = 0.05
        if args.quick:
            duration = max(crash_at[0] + 30.0, duration / 10)
            crash_at = [t for t in crash_at if t < duration - 25.0] or crash_at[:1]
        pair = {}
        for lifeguard in (False, True):
            s = summarize(
                run_one(n, lifeguard, args.seed, duration, crash_at, slow_fraction, args.wire)
            )
            results.append(s)
            pair[lifeguard] = s
            print(
                f"{n:>5} {slow_fraction:>4.0%} {'lifeguard' if lifeguard else 'swim':>9} "
                f"{s['first_detection_mean']!s:>8} {s['first_detection_max']!s:>7} "
                f"{s['full_dissemination_healthy_max']!s:>7} {s['full_dissemination_all_max']!s:>8} "
                f"{3 * math.log2(n):>5.1f} {s['fp_healthy_per_member_hour']!s:>8} "
                f"{s['fp_slow_per_member_hour']!s:>7} {s['msgs_per_member_s']!s:>7} "
                f"{s['bytes_per_member_s']!s:>8} {s['wall_s']!s:>6}",
                flush=True,
            )
        plain, lg = pair[False], pair[True]
        fp_p, fp_l = float(plain["fp_healthy"] or 0), float(lg["fp_healthy"] or 0)
        det_p, det_l = plain["first_detection_mean"], lg["first_detection_mean"]
        goal = 3 * math.log2(n)
        comparison[str(n)] = {
            "fp_reduction": (round(fp_p / fp_l, 1) if fp_l else None),
            # Lifeguard had none: the reduction is at least the plain count (over 1).
            "fp_reduction_lower_bound": (fp_p if fp_p and not fp_l else None),
            "detection_ratio": (round(det_l / det_p, 2) if det_p and det_l else None),
            "dissemination_goal_periods": round(goal, 1),
            "dissemination_goal_met_healthy": all(
                r["full_dissemination_healthy_max"] is not None
                and float(r["full_dissemination_healthy_max"] or 0) <= goal
                and r["fully_disseminated_healthy"] == r["crashes"]
                for r in (plain, lg)
            ),
        }
    print("columns: det = crash -> first death declaration; full.h / full.all = crash -> all")
    print("healthy / all running members hold it dead (max); goal = 3*log2(n) periods;")
    print("FP/m-h = false deaths of healthy members per member-hour; FPslow = of slow members.")
    for n_str, c in comparison.items():
        print(f"n={n_str}: {c}")
    print(json.dumps({"benchmark": "membership", "runs": results, "comparison": comparison}))


if __name__ == "__main__":
    main()
