"""``python -m accord.raft.simulation``: replay one schedule exactly."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accord.raft.simulation.cluster import run_schedule
from accord.raft.simulation.model import CoreFactory, InvariantViolation, default_core
from accord.raft.simulation.profiles import PROFILES, parse_profile

VARIANTS: dict[str, CoreFactory] = {"": default_core}
"""Core variants a replay can name (tests register their deliberately broken ones here)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Replay one schedule: ``python -m accord.raft.simulation --seed N [--profile P]``."""
    ap = argparse.ArgumentParser(prog="python -m accord.raft.simulation",
                                 description="Replay one deterministic Raft simulation.")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--profile", default="chaos",
                    help=f"one of {', '.join(sorted(PROFILES))}, optionally with overrides: "
                         "NAME+drop=0.1,crash_rate=0.05")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--variant", default="", help="a broken core variant (tests' names)")
    ap.add_argument("--trace", action="store_true", help="print every event")
    args = ap.parse_args(argv)
    try:
        parse_profile(args.profile)
    except ValueError as exc:
        ap.error(str(exc))
    if args.variant and args.variant not in VARIANTS:
        _load_test_variants()
    factory = VARIANTS.get(args.variant)
    if factory is None:
        print(f"unknown variant {args.variant!r}; known: {sorted(VARIANTS)}", file=sys.stderr)
        return 2
    trace = print if args.trace else None
    try:
        res = run_schedule(args.seed, args.profile, args.nodes, args.ticks, factory,
                           args.variant, trace)
    except InvariantViolation as exc:
        print(f"VIOLATION: {exc}")
        return 1
    print(f"ok: seed {res.seed} profile {res.profile}: {res.ticks} ticks, {res.elections} "
          f"elections, max term {res.max_term}, {res.writes_acked} writes acknowledged, "
          f"{res.reads_served} reads served, liveness in {res.liveness_ticks} ticks, "
          f"fingerprint {res.fingerprint}")
    return 0


def _load_test_variants() -> None:
    """Import the broken variants the test-suite defines, when running from a checkout."""
    try:
        import importlib

        mod = importlib.import_module("tests.raft.simulation.broken")
    except ImportError:
        return
    VARIANTS.update(getattr(mod, "VARIANTS", {}))

