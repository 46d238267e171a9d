"""``accord wal check DIR``: report the state and any damage of a write-ahead log, read-only.

It scans every segment with the same code recovery uses and prints, per segment,
its records and groups, where its records end inside the preallocated file (the
zero-filled rest is unused room, the clean end of the log) and the first bad spot;
then, if nothing is corrupt, what recovery would rebuild per group. It never
writes: a torn tail is reported (with what recovery would zero), not repaired, and
a leftover ``.prep`` file (a segment being prepared when the node stopped) is
listed as what it is: not part of the log, removed by the next start.

With ``--snapshots SNAPDIR`` it also verifies the CRC of every snapshot file.

Exit status: 0 when the log is clean or only has a torn tail (a normal crash,
repaired on the next start), 1 when it is damaged (the node would refuse to
start) or a snapshot file is, 2 when a directory does not exist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from accord.raft.storage.format import (
    GroupReplay,
    WALCorruptError,
    finish_replay,
    list_prepared,
    list_segments,
    replay_checked,
    scan_segment,
)
from accord.raft.storage.snapshot import SnapshotCorruptError, verify_file


def _ranges(nums: list[int]) -> str:
    if len(nums) > 8:
        return f"{len(nums)} groups ({nums[0]}..{nums[-1]})"
    return ",".join(str(n) for n in nums) or "-"


def _room(size: int, end: int) -> str:
    if size > end:
        return f" of {size} (the rest is preallocated zeros)"
    return ""


def check(directory: Path, out: TextIO) -> int:
    """Scan ``directory`` and print the report to ``out``; returns the exit status."""
    if not directory.is_dir():
        print(f"error: {directory} is not a directory", file=out)
        return 2
    if not list_segments(directory):
        print(f"{directory}: no WAL segments (an empty or new log): clean", file=out)
        return 0
    segs = list_segments(directory)
    damaged = False
    torn_bytes = 0
    groups_state: dict[int, GroupReplay] = {}
    replay_error: WALCorruptError | None = None
    print(f"write-ahead log {directory}: {len(segs)} segment(s)", file=out)
    for i, (seq, path) in enumerate(segs):
        s = scan_segment(seq, path, last=(i == len(segs) - 1))
        groups = sorted({r.group for r in s.records})
        line = f"  {s.path.name}: {s.size} bytes, {len(s.records)} records, groups {_ranges(groups)}"
        if replay_error is None and not damaged:
            try:
                for r in s.records:
                    replay_checked(groups_state, s, r)
            except WALCorruptError as exc:
                replay_error = exc
        dmg = s.damage
        if dmg is None:
            print(f"{line}: ok, records end at offset {s.valid_end}{_room(s.size, s.valid_end)}",
                  file=out)
            continue
        who = f" (group {dmg.group})" if dmg.group is not None else ""
        if dmg.torn_tail:
            if s.header_torn:
                n = s.size
                what = "recovery will truncate it: the half-created file is removed"
            else:
                n = s.data_end - s.valid_end
                what = (
                    f"recovery will truncate {n} byte(s) (zeroes offsets {s.valid_end}.."
                    f"{s.data_end}: a crash's unacknowledged write)"
                )
            torn_bytes += n
            print(f"{line}: torn tail at offset {dmg.offset}{who}: {dmg.reason}; {what}",
                  file=out)
        else:
            damaged = True
            print(f"{line}: DAMAGED at offset {dmg.offset}{who}: {dmg.reason}", file=out)
    for p in list_prepared(directory):
        print(f"  {p.name}: {p.stat().st_size} bytes, a segment prepared ahead of use and never "
              f"used (not part of the log; the next start removes it)", file=out)
    if damaged:
        print("result: DAMAGED: the node will refuse to start from this log", file=out)
        return 1
    try:
        if replay_error is not None:
            raise replay_error
        states = finish_replay(groups_state, str(segs[-1][1]))
    except WALCorruptError as exc:
        print(f"result: DAMAGED: {exc}", file=out)
        return 1
    print(f"groups: {len(states)}", file=out)
    for gid in sorted(states):
        st = states[gid]
        hs = st.hard_state
        snap = f"{st.snapshot.term}/{st.snapshot.index}" if st.snapshot else "none"
        ents = f"{st.entries[0].index}..{st.entries[-1].index}" if st.entries else "none"
        print(
            f"  group {gid}: term {hs.term} vote {hs.vote} commit {hs.commit}; "
            f"snapshot {snap}; entries {ents}",
            file=out,
        )
    if torn_bytes:
        print(f"result: clean apart from a torn tail of {torn_bytes} byte(s)", file=out)
    else:
        print("result: clean", file=out)
    return 0


def check_snapshots(root: Path, out: TextIO) -> int:
    """Verify every snapshot file under ``root`` (``<group>/*.snap``), read-only."""
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=out)
        return 2
    bad = 0
    files = sorted(p for p in root.glob("*/*.snap") if p.parent.name.isdigit())
    for p in files:
        try:
            group, meta = verify_file(p)
        except (SnapshotCorruptError, OSError) as exc:
            bad += 1
            print(f"  {p.relative_to(root)}: DAMAGED: {exc}", file=out)
            continue
        if str(group) != p.parent.name:
            bad += 1
            print(f"  {p.relative_to(root)}: DAMAGED: header says group {group}", file=out)
            continue
        print(f"  {p.relative_to(root)}: ok (group {group}, term {meta.term}, index {meta.index})",
              file=out)
    print(f"snapshots: {len(files)} file(s), {bad} damaged", file=out)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    """Entry point of ``accord wal check DIR [--snapshots SNAPDIR]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="accord wal check",
        description="Check a write-ahead log directory (and optionally the snapshot "
        "directory) for damage without changing anything.",
    )
    parser.add_argument("dir", type=Path, help="the WAL directory (<data-dir>/wal)")
    parser.add_argument(
        "--snapshots", type=Path, default=None, help="also verify the snapshot files under SNAPDIR"
    )
    args = parser.parse_args(argv)
    rc = check(args.dir, sys.stdout)
    if args.snapshots is not None:
        rc = max(rc, check_snapshots(args.snapshots, sys.stdout))
    return rc
