"""Benchmark of the shared write-ahead log: group commit versus the disk's raw fsync limit.

For 1, 16, 256 and 4,096 concurrent proposers (asyncio tasks, each appending one
256-byte entry to its own group and awaiting durability, in a loop) it reports
appends/s, MB/s, fsyncs/s, entries per fsync and resident memory; in the same run
it measures the disk's raw limit: a loop of ``write`` + ``fdatasync`` of the same
record size, so the results read as a ratio to the physical limit.

Usage: ``python bench/wal.py [--duration 3] [--levels 1,16,256,4096] [--dir DIR]``.
Prints a table, and as its last line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.raft.storage_codec import encode_entries, record_size  # noqa: E402
from accord.raft.types import Entry  # noqa: E402
from accord.raft.wal import WriteAheadLog, WriteBatch  # noqa: E402


def rss_mb() -> float:
    """Current resident set size in MiB (Linux)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except OSError:
        return float("nan")


def raw_fsync_loop(directory: Path, size: int, duration: float) -> dict[str, float]:
    """write+fdatasync of ``size`` bytes in a loop, appending to one file."""
    path = directory / "raw.bin"
    buf = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    n = 0
    try:
        start = time.perf_counter()
        deadline = start + duration
        while True:
            os.write(fd, buf)
            os.fdatasync(fd)
            n += 1
            if n % 16 == 0 and time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return {"fsyncs_per_s": n / elapsed, "us_per_fsync": elapsed / n * 1e6}


async def run_level(directory: Path, proposers: int, duration: float, entry_bytes: int) -> dict[str, float]:
    wal, _ = WriteAheadLog.open(directory, sync=True)
    payload = os.urandom(entry_bytes)
    stop = False
    counts = [0] * proposers
    peak_rss = rss_mb()

    async def proposer(i: int) -> None:
        g = i + 1
        idx = 0
        while not stop:
            idx += 1
            await wal.append(WriteBatch().append_entries(g, [Entry(1, idx, data=payload)]))
            counts[i] = idx

    try:
        tasks = [asyncio.create_task(proposer(i)) for i in range(proposers)]
        await asyncio.sleep(min(0.3, duration / 5))  # warm-up
        base_appends = sum(counts)
        base = (wal.stats.fsyncs, wal.stats.bytes_written)
        start = time.perf_counter()
        end = start + duration
        while time.perf_counter() < end:
            await asyncio.sleep(0.05)
            peak_rss = max(peak_rss, rss_mb())
        elapsed = time.perf_counter() - start
        appends = sum(counts) - base_appends
        fsyncs = wal.stats.fsyncs - base[0]
        written = wal.stats.bytes_written - base[1]
        stop = True
        await asyncio.gather(*tasks)
    finally:
        wal.close()
    return {
        "proposers": proposers,
        "appends_per_s": appends / elapsed,
        "payload_mb_per_s": appends * entry_bytes / elapsed / 1e6,
        "disk_mb_per_s": written / elapsed / 1e6,
        "fsyncs_per_s": fsyncs / elapsed,
        "entries_per_fsync": appends / fsyncs if fsyncs else float("nan"),
        "peak_rss_mb": peak_rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds measured per level")
    ap.add_argument("--raw-duration", type=float, default=1.5, help="seconds per raw fsync loop")
    ap.add_argument("--levels", default="1,16,256,4096")
    ap.add_argument("--entry-bytes", type=int, default=256)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: system temp)")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    base = Path(tempfile.mkdtemp(prefix="accord-walbench-", dir=args.dir))
    loop_name = args.loop
    if loop_name == "uvloop":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            loop_name = "asyncio"
    try:
        rec_size = record_size(len(encode_entries([Entry(1, 1, data=b"x" * args.entry_bytes)])))
        # The disk's rate drifts (other tenants); measure the raw loop around every
        # level and compare each level with the mean of the raw runs on its two sides.
        raws = [raw_fsync_loop(base, rec_size, args.raw_duration)]
        results = []
        for n in levels:
            d = base / f"wal-{n}"
            results.append(asyncio.run(run_level(d, n, args.duration, args.entry_bytes)))
            shutil.rmtree(d)
            raws.append(raw_fsync_loop(base, rec_size, args.raw_duration))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one = results[0]["appends_per_s"] if results and levels[0] == 1 else float("nan")
    print(f"WAL benchmark: {args.entry_bytes}-byte entries, fsync on, {loop_name}, "
          f"{args.duration:.1f}s per level, record {rec_size} bytes")
    print("raw write+fdatasync loop, fsyncs/s around the levels: "
          + ", ".join(f"{r['fsyncs_per_s']:,.0f}" for r in raws)
          + f" ({raws[0]['us_per_fsync']:.0f} us each at first)")
    print(f"{'proposers':>9} {'appends/s':>11} {'MB/s':>7} {'fsyncs/s':>9} {'ent/fsync':>9} "
          f"{'raw/s':>8} {'x raw':>7} {'x 1-prop':>8} {'RSS MiB':>8}")
    for i, r in enumerate(results):
        limit = (raws[i]["fsyncs_per_s"] + raws[i + 1]["fsyncs_per_s"]) / 2
        r["raw_fsyncs_per_s"] = limit
        r["ratio_to_raw"] = r["appends_per_s"] / limit
        r["ratio_to_one"] = r["appends_per_s"] / one
        print(f"{r['proposers']:>9} {r['appends_per_s']:>11,.0f} {r['payload_mb_per_s']:>7.2f} "
              f"{r['fsyncs_per_s']:>9,.0f} {r['entries_per_fsync']:>9.1f} {limit:>8,.0f} "
              f"{r['ratio_to_raw']:>7.2f} {r['ratio_to_one']:>8.1f} {r['peak_rss_mb']:>8.1f}")
    summary = {
        "bench": "wal",
        "entry_bytes": args.entry_bytes,
        "loop": loop_name,
        "raw_fsyncs_per_s": [r["fsyncs_per_s"] for r in raws],
        "levels": results,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
