"""`accord ckpt`: checkpoint manifests from the shell.

    accord ckpt ls                         # every job: latest step, committed, pending
    accord ckpt ls JOB [--state committed] # a job's steps
    accord ckpt show JOB [STEP]            # a manifest (default: the latest committed)
    accord ckpt latest JOB [--wait S]      # the latest committed step (--wait: until one)
    accord ckpt gc [JOB ...] [--dry-run] [--delete]   # retention + expiry; deletable URLs
    accord ckpt pin JOB STEP | unpin JOB STEP
    accord ckpt verify JOB [STEP] [--all-locations]   # sizes and checksums, via fsspec

Tables by default, ``--json`` for one JSON document. Endpoints and TLS options as every
client subcommand takes them (``--endpoints`` or ``ACCORD_ENDPOINTS``, default
``127.0.0.1:2379``; ``--cacert/--cert/--key``: see ``accord/cli/common.py``). ``verify`` draws a progress bar on
stderr and exits 1 naming each bad shard; ``gc --delete`` deletes the reported objects
through fsspec and records the deletions, so the next pass no longer reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import fsspec
from google.protobuf import json_format

from accord.cli import common
from accord.client.checkpoints import Checkpoints
from accord.client.client import AccordClient
from accord.client.errors import ClientError
from accord.proto import checkpoints_pb2 as pb
from accord.services.checkpoints.verify import ShardCheck

TIMEOUT = 20.0


def _dump(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return out


def _state(s: int) -> str:
    return str(pb.StepState.Name(s)).lower()


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _table(rows: list[list[str]], out: TextIO = sys.stdout) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


class Progress:
    """A progress bar on stderr (redrawn in place on a terminal, else a line per 10%)."""

    def __init__(self, out: TextIO = sys.stderr, width: int = 30) -> None:
        self.bad = 0
        self.out, self.width = out, width
        self.tty = out.isatty()
        self._last_decile = -1

    def step(self, check: ShardCheck, done: int, total: int) -> None:
        self.bad += 0 if check.ok else 1
        total = max(total, 1)
        frac = done / total
        if not self.tty and int(frac * 10) == self._last_decile and done < total:
            return
        self._last_decile = int(frac * 10)
        filled = round(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"verify [{bar}] {done}/{total} shards, {self.bad} bad"
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n",
              file=self.out, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.out)


async def _ls(c: Checkpoints, a: argparse.Namespace) -> int:
    if not a.job:
        jobs = await c.jobs()
        if a.json:
            print(json.dumps([_dump(j) for j in jobs]))
            return 0
        rows = [["JOB", "LATEST", "COMMITTED", "PENDING", "TOKEN", "PINNED"]]
        rows += [[j.job, str(j.latest) if j.HasField("latest") else "-", str(j.committed),
                  str(j.pending), str(j.token), ",".join(map(str, j.pinned)) or "-"]
                 for j in jobs]
        _table(rows)
        return 0
    resp = await c.steps(a.job, a.state or [])
    if a.json:
        print(json.dumps(_dump(resp)))
        return 0
    rows = [["STEP", "STATE", "SHARDS", "SIZE", "COMMITTED AT", "FLAGS", "REASON"]]
    for s in resp.steps:
        flags = ",".join(f for f, on in (("latest", s.latest), ("pinned", s.pinned)) if on)
        rows.append([str(s.step), _state(s.state), f"{s.shards}/{s.expected}",
                     _size(s.total_bytes), _when(s.committed_at), flags or "-", s.reason])
    _table(rows)
    return 0


async def _show(c: Checkpoints, a: argparse.Namespace) -> int:
    m = await c.manifest(a.job, a.step)
    if a.json:
        print(json.dumps(_dump(m)))
        return 0
    lay = m.layout
    print(f"job {m.job} step {m.step}: {_state(m.state)}"
          + (" (latest)" if m.latest else "") + (" (pinned)" if m.pinned else ""))
    print(f"  layout: world {lay.world_size}, dp {lay.dp} tp {lay.tp} pp {lay.pp} ep {lay.ep} "
          f"cp {lay.cp}; token {m.token}; {len(m.shards)}/{len(m.expected)} shards, "
          f"{_size(m.total_bytes)}; committed {_when(m.committed_at)}")
    if m.reason:
        print(f"  reason: {m.reason}")
    rows = [["RANK", "SHARD", "SIZE", "CHECKSUM", "TENSORS", "TIER", "URI"]]
    for s in m.shards:
        rows.append([str(s.rank), s.shard_id, _size(s.size),
                     f"{s.checksum.algorithm}:{s.checksum.digest[:16]}", str(len(s.tensors)),
                     str(pb.Tier.Name(s.tier)).lower(), s.uri])
    _table(rows)
    return 0


async def _latest(c: Checkpoints, a: argparse.Namespace) -> int:
    latest = await c.latest(a.job)
    if latest is None and a.wait > 0:
        async for step in c.watch_latest(a.job, timeout=a.wait):
            if step is not None:
                latest = step
                break
    if a.json:
        print(json.dumps({"job": a.job, "latest": latest}))
    elif latest is None:
        print(f"accord ckpt latest: job {a.job} has no committed step", file=sys.stderr)
    else:
        print(latest)
    return 0 if latest is not None else 1


def _delete(uris: list[str]) -> list[str]:
    """Delete storage objects through fsspec; the ones now gone (missing counts as gone)."""
    gone = []
    for u in uris:
        fs, path = fsspec.core.url_to_fs(u)
        try:
            fs.rm(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            print(f"accord ckpt gc: could not delete {u}: {e}", file=sys.stderr)
            continue
        gone.append(u)
    return gone


async def _gc(c: Checkpoints, a: argparse.Namespace) -> int:
    r = await c.gc(a.job, dry_run=a.dry_run, limit=a.limit, timeout=60.0)
    confirmed = 0
    if a.delete and not a.dry_run and r.deletable:
        gone = await asyncio.to_thread(_delete, [g.uri for g in r.deletable])
        if gone:
            confirmed = await c.confirm_deleted(gone)
    if a.json:
        print(json.dumps({**_dump(r), "confirmed": confirmed}))
        return 0
    verb = "would delete" if a.dry_run else "deleted"
    print(f"{verb} {len(r.deleted)} steps by retention, expired {len(r.expired)} pending steps; "
          f"{r.deletable_total} objects safe to delete"
          + (f", {confirmed} deleted now" if a.delete else ""))
    if r.deleted or r.expired:
        rows = [["JOB", "STEP", "WHY"]]
        rows += [[d.job, str(d.step), "retention"] for d in r.deleted]
        rows += [[d.job, str(d.step), "lease expired"] for d in r.expired]
        _table(rows)
    if r.deletable and not a.delete:
        rows = [["URI", "JOB", "STEP", "SIZE"]]
        rows += [[g.uri, g.job, str(g.step), _size(g.size)] for g in r.deletable]
        _table(rows)
    return 0


async def _pin(c: Checkpoints, a: argparse.Namespace) -> int:
    changed = await (c.pin(a.job, a.step) if a.op == "pin" else c.unpin(a.job, a.step))
    if a.json:
        print(json.dumps({"job": a.job, "step": a.step, "changed": changed}))
    else:
        state = "pinned" if a.op == "pin" else "unpinned"
        print(f"job {a.job} step {a.step} {state}" + ("" if changed else " (already)"))
    return 0


async def _verify(c: Checkpoints, a: argparse.Namespace) -> int:
    bar = Progress()
    try:
        report = await c.verify(a.job, a.step, all_locations=a.all_locations,
                                workers=a.workers, progress=bar.step)
    finally:
        bar.close()
    m, results = report.manifest, report.checks
    bad = [r for r in results if not r.ok]
    if a.json:
        print(json.dumps({"job": m.job, "step": m.step, "checked": len(results),
                          "bad": [{"shard_id": r.shard_id, "rank": r.rank, "uri": r.uri,
                                   "status": r.status, "detail": r.detail} for r in bad]}))
    elif bad:
        print(f"job {m.job} step {m.step}: {len(bad)} of {len(results)} shard copies are bad")
        _table([["RANK", "SHARD", "PROBLEM", "DETAIL", "URI"]]
               + [[str(r.rank), r.shard_id, r.status, r.detail, r.uri] for r in bad])
    else:
        print(f"job {m.job} step {m.step}: all {len(results)} shard copies verified")
    return 1 if bad else 0


_OPS = {"ls": _ls, "show": _show, "latest": _latest, "gc": _gc, "pin": _pin, "unpin": _pin,
        "verify": _verify}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="accord ckpt", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = p.add_subparsers(dest="op", required=True)
    ls = sub.add_parser("ls", help="jobs, or a job's steps")
    ls.add_argument("job", nargs="?")
    ls.add_argument("--state", action="append", choices=["pending", "committed", "aborted",
                                                          "deleted"])
    for name in ("show", "verify"):
        s = sub.add_parser(name, help=f"{name} a manifest (default: the latest committed)")
        s.add_argument("job")
        s.add_argument("step", nargs="?", type=int)
        if name == "verify":
            s.add_argument("--all-locations", action="store_true",
                           help="check every copy, not only the primary")
            s.add_argument("--workers", type=int, default=8, help="parallel reads")
    lt = sub.add_parser("latest", help="the latest committed step")
    lt.add_argument("job")
    lt.add_argument("--wait", type=float, default=0.0,
                    help="wait up to this many seconds for a first committed step")
    gc = sub.add_parser("gc", help="apply retention and lease expiry; list deletable objects")
    gc.add_argument("job", nargs="*", help="jobs (default: every job)")
    gc.add_argument("--dry-run", action="store_true", help="report only; change nothing")
    gc.add_argument("--delete", action="store_true",
                    help="delete the reported objects (fsspec) and record the deletions")
    gc.add_argument("--limit", type=int, default=0, help="most objects listed (0: 10,000)")
    for name in ("pin", "unpin"):
        s = sub.add_parser(name, help=f"{name} a committed step")
        s.add_argument("job")
        s.add_argument("step", type=int)
    return p


def ckpt_main(argv: Sequence[str]) -> int:
    """Entry point of ``accord ckpt``."""
    p = _parser()
    a = p.parse_args(list(argv))
    if a.op == "gc" and a.delete and a.dry_run:
        p.error("--delete and --dry-run exclude each other")
    if a.op == "verify" and a.workers < 1:
        p.error("--workers must be >= 1")

    eps = common.from_args(a)

    async def run() -> int:
        async with AccordClient(list(eps), call_timeout_s=TIMEOUT, tls=eps.tls) as client:
            return await _OPS[a.op](client.checkpoints, a)

    try:
        return asyncio.run(run())
    except ClientError as e:
        print(f"accord ckpt {a.op}: {e.message} ({e.code.name})", file=sys.stderr)
        return 1
