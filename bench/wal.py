"""Benchmark of the shared write-ahead log: group commit versus the disk's raw fsync limit.

For 1, 16, 256 and 4,096 concurrent proposers (asyncio tasks, each appending one
256-byte entry to its own group and awaiting durability, in a loop) it reports
appends/s, MB/s, fsyncs/s, entries per fsync and resident memory; in the same run
it measures the disk's raw limit: a loop of ``write`` + ``fdatasync`` of the same
record size appended to a file (what the log does), so the results read as a ratio
to the physical limit.

The disk's rate drifts by 2x and more within seconds when other tenants write, so a
level is not compared with a raw loop measured seconds away: each level runs in
``--windows`` windows, and before every window (and after the last) the proposers
are paused, the log drained, and the raw loop runs for ``--raw-slice`` seconds. A
window's ratio is its rate over the mean of the raw slices on its two sides; the
level's ``ratio_to_raw`` is the median over its windows.

For reference (not the goal's denominator, since the log appends to its segments)
it also measures once a raw loop overwriting a preallocated, zero-filled file,
whose ``fdatasync`` has no file-size metadata to commit.

Usage: ``python bench/wal.py [--duration 3] [--levels 1,16,256,4096] [--dir DIR]``.
Prints a table, and as its last line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
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


def raw_fsync_loop(
    directory: Path, size: int, duration: float, *, prealloc: bool = False
) -> dict[str, float]:
    """write+fdatasync of ``size`` bytes in a loop, appending to one file.

    With ``prealloc`` the file is first filled with zeros (and fsynced), then
    overwritten in place: the same loop without any file-size change to commit.
    """
    path = directory / "raw.bin"
    buf = os.urandom(size)
    flags = os.O_WRONLY | os.O_CREAT | (0 if prealloc else os.O_APPEND)
    fd = os.open(path, flags, 0o644)
    n = 0
    try:
        if prealloc:
            room = 64 << 20
            zeros = bytes(1 << 20)
            for _ in range(room >> 20):
                os.write(fd, zeros)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
            limit = room // size - 1
        else:
            limit = 1 << 62
        start = time.perf_counter()
        deadline = start + duration
        while n < limit:
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


async def run_level(
    directory: Path,
    proposers: int,
    duration: float,
    entry_bytes: int,
    windows: int,
    raw_dir: Path,
    raw_slice: float,
    rec_size: int,
) -> dict[str, object]:
    """Run ``proposers`` appenders for ``windows`` windows, with raw-loop slices between."""
    wal, _ = WriteAheadLog.open(directory, sync=True)
    payload = os.urandom(entry_bytes)
    stop = False
    gate = asyncio.Event()
    gate.set()
    inflight = 0
    drained = asyncio.Event()
    counts = [0] * proposers
    peak_rss = rss_mb()

    async def proposer(i: int) -> None:
        nonlocal inflight
        g = i + 1
        idx = 0
        while not stop:
            if not gate.is_set():
                await gate.wait()
                continue
            idx += 1
            inflight += 1
            try:
                await wal.append(WriteBatch().append_entries(g, [Entry(1, idx, data=payload)]))
            finally:
                inflight -= 1
                if inflight == 0:
                    drained.set()
            counts[i] = idx

    async def pause() -> None:
        gate.clear()
        while inflight:
            drained.clear()
            await drained.wait()

    raws: list[float] = []
    rates: list[float] = []
    appends = fsyncs = written = 0
    elapsed = 0.0
    try:
        tasks = [asyncio.create_task(proposer(i)) for i in range(proposers)]
        await asyncio.sleep(min(0.3, duration / 5))  # warm-up
        for _ in range(windows):
            await pause()  # the log is idle: nothing of it runs during the raw slice
            raws.append(raw_fsync_loop(raw_dir, rec_size, raw_slice)["fsyncs_per_s"])
            gate.set()
            await asyncio.sleep(0.02)  # let every proposer get going again
            base_appends = sum(counts)
            base = (wal.stats.fsyncs, wal.stats.bytes_written)
            start = time.perf_counter()
            end = start + duration / windows
            while time.perf_counter() < end:
                await asyncio.sleep(0.05)
                peak_rss = max(peak_rss, rss_mb())
            dt = time.perf_counter() - start
            n = sum(counts) - base_appends
            elapsed += dt
            appends += n
            fsyncs += wal.stats.fsyncs - base[0]
            written += wal.stats.bytes_written - base[1]
            rates.append(n / dt)
        await pause()
        raws.append(raw_fsync_loop(raw_dir, rec_size, raw_slice)["fsyncs_per_s"])
        stop = True
        gate.set()
        await asyncio.gather(*tasks)
    finally:
        wal.close()
    ratios = [r / ((a + b) / 2) for r, a, b in zip(rates, raws, raws[1:], strict=False)]
    return {
        "proposers": proposers,
        "appends_per_s": appends / elapsed,
        "payload_mb_per_s": appends * entry_bytes / elapsed / 1e6,
        "disk_mb_per_s": written / elapsed / 1e6,
        "fsyncs_per_s": fsyncs / elapsed,
        "entries_per_fsync": appends / fsyncs if fsyncs else float("nan"),
        "peak_rss_mb": peak_rss,
        "raw_fsyncs_per_s": statistics.mean(raws),
        "raw_slices": raws,
        "window_appends_per_s": rates,
        "window_ratios": ratios,
        "ratio_to_raw": statistics.median(ratios),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds measured per level")
    ap.add_argument("--windows", type=int, default=6, help="measured windows per level")
    ap.add_argument("--raw-slice", type=float, default=0.4, help="seconds per raw slice")
    ap.add_argument("--levels", default="1,16,256,4096")
    ap.add_argument("--entry-bytes", type=int, default=256)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: system temp)")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    args = ap.parse_args()
    if args.windows < 1 or args.duration <= 0 or args.raw_slice <= 0:
        ap.error("--windows must be >= 1, --duration and --raw-slice > 0")
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
        prealloc = raw_fsync_loop(base, rec_size, 1.0, prealloc=True)
        appended = raw_fsync_loop(base, rec_size, 1.0)
        results = []
        for n in levels:
            d = base / f"wal-{n}"
            results.append(
                asyncio.run(
                    run_level(
                        d, n, args.duration, args.entry_bytes, args.windows, base,
                        args.raw_slice, rec_size,
                    )
                )
            )
            shutil.rmtree(d)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    one = float(results[0]["appends_per_s"]) if results and levels[0] == 1 else float("nan")  # type: ignore[arg-type]
    print(f"WAL benchmark: {args.entry_bytes}-byte entries, fsync on, {loop_name}, "
          f"{args.duration:.1f}s per level in {args.windows} windows, record {rec_size} bytes")
    print(f"raw write+fdatasync loop: appending {appended['fsyncs_per_s']:,.0f}/s "
          f"({appended['us_per_fsync']:.0f} us); overwriting a preallocated file "
          f"{prealloc['fsyncs_per_s']:,.0f}/s ({prealloc['us_per_fsync']:.0f} us) (one 1 s run each)")
    print(f"{'proposers':>9} {'appends/s':>11} {'MB/s':>7} {'fsyncs/s':>9} {'ent/fsync':>9} "
          f"{'raw/s':>8} {'x raw':>6} {'(min..max)':>11} {'x 1-prop':>8} {'RSS MiB':>8}")
    for r in results:
        rate = float(r["appends_per_s"])  # type: ignore[arg-type]
        r["ratio_to_one"] = rate / one
        wr = r["window_ratios"]
        assert isinstance(wr, list)
        print(f"{r['proposers']:>9} {rate:>11,.0f} {r['payload_mb_per_s']:>7.2f} "
              f"{r['fsyncs_per_s']:>9,.0f} {r['entries_per_fsync']:>9.1f} "
              f"{r['raw_fsyncs_per_s']:>8,.0f} {r['ratio_to_raw']:>6.2f} "
              f"{min(wr):>5.2f}..{max(wr):<5.2f} {r['ratio_to_one']:>8.1f} {r['peak_rss_mb']:>8.1f}")
    summary = {
        "bench": "wal",
        "entry_bytes": args.entry_bytes,
        "loop": loop_name,
        "raw_append_fsyncs_per_s": appended["fsyncs_per_s"],
        "raw_prealloc_fsyncs_per_s": prealloc["fsyncs_per_s"],
        "levels": results,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
