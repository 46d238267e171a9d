"""accord side by side with a real etcd: the key-value workloads, as accord/etcd ratios.

One run starts a real 3-member etcd (fsync on), a 3-node accord and the do-nothing
server of accord's front-end design (``bench/nullserver.py``) on this machine, then
drives them with the same load generator (``bench/loadgen.py``) in repeated,
interleaved rounds (every round runs every cell on every system, alternating which
system goes first) and reports medians over the rounds:

* put (256-byte values) at 1, 16 and 256 concurrent; linearizable get at 1 and 256;
  serializable get at 256; Txn compare-and-set at 16; mixed 90/10 at 64; lock acquire
  and release at 16; watch fan-out (one writer, 1,000 watchers: delivery latency);
  lease keepalives (10,000 leases, 64 streams);
* put and get also on the do-nothing server: the ceiling of this front end with this
  client on this CPU, so accord reads as a fraction of it; watch on three do-nothing
  servers that pass each Put's event to each other's watch streams (no consensus, no
  store): the floor of watch delivery latency for this front end; put:1 and get:1 on
  three do-nothing quorum servers (``bench/nullquorum.py``: a write durable on two of
  three, a read confirmed by a quorum round, nothing else): the floor of a replicated
  store of this front-end design, so accord and etcd read as multiples of it;
* memory: on a fresh etcd and a fresh accord (after the rounds), resident size (VmRSS)
  of every member before and after loading ``--mem-keys`` distinct 256-byte keys
  (default 50,000, not a million, to keep the run short), extrapolated linearly to MiB
  per million keys;
* accord's work per operation of every cell (from its ``/metrics`` and ``/proc`` around
  each run, medians over the rounds): CPU of all members, Raft entries each member
  applies, Raft messages and WAL writes of all members, cross-shard Txn retries: what a
  ratio is made of (a cross-shard Txn is three entries, ``docs/txn.md``);
* ``--profile S``: py-spy samples accord's leader for S seconds under put:256
  (``--profile-cell watch:1000`` for another cell);
* ``--auth``: an etcd and an accord with auth on (a user whose role has readwrite on
  the bench keys; every call carries its simple token) run ``--auth-cells`` (default
  put:1, get:1, put:256) in the same rounds, and with ``--tls`` also a pair under mutual
  TLS with auth on; each as a ratio to the same system without auth and to etcd with the
  same settings;
* ``--tls``: a second etcd and a second accord, both under mutual TLS on every port with
  the same certificates' kind and etcd's flags (``bench/harness.py``), run the
  ``--tls-cells`` (default put:1, get:1, put:256) in the same rounds; each TLS figure is
  reported as a ratio to the same system without TLS and to etcd with TLS.

Clients talk to every member round-robin, leader first (the single client of a
1-concurrent cell talks to the leader). The machine's 2 cores are shared by the load
generator, all servers and whatever else runs: figures are noisy, ratios less so.

Usage: ``python bench/kv.py [--duration 5] [--reps 3] [--workers 3] [--mem-keys 50000]
[--cells put:1,get:256,...] [--profile 10] [--tls [--tls-cells put:1,...]]``. Prints a table; the last line is one JSON
object with every figure and ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    AccordCluster,
    Cluster,
    EtcdCluster,
    Harness,
    cpu_times,
    enable_auth,
    machine,
)
from bench.loadgen import LoadGen, Result, Spec  # noqa: E402
from bench.profiling import hot_spots, py_spy, record  # noqa: E402

DEFAULT_CELLS = ("put:1,put:16,put:256,get:1,get:256,sget:256,txn:16,mixed:64,lock:16,"
                 "watch:1000,lease:64")
NULL_WORKLOADS = {"put", "get", "watch"}
FLOOR_CELLS = {"put:1", "get:1"}
"""Cells also run on the do-nothing quorum servers (``bench/nullquorum.py``)."""
MIB = 1 << 20
WORK_COUNTERS = (
    ("etcd_server_proposals_committed_total", "entries"),
    ("accord_transport_msgs_sent_total", "raft_msgs"),
    ("accord_wal_writes_total", "wal_writes"),
    ("accord_xtxn_retries_total", "xtxn_retries"),
)
"""accord's counters :func:`work_per_op` turns into work per operation (summed over the
members; ``entries``: per member, the Raft entries each applies)."""
TLS_CELLS = "put:1,get:1,put:256"
TLS_SYSTEMS = ("etcd tls", "accord tls")
AUTH_CELLS = "put:1,get:1,put:256"
AUTH_SYSTEMS = ("etcd auth", "accord auth", "etcd tls auth", "accord tls auth")
"""With ``--auth``: a user whose role has readwrite on the bench keys, every call carrying
its simple token; the ``tls`` pair (with ``--tls``) is under mutual TLS as well."""


def ordered_endpoints(c: Cluster) -> list[str]:
    """The cluster's endpoints, leader first."""
    if len(c.members) == 1 or c.kind.startswith("null"):
        return c.endpoints
    lead = c.leader().endpoint
    return [lead, *(e for e in c.endpoints if e != lead)]


