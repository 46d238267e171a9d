"""The Multi-Raft host's work per proposal, counted: Python calls and CPU, this tree vs another.

``bench/ab.py`` times whole daemons, and on this shared 2-core machine one run's drift
is often larger than the effect of a refactor. This counts instead: three
:class:`MultiRaftHost` instances in one process, over the real write-ahead log (fsync
on), snapshot store and loopback TCP links, a trivial register state machine, and a
load of ``--ops`` proposals at ``--concurrency`` in flight from every node in turn.
Under cProfile it reports the Python function calls the three hosts made per
proposal, less the calls the same hosts make idle (ticks, heartbeats) in as much
wall time (a figure other tenants of the machine blur far less than time: at
concurrency 1 the path each proposal takes is the same in every run), and without the profiler the
process CPU time per proposal (``time.process_time``: all three hosts, the WAL
threads included).

``--base REV`` runs the same measurement on the ``accord`` package as of ``REV``
(``git archive`` into a temp dir, imported through ``PYTHONPATH`` with ``python -P``,
as ``ab.py`` does) in interleaved rounds, and prints both and their ratios, plus the
functions (by name, wherever they live) whose call counts per proposal differ most. It knows the module paths
before and after the house move (``accord/raft/host.py`` -> ``accord/raft/host/``),
so the move itself can be weighed.

Usage: ``python bench/hostcalls.py [--base REV] [--new REV] [--ops 2000] [--concurrency 1,32]
[--reps 3]``. Prints a table; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GROUPS = (1, 2, 3)


_LAYOUTS = (
    # (host, wal, snapshot store, transport) modules: after the house move, before it
    ("accord.raft.host.multiraft", "accord.raft.storage.wal", "accord.raft.storage.snapshot",
     "accord.raft.transport.links"),
    ("accord.raft.host", "accord.raft.wal", "accord.raft.snapshot", "accord.raft.transport"),
)


def _modules() -> tuple[Any, Any, Any, Any, Any]:
    """(MultiRaftHost, HostConfig, WriteAheadLog, SnapshotStore, PeerTransport) of
    whichever layout the imported ``accord`` has."""
    for names in _LAYOUTS:
        try:
            host, wal, snap, links = (importlib.import_module(n) for n in names)
        except ImportError:
            continue
        return (host.MultiRaftHost, host.HostConfig, wal.WriteAheadLog, snap.SnapshotStore,
                links.PeerTransport)
    raise ImportError("no known accord.raft layout")


class _Register:
    """The state machine: remembers the last value per key (msgpack [key, value])."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def apply(self, index: int, payload: bytes) -> object:
        key, value = payload[:16], payload[16:]
        self.data[key] = value
        return index

    def prepare_snapshot(self) -> Any:
        data = dict(self.data)
        return lambda: b"".join(k + v for k, v in data.items())

    def restore(self, data: bytes) -> None:
        self.data = {}


