"""A/B: accord as checked out against accord at another commit, same load, interleaved.

The effect of one change is often smaller than this machine's drift between two runs
of ``kv.py`` minutes apart. This runs two 3-node accord clusters side by side, the
working tree's (``new``) and ``--base``'s (``base``: ``git archive`` of its ``accord/``
package into the run's temp dir, started with ``python -P`` and ``PYTHONPATH`` so
that it, not the working tree, is imported), and drives every cell on both in
interleaved rounds, alternating which goes first. Besides ops/s and p99 it reports
the CPU time of all three members per operation (``/proc``): a change that saves
CPU off the latency path shows there even when throughput cannot.

Usage: ``python bench/ab.py --base HEAD~1 [--cells put:1,get:1,put:256] [--reps 4]``.
Prints a table, and as its last line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    AccordCluster,
    Cluster,
    Harness,
    Member,
    cpu_seconds,
    enable_auth,
    machine,
)
from bench.kv import ordered_endpoints, spec_for  # noqa: E402
from bench.loadgen import LoadGen  # noqa: E402


class SourceTreeAccord(AccordCluster):
    """``accord serve`` members importing the ``accord`` package under ``source``."""

    def __init__(self, root: Path, source: Path, *, extra: tuple[str, ...] = ()) -> None:
        self.source = source
        super().__init__(root, extra=extra)

    def argv(self, m: Member) -> list[str]:
        python, *rest = super().argv(m)
        # -P: no script directory or working directory ahead of PYTHONPATH.
        return ["/usr/bin/env", f"PYTHONPATH={self.source}", python, "-P", *rest]


def export_package(rev: str, dest: Path) -> str:
    """Unpack ``accord/`` as of ``rev`` under ``dest``; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "accord"],
                         check=True, capture_output=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    return commit


def cpu_of(c: Cluster) -> float:
    return sum(cpu_seconds(p) for p in c.pids)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the commit to compare against (e.g. HEAD~1)")
    p.add_argument("--cells", default="put:1,get:1,put:256", help="workload:concurrency,...")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell (default 5)")
    p.add_argument("--reps", type=int, default=4, help="interleaved rounds (default 4)")
    p.add_argument("--workers", type=int, default=3, help="load generator processes (default 3)")
    p.add_argument("--leases", type=int, default=10_000)
    p.add_argument("--watch-rate", type=float, default=10.0)
    p.add_argument("--accord-args", default="", help="extra `accord serve` flags for both sides")
    p.add_argument("--auth", action="store_true",
                   help="auth on in both (simple tokens; every call carries the token)")
    args = p.parse_args(argv)
    cells = args.cells.split(",")
    extra = tuple(args.accord_args.split())
    started = time.time()
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with Harness() as h, LoadGen(args.workers) as lg:
        commit = export_package(args.base, h.root / "base-src")
        systems: dict[str, Cluster] = {
            "new": h.accord(extra=extra),
            "base": h.add(SourceTreeAccord(h.root / "base", h.root / "base-src", extra=extra)),
        }
        tokens = {name: enable_auth(c) for name, c in systems.items()} if args.auth else {}
        for rep in range(args.reps):
            for i, cell in enumerate(cells):
                order = ["new", "base"] if (rep + i) % 2 == 0 else ["base", "new"]
                for name in order:
                    c = systems[name]
                    before = cpu_of(c)
                    spec = spec_for(cell, ordered_endpoints(c), args, "accord", rep)
                    spec.token = tokens.get(name, "")
                    r = lg.run(spec)
                    used = cpu_of(c) - before
                    ops = r.ops  # a load cell runs until its keys are in, not --duration
                    cpu_us = used / ops * 1e6 if ops else float("nan")
                    runs.setdefault((cell, name), []).append((r.ops_s, r.p99_ms, cpu_us))
                    print(f"  round {rep + 1} {cell:<10} {name:<5} {r.ops_s:9.0f} ops/s "
                          f"p99 {r.p99_ms:7.2f} ms cpu {cpu_us:6.0f} us/op errors {r.errors}",
                          file=sys.stderr, flush=True)

    def med(cell: str, name: str, k: int) -> float:
        return statistics.median(x[k] for x in runs[(cell, name)])

    print(f"\naccord (working tree) vs accord at {commit[:12]} ({args.base}); medians of "
          f"{args.reps} interleaved rounds of {args.duration:g}s"
          + (" with auth on" if args.auth else ""))
    print(f"machine: {machine()}  ({time.time() - started:.0f}s)")
    hdr = (f"{'cell':<11}{'new ops/s':>10}{'base ops/s':>11}{'new/base':>9}{'new p99':>9}"
           f"{'base p99':>9}{'new cpu':>9}{'base cpu':>9}")
    print(hdr + "   (p99 in ms; cpu: us of all members' CPU per op)")
    print("-" * len(hdr))
    table: dict[str, dict[str, float]] = {}
    for cell in cells:
        row = {f"{name}_{what}": med(cell, name, k) for name in ("new", "base")
               for k, what in enumerate(("ops_s", "p99_ms", "cpu_us_per_op"))}
        row["ratio"] = row["new_ops_s"] / row["base_ops_s"] if row["base_ops_s"] else float("nan")
        table[cell] = row
        print(f"{cell:<11}{row['new_ops_s']:>10.0f}{row['base_ops_s']:>11.0f}{row['ratio']:>9.3f}"
              f"{row['new_p99_ms']:>9.2f}{row['base_p99_ms']:>9.2f}"
              f"{row['new_cpu_us_per_op']:>9.0f}{row['base_cpu_us_per_op']:>9.0f}")
    print(json.dumps({"bench": "ab", "base": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                      time.gmtime()), "reps": args.reps, "duration_s": args.duration, "auth": args.auth,
                      "cells": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
