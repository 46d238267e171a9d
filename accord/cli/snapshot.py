"""`accord snapshot save|status|restore`: back a cluster up, look at a backup, restore it.

* ``save FILE`` streams a member's backup (``client.cluster.snapshot``:
  ``Maintenance.Snapshot`` from the first of ``--endpoints`` that answers; TLS with
  ``--cacert/--cert/--key`` as etcdctl) to ``FILE.part`` with a progress bar on a
  terminal, checks it (SHA-256, pages, format) and only then renames it to ``FILE``: a
  file named ``FILE`` is always a whole, checked backup;
* ``status FILE`` checks a backup (accord's or etcd's) and prints its revision, keys,
  size and hash, as a table or ``--json`` (``hash``, ``revision``, ``totalKey``,
  ``totalSize`` are ``etcdctl snapshot status``'s figures for the same file);
* ``restore FILE --data-dir ... --name ... --initial-cluster ...`` builds one member's
  data directory (``accord/node/restore.py``); it takes ``accord serve``'s flags, so
  run it once per member with the flags that member will be started with.

The file format is ``accord/services/cluster/snapfile.py``'s; ``etcdctl snapshot save``
against accord writes the same file, and etcd's snapshots restore here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from accord.cli import common
from accord.client.errors import ClientError
from accord.node.config import ConfigError, add_arguments, config_from_args
from accord.node.restore import restore_data_dir
from accord.services.cluster import snapfile

SAVE_TIMEOUT = 600.0
"""Seconds a whole save may take (the stream's deadline)."""
_BAR = 30


def _bar(done: int, total: int, started: float, out: IO[str]) -> None:
    frac = done / total if total else 1.0
    fill = int(frac * _BAR)
    rate = done / max(time.monotonic() - started, 1e-6) / 1e6
    out.write(f"\r[{'#' * fill}{' ' * (_BAR - fill)}] {frac * 100:5.1f}% "
              f"{done / 1e6:.1f}/{total / 1e6:.1f} MB {rate:.1f} MB/s")
    out.flush()


def _save(args: argparse.Namespace) -> int:
    dest = Path(args.file)
    progress: Callable[[int, int], None] | None = None
    if sys.stderr.isatty() and not args.quiet:
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            _bar(done, total, started, sys.stderr)
    checked: list[snapfile.SnapshotFile] = []

    def check(part: Path) -> None:
        checked.append(snapfile.decode(part.read_bytes()))

    try:
        with common.client(args) as c:
            c.cluster.snapshot(dest, progress=progress, check=check, timeout=args.timeout)
    except ClientError as e:
        print(f"accord snapshot save: {e.code.name}: {e.message}", file=sys.stderr)
        return 1
    except snapfile.SnapshotFileError as e:
        print(f"accord snapshot save: the member sent a bad backup: {e}", file=sys.stderr)
        return 1
    finally:
        if progress is not None:
            sys.stderr.write("\n")
    snap = checked[0]
    print(f"Snapshot saved at {dest} (revision {snap.revision}, {len(snap.groups)} groups, "
          f"{dest.stat().st_size} bytes)")
    return 0


def _status(args: argparse.Namespace) -> int:
    try:
        st = snapfile.status(Path(args.file).read_bytes(), skip_hash_check=args.skip_hash_check)
    except (OSError, snapfile.SnapshotFileError) as e:
        print(f"accord snapshot status: {args.file}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st.as_dict()))
        return 0
    rows = [("HASH", f"{st.hash:x}"), ("REVISION", str(st.revision)),
            ("KEYS", str(st.keys)), ("TOTAL KEYS", str(st.total_key)),
            ("TOTAL SIZE", f"{st.total_size / 1e6:.1f} MB"), ("ORIGIN", st.origin),
            ("FORMAT", str(st.format)), ("GROUPS", str(st.groups))]
    print("  ".join(f"{h:<{max(len(h), len(v))}}" for h, v in rows))
    print("  ".join(f"{v:<{max(len(h), len(v))}}" for h, v in rows))
    return 0


def _restore(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args, os.environ)
        snap = snapfile.decode(Path(args.file).read_bytes(), skip_hash_check=args.skip_hash_check)
        done = restore_data_dir(snap, cfg, shards_given=hasattr(args, "shards"))
    except (OSError, ConfigError, snapfile.SnapshotFileError, ValueError) as e:
        print(f"accord snapshot restore: {e}", file=sys.stderr)
        return 1
    print(f"restored {snap.origin} backup (revision {done.revision}) into {done.data_dir} "
          f"for member {cfg.name} (id {done.member_id:x}): {len(done.groups)} groups, "
          f"{done.shards} shards; start it with `accord serve` and the same flags "
          f"(--shards {done.shards}{f' --workers {cfg.workers}' if cfg.workers > 1 else ''})")
    return 0


def main(argv: Sequence[str]) -> int:
    """Entry point of `accord snapshot`."""
    p = argparse.ArgumentParser(prog="accord snapshot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="op", required=True)
    save = sub.add_parser("save", help="stream a member's backup to FILE")
    save.add_argument("file")
    common.add_arguments(save)
    save.add_argument("--timeout", type=float, default=SAVE_TIMEOUT,
                      help=f"seconds the whole save may take (default {SAVE_TIMEOUT:.0f})")
    save.add_argument("--quiet", action="store_true", help="no progress bar")
    status = sub.add_parser("status", help="check a backup file and report on it")
    status.add_argument("file")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--skip-hash-check", action="store_true",
                        help="read a db file without its SHA-256 trailer")
    restore = sub.add_parser("restore", help="build a member's data directory from FILE "
                                             "(takes `accord serve`'s flags)")
    restore.add_argument("file")
    restore.add_argument("--skip-hash-check", action="store_true",
                         help="restore a db file without its SHA-256 trailer")
    add_arguments(restore)
    args = p.parse_args(list(argv))
    return {"save": _save, "status": _status, "restore": _restore}[args.op](args)