def spec_for(cell: str, eps: list[str], args: argparse.Namespace, system: str, rep: int) -> Spec:
    workload, _, n = cell.partition(":")
    num = int(n or 1)
    if workload == "watch":
        return Spec("watch", eps, 1, args.duration, watchers=num, rate=args.watch_rate,
                    tag=f"r{rep}")
    if workload == "lease":
        return Spec("lease", eps, num, args.duration, leases=args.leases, tag=f"r{rep}")
    return Spec(workload, eps, num, args.duration, tag=f"r{rep}", check=system not in ("null", "floor"))


def tls_files(c: Cluster) -> tuple[str, str, str] | None:
    """What the load generator dials ``c`` with: (CA, certificate, key), or None."""
    t = c.client_tls
    if t is None or not (t.cacert and t.cert and t.key):
        return None
    return t.cacert, t.cert, t.key


def median(values: list[float]) -> float:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def measure_memory(lg: LoadGen, c: Cluster, keys: int, conc: int) -> dict[str, float]:
    """RSS before/after loading ``keys`` distinct keys; MiB per million keys (mean of members)."""
    time.sleep(2.0)
    before = c.rss()
    t0 = time.monotonic()
    r = lg.run(Spec("load", ordered_endpoints(c), conc, 1.0, total=keys, tag="mem"))
    load_s = time.monotonic() - t0
    time.sleep(2.0)
    after = c.rss()
    deltas = [a - b for a, b in zip(after, before, strict=True)]
    per_key = statistics.mean(deltas) / keys
    return {"rss_before_mib": statistics.mean(before) / MIB,
            "rss_after_mib": statistics.mean(after) / MIB,
            "bytes_per_key": per_key, "mib_per_million": per_key * 1e6 / MIB,
            "load_ops_s": r.ops / load_s if load_s else 0.0, "errors": float(r.errors)}


def profile_accord(lg: LoadGen, c: Cluster, spec: Spec, seconds: float, out_dir: Path,
                   native: bool = False) -> dict[str, Any]:
    """py-spy on accord's leader while ``spec`` runs; the top 10 self-time functions."""
    if py_spy() is None:
        return {"error": "py-spy not installed"}
    leader = c.leader()
    out = out_dir / f"accord-{spec.workload}{spec.concurrency}.raw"
    prof = record(leader.pid, seconds, out, native=native)
    time.sleep(0.5)
    lg.run(spec)
    prof.wait(seconds + 30)
    if not out.exists():
        return {"error": "py-spy wrote nothing (ptrace not permitted?)"}
    total, top = hot_spots(out)
    _, incl = hot_spots(out, 25, inclusive_of="accord/")
    incl = [(f, p) for f, p in incl if p < 95.0][:15]  # drop main() and its callers: always on the stack
    return {"samples": total, "top": [[f, round(p, 2)] for f, p in top],
            "accord_inclusive": [[f, round(p, 2)] for f, p in incl]}


