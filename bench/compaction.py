"""Micro-benchmark of one shard's MVCC compaction inside one process: how long a
Compact holds the event loop (it applies on the loop of every member, as etcd's
compaction of its index does under its lock).

A store of ``--keys`` keys is compacted once at its latest revision; then ``changed`` of
them are written again, and the timed Compact is the next one, at the new latest: what an
hourly automatic compaction does to a large store where a fraction of the keys changed
in the hour. Each cell runs ``--reps`` times; the table shows the median milliseconds.

Usage: ``.venv/bin/python bench/compaction.py [--keys 1000000] [--changed 1000,100000]
[--reps 3]``. The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.services.kv.mvcc import MVCCStore  # noqa: E402

VALUE = b"v" * 64


def _filled(keys: int) -> MVCCStore:
    store = MVCCStore()
    for i in range(keys):
        t = store.begin()
        t.put(b"/bench/compact/k%08d" % i, VALUE, 0)
        t.commit()
    store.compact(store.rev)
    return store


def _timed_compaction(store: MVCCStore, keys: int, changed: int) -> float:
    """Write ``changed`` of the keys again (spread over the key space), then time the
    Compact at the latest revision; milliseconds."""
    step = max(1, keys // max(1, changed))
    for i in range(0, step * changed, step):
        t = store.begin()
        t.put(b"/bench/compact/k%08d" % (i % keys), VALUE, 0)
        t.commit()
    gc.collect()
    start = time.perf_counter()
    store.compact(store.rev)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--changed", default="1000,100000",
                   help="comma-separated counts of keys written between two compactions")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    counts = [int(c) for c in args.changed.split(",")]
    build = time.perf_counter()
    store = _filled(args.keys)
    build_s = time.perf_counter() - build
    figures: dict[str, float] = {}
    for changed in counts:
        runs = [_timed_compaction(store, args.keys, changed) for _ in range(args.reps)]
        figures[f"changed={changed}"] = round(statistics.median(runs), 2)
    print(f"one shard of {args.keys:,} keys (built in {build_s:.1f} s); a Compact after "
          f"some were written again, median of {args.reps}")
    print(f"{'keys written since the last Compact':>36} | {'Compact ms':>10}")
    for changed in counts:
        print(f"{changed:>36,} | {figures[f'changed={changed}']:>10.2f}")
    print(json.dumps({"bench": "compaction", "keys": args.keys, "reps": args.reps,
                      "compact_ms": figures}))


if __name__ == "__main__":
    main()