async def _run(root: Path, ops: int, concurrency: int, profile: cProfile.Profile | None,
               idle: cProfile.Profile | None = None) -> dict[str, float]:
    MultiRaftHost, HostConfig, WriteAheadLog, SnapshotStore, PeerTransport = _modules()
    config = HostConfig(tick_interval=0.05, election_ticks=10, request_timeout=10.0,
                        snapshot_entries=1_000_000)
    hosts: dict[int, Any] = {}
    transports: dict[int, Any] = {}
    wals: list[Any] = []
    for nid in (1, 2, 3):
        d = root / f"n{nid}"
        d.mkdir()
        wal, recovered = WriteAheadLog.open(d / "wal")
        wals.append(wal)

        def deliver(frm: int, batch: Any, nid: int = nid) -> None:
            hosts[nid].deliver(frm, batch)

        def heartbeats(frm: int, hbs: Any, resps: Any, nid: int = nid) -> None:
            hosts[nid].deliver_heartbeats(frm, hbs, resps)

        def chunk(frm: int, piece: Any, nid: int = nid) -> None:
            hosts[nid].receive_snapshot_chunk(frm, piece)

        t = PeerTransport(nid, "127.0.0.1", 0, on_messages=deliver, on_heartbeats=heartbeats,
                          on_snapshot_chunk=chunk)
        host = MultiRaftHost(nid, wal, SnapshotStore(d / "snap"), t, config, boot_nonce=nid)
        for gid in GROUPS:
            host.add_group(gid, _Register(), recovered.get(gid), voters=(1, 2, 3))
        await t.start()
        hosts[nid], transports[nid] = host, t
    try:
        for nid, t in transports.items():
            for other, o in transports.items():
                if other != nid:
                    t.set_peer(other, "127.0.0.1", o.listen_port)
        for h in hosts.values():
            await h.start()
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        leaders: dict[int, int] = {}
        while len(leaders) < len(GROUPS) and loop.time() < end:
            for gid in GROUPS:
                for nid, h in hosts.items():
                    if h.group(gid).core.role.name == "LEADER":
                        leaders[gid] = nid
            await asyncio.sleep(0.05)
        if len(leaders) < len(GROUPS):
            raise RuntimeError("no leader for every group within 20 s")
        # Every proposal enters at its group's leader (the common case once leader
        # balancing has followed the workload); forwarding is another path.
        value = b"v" * 256
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            gid = GROUPS[i % len(GROUPS)]
            async with sem:
                await hosts[leaders[gid]].propose(gid, b"%016d" % (i % 1000) + value, 10.0)

        await asyncio.gather(*(one(i) for i in range(min(ops // 10, 200))))  # warm up
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        await asyncio.gather(*(one(i) for i in range(ops)))
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if idle is not None:
            # What the hosts do with no load (ticks, heartbeats) in the same wall time:
            # subtracted from the loaded run's calls, so the figure is per proposal.
            idle.enable()
            await asyncio.sleep(wall)
            idle.disable()
        return {"cpu_us_per_op": cpu / ops * 1e6, "ops_s": ops / wall}
    finally:
        for h in hosts.values():
            with contextlib.suppress(Exception):
                await h.stop()
        for t in transports.values():
            with contextlib.suppress(Exception):
                await t.stop()
        for w in wals:
            with contextlib.suppress(Exception):
                w.close()


def _event_loop(main: Any) -> Any:
    """Run ``main`` on uvloop, as the daemon does (asyncio's own loop when it is missing)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def child(ops: int, concurrency: int) -> dict[str, Any]:
    """One measurement in this process: calls per op (profiled run), CPU per op (plain run)."""
    with tempfile.TemporaryDirectory(prefix="hostcalls-") as tmp:
        prof, idle = cProfile.Profile(), cProfile.Profile()
        (Path(tmp) / "p").mkdir()
        _event_loop(_run(Path(tmp) / "p", ops, concurrency, prof, idle))
        per_fn: dict[str, float] = {}
        for profile, sign in ((prof, 1), (idle, -1)):
            raw: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            for (file, _line, name), v in raw.items():
                label = f"{Path(file).name}:{name}"
                per_fn[label] = per_fn.get(label, 0.0) + sign * v[1] / ops  # v[1]: all calls
        calls = sum(per_fn.values())
        (Path(tmp) / "c").mkdir()
        plain = _event_loop(_run(Path(tmp) / "c", ops, concurrency, None))
    return {"calls_per_op": calls, **plain, "per_fn": per_fn}


def _by_name(per_fn: dict[str, float]) -> dict[str, float]:
    """Calls per op by function name alone, so a function that moved to another module
    (the house move renamed most of them) compares with itself."""
    out: dict[str, float] = {}
    for label, n in per_fn.items():
        name = label.split(":", 1)[1]
        out[name] = out.get(name, 0.0) + n
    return out


def export(rev: str, dest: Path) -> str:
    """``accord/`` as of ``rev`` under ``dest``; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "accord"],
                         check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return commit


def measure(source: Path | None, ops: int, concurrency: int) -> dict[str, Any]:
    """Run ``child`` in a fresh interpreter on ``source``'s package (None: this tree's)."""
    argv = [sys.executable, "-P", str(Path(__file__).resolve()), "--child",
            "--ops", str(ops), "--concurrency", str(concurrency)]
    env_path = str(source) if source is not None else str(ROOT)
    out = subprocess.run(["/usr/bin/env", f"PYTHONPATH={env_path}", *argv], check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", help="commit to compare with (default: this tree alone)")
    p.add_argument("--new", help="measure this commit instead of the working tree")
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--top", type=int, default=8, help="functions with the largest call-count change")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    levels = [int(c) for c in str(a.concurrency).split(",")]
    if a.child:
        print(json.dumps(child(a.ops, levels[0])))
        return
    with tempfile.TemporaryDirectory(prefix="hostcalls-") as tmp:
        sides: dict[str, Path | None] = {"new": None}
        commit = new_commit = None
        if a.new:
            (Path(tmp) / "new").mkdir()
            new_commit = export(a.new, Path(tmp) / "new")
            sides["new"] = Path(tmp) / "new"
        if a.base:
            (Path(tmp) / "base").mkdir()
            commit = export(a.base, Path(tmp) / "base")
            sides["base"] = Path(tmp) / "base"
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rep in range(a.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for c in levels:
                for side in order:
                    r = measure(sides[side], a.ops, c)
                    runs.setdefault((side, c), []).append(r)
                    print(f"  round {rep + 1} c{c:<4} {side:5} {r['calls_per_op']:9.1f} calls/op "
                          f"{r['cpu_us_per_op']:8.1f} us/op {r['ops_s']:8.0f} ops/s", flush=True)
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\nMulti-Raft host, 3 in one process, {a.ops} proposals of 272 B per run, medians of "
          f"{a.reps}; new {new_commit[:12] if new_commit else 'working tree'}, base "
          f"{commit[:12] if commit else '-'}; load {load}")
    print(f"{'cell':8} {'side':5} {'calls/op':>9} {'cpu us/op':>10} {'ops/s':>8}")
    figures: dict[str, Any] = {}
    for c in levels:
        for side in sides:
            rs = runs[(side, c)]
            f = {k: statistics.median(r[k] for r in rs) for k in ("calls_per_op", "cpu_us_per_op", "ops_s")}
            figures[f"c{c}:{side}"] = f
            print(f"c{c:<7} {side:5} {f['calls_per_op']:9.1f} {f['cpu_us_per_op']:10.1f} {f['ops_s']:8.0f}")
        if "base" in sides:
            n, b = figures[f"c{c}:new"], figures[f"c{c}:base"]
            ratios = {k: n[k] / b[k] for k in ("calls_per_op", "cpu_us_per_op", "ops_s")}
            figures[f"c{c}:ratio"] = ratios
            print(f"c{c:<7} new/base {ratios['calls_per_op']:6.3f} {ratios['cpu_us_per_op']:10.3f} "
                  f"{ratios['ops_s']:8.3f}")
            new_fn, base_fn = (_by_name(runs[(side, c)][0]["per_fn"]) for side in ("new", "base"))
            names = set(new_fn) | set(base_fn)
            diff = sorted(names, key=lambda k: -abs(new_fn.get(k, 0) - base_fn.get(k, 0)))
            for name in diff[: a.top]:
                print(f"    {name:60} new {new_fn.get(name, 0):7.2f} base {base_fn.get(name, 0):7.2f}")
    print(json.dumps({"bench": "hostcalls", "new": new_commit, "base": commit, "ops": a.ops, "reps": a.reps,
                      "load": float(load), "figures": figures}))


if __name__ == "__main__":
    main()