def work_per_op(c: Cluster, before: dict[str, float], after: dict[str, float], user: float,
                system: float, ops: int) -> dict[str, float]:
    """What accord did per operation of a cell, from its counters before and after the
    run (the cell's setup included, which the cells measured here keep small): CPU of
    all members (us; and of it, the time in the kernel), Raft entries applied by each
    member, Raft messages sent and WAL writes of all members, cross-shard Txn retries."""
    if not before or ops <= 0:
        return {}
    out = {"cpu_us": (user + system) * 1e6 / ops, "sys_us": system * 1e6 / ops}
    for name, key in WORK_COUNTERS:
        delta = after.get(name, 0.0) - before.get(name, 0.0)
        out[key] = delta / ops / (len(c.members) if key == "entries" else 1)
    return out


def fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the side-by-side benchmark; print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell (default 5)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--workers", type=int, default=3, help="load generator processes (default 3)")
    p.add_argument("--cells", default=DEFAULT_CELLS, help="workload:concurrency,... "
                   "(watch:N = N watchers; lease:N = N keepalive streams)")
    p.add_argument("--leases", type=int, default=10_000, help="leases kept alive (default 10000)")
    p.add_argument("--watch-rate", type=float, default=10.0, help="watch writer puts/s (default 10)")
    p.add_argument("--floor-links", choices=("udp", "tcp"), default="udp",
                   help="how the quorum floor's servers talk (default udp, the cheapest)")
    p.add_argument("--mem-keys", type=int, default=50_000, help="keys loaded for memory (0: skip)")
    p.add_argument("--profile", type=float, default=0.0, help="py-spy accord for S seconds (0: off)")
    p.add_argument("--profile-cell", default="put:256", help="the cell to profile (default put:256)")
    p.add_argument("--native", action="store_true", help="profile C frames too (py-spy --native)")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument("--tls", action="store_true",
                   help="also run --tls-cells on an etcd and an accord under mutual TLS")
    p.add_argument("--tls-cells", default=TLS_CELLS,
                   help=f"cells run under TLS with --tls (default {TLS_CELLS})")
    p.add_argument("--auth", action="store_true",
                   help="also run --auth-cells on an etcd and an accord with auth on "
                        "(and, with --tls, on a pair under mutual TLS with auth on)")
    p.add_argument("--auth-cells", default=AUTH_CELLS,
                   help=f"cells run with auth on with --auth (default {AUTH_CELLS})")
    p.add_argument("--accord-args", default="",
                   help="extra flags for every accord serve, e.g. \"--shards 1 --gossip-listen off\"")
    args = p.parse_args(argv)
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    tls_cells = [c.strip() for c in args.tls_cells.split(",") if c.strip()] if args.tls else []
    cells += [c for c in tls_cells if c not in cells]
    auth_cells = [c.strip() for c in args.auth_cells.split(",") if c.strip()] if args.auth else []
    cells += [c for c in auth_cells if c not in cells]
    for cell in cells:  # validate the cells before starting anything
        try:
            spec_for(cell, ["x"], args, "etcd", 0)
        except ValueError as err:
            p.error(f"bad cell {cell!r} (want workload:number): {err}")
    if args.reps < 1 or args.duration <= 0:
        p.error("--reps must be >= 1 and --duration > 0")

    started = time.time()
    results: dict[tuple[str, str], list[Result]] = {}
    work: dict[str, list[dict[str, float]]] = {}
    names = tuple(n for n, _k in WORK_COUNTERS)
    out: dict[str, Any] = {"bench": "kv", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "machine": machine(), "duration_s": args.duration, "reps": args.reps,
                           "workers": args.workers}
    with Harness(keep=args.keep) as h, LoadGen(args.workers) as lg:
        systems: dict[str, Cluster] = {"etcd": h.etcd(), "accord": h.accord(extra=tuple(args.accord_args.split())),
                                       "null": h.null()}
        if any(cell.startswith("watch") for cell in cells):
            systems["null fan-out"] = h.null_fanout()
        if FLOOR_CELLS.intersection(cells):
            systems["floor"] = h.null_quorum(args.floor_links)
        if tls_cells:
            systems["etcd tls"] = h.etcd(tls=True)
            systems["accord tls"] = h.accord(extra=tuple(args.accord_args.split()), tls=True)
        tokens: dict[str, str] = {}
        if auth_cells:
            (h.root / "auth").mkdir()
            pairs = [("", False), (" tls", True)] if args.tls else [("", False)]
            for suffix, tls in pairs:
                pair: dict[str, Cluster] = {
                    f"etcd{suffix} auth": EtcdCluster(h.root / "auth", tls=tls),
                    f"accord{suffix} auth": AccordCluster(
                        h.root / "auth", extra=tuple(args.accord_args.split()), tls=tls)}
                for name, sys_ in pair.items():
                    h.add(sys_)
                    systems[name] = sys_
                    tokens[name] = enable_auth(sys_)
        for rep in range(args.reps):
            for i, cell in enumerate(cells):
                order = ["etcd", "accord", "null", "floor", *TLS_SYSTEMS, *AUTH_SYSTEMS]
                if (rep + i) % 2:
                    order.reverse()
                for name in order:
                    if name == "null" and cell.partition(":")[0] not in NULL_WORKLOADS:
                        continue
                    if name == "floor" and cell not in FLOOR_CELLS:
                        continue
                    if name in TLS_SYSTEMS and cell not in tls_cells:
                        continue
                    if name in AUTH_SYSTEMS and (name not in systems or cell not in auth_cells):
                        continue
                    c = systems["null fan-out" if name == "null" and cell.startswith("watch") else name]
                    spec = spec_for(cell, ordered_endpoints(c), args, name, rep)
                    spec.tls = tls_files(c)
                    spec.token = tokens.get(name, "")
                    counted = c if name == "accord" and isinstance(c, AccordCluster) else None
                    before = counted.counters(names) if counted else {}
                    cpu0 = [cpu_times(p) for p in c.pids] if counted else []
                    r = lg.run(spec)
                    if counted:
                        cpu1 = [cpu_times(p) for p in c.pids]
                        user = sum(b[0] - a[0] for a, b in zip(cpu0, cpu1, strict=True))
                        system = sum(b[1] - a[1] for a, b in zip(cpu0, cpu1, strict=True))
                        w = work_per_op(c, before, counted.counters(names), user, system,
                                        r.ops)
                        if w:
                            work.setdefault(cell, []).append(w)
                    results.setdefault((cell, name), []).append(r)
                    print(f"  round {rep + 1} {cell:<10} {name:<15} {r.ops_s:9.0f} ops/s "
                          f"p50 {fmt(r.p50_ms)} p99 {fmt(r.p99_ms)} ms errors {r.errors}",
                          file=sys.stderr, flush=True)
        prof: dict[str, Any] = {}
        if args.profile > 0:
            a = systems["accord"]
            spec = spec_for(args.profile_cell, ordered_endpoints(a), args, "accord", args.reps)
            spec.duration = args.profile + 1.0
            prof = profile_accord(lg, a, spec, args.profile, h.root, args.native)
            print(f"profile of {args.profile_cell} written to {h.root}; --keep keeps it",
                  file=sys.stderr)
        for c in systems.values():
            c.stop()
        memory: dict[str, dict[str, float]] = {}
        if args.mem_keys > 0:  # on fresh clusters: the rounds above leave history and garbage
            fresh: dict[str, Cluster] = {"etcd": EtcdCluster(h.root / "mem"),
                                         "accord": AccordCluster(h.root / "mem",
                                                                extra=tuple(args.accord_args.split()))}
            for name, c in fresh.items():
                h.add(c)
                memory[name] = measure_memory(lg, c, args.mem_keys, 256)
                c.stop()

    table: dict[str, Any] = {}
    print(f"\naccord vs etcd 3.4.23 (3 members each, fsync on) and the do-nothing front end; "
          f"medians of {args.reps} interleaved rounds of {args.duration:g}s")
    print(f"machine: {out['machine']}  ({time.time() - started:.0f}s)")
    hdr = (f"{'cell':<11}{'etcd ops/s':>11}{'p99 ms':>8}{'accord ops/s':>13}{'p99 ms':>8}"
           f"{'null ops/s':>11}{'tput a/e':>9}{'p99 a/e':>8}{'a/null':>7}")
    print(hdr)
    print("-" * len(hdr))
    ratios: dict[str, float] = {}
    for cell in cells:
        row: dict[str, Any] = {}
        for name in ("etcd", "accord", "null", "floor", *TLS_SYSTEMS, *AUTH_SYSTEMS):
            rs = results.get((cell, name))
            if rs:
                row[name] = {"ops_s": median([r.ops_s for r in rs]),
                             "p50_ms": median([r.p50_ms for r in rs]),
                             "p99_ms": median([r.p99_ms for r in rs]),
                             "errors": sum(r.errors for r in rs)}
        e, a, n = row.get("etcd", {}), row.get("accord", {}), row.get("null", {})
        nan = float("nan")
        t_ratio = a.get("ops_s", nan) / e["ops_s"] if e.get("ops_s") else nan
        p_ratio = a.get("p99_ms", nan) / e["p99_ms"] if e.get("p99_ms") else nan
        n_ratio = a.get("ops_s", nan) / n["ops_s"] if n.get("ops_s") else nan
        ratios[f"{cell}/throughput"] = round(t_ratio, 3)
        ratios[f"{cell}/p99"] = round(p_ratio, 3)
        if n and cell.startswith("watch"):  # the floor's delivery latency, not its rate
            n_ratio = nan
            ratios[f"{cell}/null_p99"] = round(n["p99_ms"] / e["p99_ms"], 3) if e.get("p99_ms") else nan
            ratios[f"{cell}/p99_of_null"] = round(a.get("p99_ms", nan) / n["p99_ms"], 3)
        elif n:
            ratios[f"{cell}/of_null"] = round(n_ratio, 3)
        f = row.get("floor")
        if f and e.get("ops_s"):
            ratios[f"{cell}/floor_vs_etcd"] = round(f["ops_s"] / e["ops_s"], 3)
            ratios[f"{cell}/of_floor"] = round(a.get("ops_s", nan) / f["ops_s"], 3)
        row["ratios"] = {"throughput": t_ratio, "p99": p_ratio, "of_null": n_ratio}
        table[cell] = row
        print(f"{cell:<11}{fmt(e.get('ops_s', nan), 0):>11}{fmt(e.get('p99_ms', nan)):>8}"
              f"{fmt(a.get('ops_s', nan), 0):>13}{fmt(a.get('p99_ms', nan)):>8}"
              f"{fmt(n.get('ops_s', nan), 0):>11}{fmt(t_ratio):>9}{fmt(p_ratio):>8}"
              f"{fmt(n_ratio):>7}")
    print("(watch: ops/s = events delivered/s, p99 = delivery latency; lease: keepalives/s)")
    if work:
        print("\naccord's work per operation (medians; CPU of all members and the kernel's "
              "part of it, messages and WAL writes of all members, entries of each):")
        print(f"{'cell':<11}{'CPU us':>9}{'of it sys':>10}{'entries':>9}{'raft msgs':>11}"
              f"{'WAL writes':>12}{'xtxn retries':>14}")
        for cell in cells:
            if cell not in work:
                continue
            w = {k: median([x[k] for x in work[cell]]) for k in work[cell][0]}
            table[cell].setdefault("accord", {})["work"] = w
            print(f"{cell:<11}{w['cpu_us']:>9.0f}{w['sys_us']:>10.0f}{w['entries']:>9.2f}"
                  f"{w['raft_msgs']:>11.2f}{w['wal_writes']:>12.2f}{w['xtxn_retries']:>14.3f}")
    for cell in cells:
        f = table[cell].get("floor")
        if f:
            print(f"{cell}: do-nothing quorum (3 servers: a Put durable on 2 of 3 through a "
                  f"writer thread each, a get confirmed by a quorum round, "
                  f"{args.floor_links.upper()}, nothing else): "
                  f"{fmt(f['ops_s'], 0)} ops/s, p99 {fmt(f['p99_ms'])} ms = "
                  f"{fmt(ratios[f'{cell}/floor_vs_etcd'])}x etcd; accord "
                  f"{fmt(ratios[f'{cell}/of_floor'])}x the quorum floor")
        n = table[cell].get("null")
        if cell.startswith("watch") and n:
            print(f"{cell}: do-nothing fan-out (3 servers passing each Put's event on, no "
                  f"consensus, no store): p99 {fmt(n['p99_ms'])} ms = "
                  f"{fmt(ratios.get(f'{cell}/null_p99', float('nan')))}x etcd's; accord "
                  f"{fmt(ratios.get(f'{cell}/p99_of_null', float('nan')))}x the do-nothing")
    if tls_cells:
        print("\nmutual TLS on every port (client and peer), same cells, same rounds:")
        print(f"{'cell':<11}{'etcd tls':>10}{'/etcd':>7}{'accord tls':>12}{'/accord':>8}"
              f"{'p99 ms':>8}{'a/e tls':>8}{'p99 a/e':>8}")
        for cell in tls_cells:
            row = table[cell]
            e, a = row.get("etcd", {}), row.get("accord", {})
            et, at = row.get("etcd tls", {}), row.get("accord tls", {})
            tls_r = {"etcd_tls/etcd": ratio_of(et, e), "accord_tls/accord": ratio_of(at, a),
                     "accord_tls/etcd_tls": ratio_of(at, et),
                     "accord_tls/etcd_tls_p99": ratio_of(at, et, "p99_ms")}
            for k, v in tls_r.items():
                ratios[f"{cell}/{k}"] = round(v, 3)
            nan = float("nan")
            print(f"{cell:<11}{fmt(et.get('ops_s', nan), 0):>10}{fmt(tls_r['etcd_tls/etcd']):>7}"
                  f"{fmt(at.get('ops_s', nan), 0):>12}{fmt(tls_r['accord_tls/accord']):>8}"
                  f"{fmt(at.get('p99_ms', nan)):>8}{fmt(tls_r['accord_tls/etcd_tls']):>8}"
                  f"{fmt(tls_r['accord_tls/etcd_tls_p99']):>8}")
    for suffix, what in (("", "auth on (simple tokens)"),
                         (" tls", "mutual TLS on every port and auth on")):
        print_auth_table(auth_cells, table, ratios, suffix, what)
    if memory:
        print(f"\nmemory, {args.mem_keys} keys of 256 B loaded (extrapolated linearly to 1M):")
        for name, m in memory.items():
            print(f"  {name:<7} RSS {m['rss_before_mib']:.0f} -> {m['rss_after_mib']:.0f} MiB, "
                  f"{m['mib_per_million']:.0f} MiB per million keys, load {m['load_ops_s']:.0f} keys/s")
        if memory["etcd"]["mib_per_million"] > 0:
            ratios["memory_per_key"] = round(memory["accord"]["mib_per_million"]
                                             / memory["etcd"]["mib_per_million"], 3)
    for key, per_round in cross_shard_ratios(results).items():
        if per_round:
            ratios[key] = round(median(per_round), 3)
            print(f"accord p50 {key.removesuffix('/p50')}: "
                  f"{', '.join(f'{r:.2f}' for r in per_round)} by round, median "
                  f"{ratios[key]:.2f}")
    goals = check_goals(ratios)
    print("\ngoals this run can judge:" if goals else "\nno goal's cells ran")
    for g, ok in goals.items():
        print(f"  {'met   ' if ok else 'MISSED'} {g}")
    if prof:
        print(f"\npy-spy, accord leader under {args.profile_cell} ({prof.get('samples', 0)} samples), self time:")
        for f, pct in prof.get("top", []):
            print(f"  {pct:5.1f}%  {f}")
        if prof.get("accord_inclusive"):
            print("  inclusive, accord functions:")
            for f, pct in prof["accord_inclusive"]:
                print(f"  {pct:5.1f}%  {f}")
        if "error" in prof:
            print(f"  {prof['error']}")
    out.update({"cells": table, "memory": memory, "ratios": ratios, "goals": goals,
                "profile": prof, "wall_s": round(time.time() - started)})
    print(json.dumps(clean(out), allow_nan=False))
    return 0


def print_auth_table(cells: list[str], table: dict[str, Any], ratios: dict[str, float],
                     suffix: str, what: str) -> None:
    """The auth cells of the ``etcd<suffix> auth`` / ``accord<suffix> auth`` pair: each as
    a ratio to the same system without auth (plain, or TLS for the TLS pair) and accord's
    to etcd's with the same settings."""
    e_name, a_name = f"etcd{suffix} auth", f"accord{suffix} auth"
    rows = [cell for cell in cells if a_name in table[cell]]
    if not rows:
        return
    e_base, a_base = f"etcd{suffix}".strip(), f"accord{suffix}".strip()
    print(f"\n{what}, same cells, same rounds ({e_base}/{a_base}: the same without auth):")
    hdr = (f"{'cell':<11}{e_name:>15}{'/' + e_base:>10}{a_name:>17}{'/' + a_base:>12}"
           f"{'p99 ms':>8}{'a/e':>7}{'p99 a/e':>8}")
    print(hdr)
    nan = float("nan")
    tag = f"{suffix.strip()}_auth".lstrip("_")
    for cell in rows:
        row = table[cell]
        ev, av = row.get(e_name, {}), row[a_name]
        e, a = row.get(e_base, {}), row.get(a_base, {})
        r = {f"etcd_{tag}/{e_base.replace(' ', '_')}": ratio_of(ev, e),
             f"accord_{tag}/{a_base.replace(' ', '_')}": ratio_of(av, a),
             f"accord_{tag}/etcd_{tag}": ratio_of(av, ev),
             f"accord_{tag}/etcd_{tag}_p99": ratio_of(av, ev, "p99_ms")}
        for k, v in r.items():
            ratios[f"{cell}/{k}"] = round(v, 3)
        q = list(r.values())
        print(f"{cell:<11}{fmt(ev.get('ops_s', nan), 0):>15}{fmt(q[0]):>10}"
              f"{fmt(av.get('ops_s', nan), 0):>17}{fmt(q[1]):>12}{fmt(av.get('p99_ms', nan)):>8}"
              f"{fmt(q[2]):>7}{fmt(q[3]):>8}")


def ratio_of(x: dict[str, float], y: dict[str, float], key: str = "ops_s") -> float:
    """``x[key] / y[key]``, NaN when either is missing."""
    nan = float("nan")
    return x.get(key, nan) / y[key] if y.get(key) else nan


GOALS = (
    ("put:1 throughput >= 1.0x etcd", "put:1/throughput", 1.0, None),
    ("put:1 p99 <= etcd", "put:1/p99", None, 1.0),
    ("get:1 throughput >= 1.0x etcd", "get:1/throughput", 1.0, None),
    ("get:1 p99 <= etcd", "get:1/p99", None, 1.0),
    ("put:256 >= 0.9x do-nothing", "put:256/of_null", 0.9, None),
    ("get:256 >= 0.9x do-nothing", "get:256/of_null", 0.9, None),
    ("watch delivery p99 <= etcd", "watch:1000/p99", None, 1.0),
    ("memory per key <= etcd", "memory_per_key", None, 1.0),
    ("cross-shard txn2:16 p50 <= 2x one-shard txn:16 p50", "txn2:16/txn:16/p50", None, 2.0),
)
"""The issues' goals: (what, the ratio it reads, its floor, its ceiling)."""

CROSS_SHARD_PAIRS = (("txn2:16", "txn:16"), ("txn2:256", "txn:256"))
"""Cells whose accord p50 latencies are compared round by round (a cross-shard Txn
against a one-shard one, in the same round)."""


def check_goals(ratios: dict[str, float]) -> dict[str, bool]:
    """The goals this run can judge (their cells ran), each met or not."""
    out = {}
    for what, key, low, high in GOALS:
        v = ratios.get(key, float("nan"))
        if v != v:
            continue
        out[what] = (low is None or v >= low) and (high is None or v <= high)
    return out


def cross_shard_ratios(results: dict[tuple[str, str], list[Any]]) -> dict[str, list[float]]:
    """Per pair of :data:`CROSS_SHARD_PAIRS` that ran: accord's p50 ratio in each round."""
    out = {}
    for two, one in CROSS_SHARD_PAIRS:
        a2, a1 = results.get((two, "accord")), results.get((one, "accord"))
        if a2 and a1:
            out[f"{two}/{one}/p50"] = [x.p50_ms / y.p50_ms for x, y in zip(a2, a1, strict=False)
                                       if y.p50_ms > 0]
    return out


def clean(o: Any) -> Any:
    """``o`` with NaN and infinities as None, so the JSON line is strict JSON."""
    if isinstance(o, float):
        return o if o == o and abs(o) != float("inf") else None
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [clean(v) for v in o]
    return o


if __name__ == "__main__":
    sys.exit(main())
