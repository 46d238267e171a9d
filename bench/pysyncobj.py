"""Write throughput: a 3-node PySyncObj cluster versus a 3-node accord cluster (issue #9).

PySyncObj (PyPI ``pysyncobj``) is the most used Raft library in Python. Each of its
clusters here is three processes on 127.0.0.1, each a ``SyncObj`` holding a replicated
dict (``batteries.ReplDict``), with an in-memory log and no journal file, so no fsync at
all. Two variants run side by side, so PySyncObj is shown at its best: ``psync`` (its
defaults: commands are batched and sent every ``appendEntriesPeriod``, 0.1 s) and
``psync-nb`` (``appendEntriesUseBatch=False``: each command sent at once). Every write
is an in-process call on the leader, ``d.set(key, value)``: with 1 writer, ``sync=True``
calls back to back; with N writers, N calls kept in flight with ``callback=`` (each
completion issues the next), as PySyncObj's own benchmarks do.

accord is three real ``accord serve`` daemons (``bench.harness.AccordCluster``, default
shards; accord fsyncs every batch of log entries it appends), driven from this process
through accord's own client, ``accord.client.AccordClient`` (one client, so one gRPC
channel, leader first). ``accord`` cells: N tasks each looping ``await client.put``, so
N puts are in flight over one HTTP/2 channel and the server batches what arrives
together into one proposal and one fsync. The client has no batch-put call; the
``accord-txn`` cells send ``client.txn`` requests of ``--txn-batch`` puts each (keys of
one writer share a partition key, so one Txn stays in one shard): K writes per request,
which is what a batching client API would send.

Both sides write 256-byte values over ``--keys`` distinct keys. Each cell warms up for
``--warmup`` seconds, then counts acknowledged writes for ``--duration`` seconds; every
round runs every cell (order reversed every other round); the table shows medians and
accord against the better PySyncObj variant. Usage::

    .venv/bin/pip install pysyncobj         # bench-only requirement
    .venv/bin/python bench/pysyncobj.py     # --writers 1,256,8192 --duration 5 --reps 3

The last line of output is one JSON object with every figure and the ratios.
(``--node`` is internal: it runs one PySyncObj member, driven over stdin/stdout.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the real ``pysyncobj`` package: drop it, and put the repository there instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import HOST, AccordCluster, Harness, free_ports, machine  # noqa: E402

VALUE_SIZE = 256
REPLY_TIMEOUT_S = 60.0


# --- one PySyncObj member (runs in its own process) ---------------------------------------
def _load_pysyncobj() -> tuple[Any, Any, Any, Any]:
    try:
        from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
        from pysyncobj.batteries import ReplDict
    except ImportError as e:  # a bench-only requirement, not a dependency of accord
        raise SystemExit(
            f"pysyncobj is not installed ({e}): run `.venv/bin/pip install pysyncobj`"
        ) from None
    return FAIL_REASON, SyncObj, SyncObjConf, ReplDict


def _sync_writes(d: Any, keys: int, value: bytes, warmup: float, duration: float) -> dict[str, Any]:
    """One writer: blocking ``set(..., sync=True)`` calls back to back."""
    ok = errors = i = ok0 = 0
    now = time.monotonic()
    t0 = now + warmup
    t_end = t0 + duration
    counted = False
    while now < t_end:
        try:
            d.set(f"k{i % keys}", value, sync=True, timeout=10.0)
            ok += 1
        except Exception:  # pysyncobj raises SyncObjException on failure or timeout
            errors += 1
        i += 1
        now = time.monotonic()
        if not counted and now >= t0:
            counted, ok0, t0 = True, ok, now
    return {"writes": ok - ok0, "seconds": now - t0, "errors": errors}


def _callback_writes(
    d: Any, ok_code: int, inflight: int, keys: int, value: bytes, warmup: float, duration: float
) -> dict[str, Any]:
    """N writers: N ``set(..., callback=cb)`` calls in flight, each completion issues the next."""
    st = {"ok": 0, "errors": 0, "issued": 0, "outstanding": 0}
    stop = threading.Event()
    drained = threading.Event()

    def issue() -> None:
        st["issued"] += 1
        d.set(f"k{st['issued'] % keys}", value, callback=cb)

    def cb(_res: object, err: int) -> None:  # runs in PySyncObj's tick thread
        if err == ok_code:
            st["ok"] += 1
        else:
            st["errors"] += 1
        # A failed slot retires rather than retrying: PySyncObj reports some failures
        # (queue full, not the leader) synchronously, and retrying would recurse.
        if stop.is_set() or err != ok_code:
            st["outstanding"] -= 1
            if st["outstanding"] <= 0:
                drained.set()
        else:
            issue()

    st["outstanding"] = inflight
    for _ in range(inflight):
        issue()
    time.sleep(warmup)
    c0, t0 = st["ok"], time.monotonic()
    time.sleep(duration)
    c1, t1 = st["ok"], time.monotonic()
    stop.set()
    drained.wait(15.0)
    return {"writes": c1 - c0, "seconds": t1 - t0, "errors": st["errors"]}


def node_main(self_addr: str, partners: list[str], conf: dict[str, Any]) -> int:
    """One PySyncObj member: answers ``status``, ``run W WARMUP DURATION KEYS`` and ``quit``."""
    fail_reason, sync_obj, conf_cls, repl_dict = _load_pysyncobj()
    d = repl_dict()
    obj = sync_obj(self_addr, partners, consumers=[d], conf=conf_cls(**conf))
    value = os.urandom(VALUE_SIZE)
    out = sys.stdout
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "quit":
                break
            st = obj.getStatus()
            leader = st["state"] == 2 and obj.isReady()
            if cmd[0] == "status":
                reply: dict[str, Any] = {"leader": leader, "ready": obj.isReady(),
                                         "has_quorum": st["has_quorum"]}
            elif cmd[0] == "run":
                writers, warmup, duration, keys = int(cmd[1]), float(cmd[2]), float(cmd[3]), int(cmd[4])
                if not leader:
                    reply = {"skipped": "not the leader"}
                elif writers == 1:
                    reply = _sync_writes(d, keys, value, warmup, duration)
                else:
                    reply = _callback_writes(d, fail_reason.SUCCESS, writers, keys, value,
                                             warmup, duration)
            else:
                reply = {"error": f"unknown command {cmd[0]!r}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        obj.destroy()
    return 0


# --- the PySyncObj cluster, seen from the benchmark process -------------------------------
def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the benchmark process dies (Linux prctl)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class PySyncObjCluster:
    """Three ``--node`` processes on free ports; every one ended by PID in :meth:`stop`."""

    root: Path
    conf: dict[str, Any] = field(default_factory=dict)
    n: int = 3
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, timeout: float = 30.0) -> None:
        addrs = [f"{HOST}:{p}" for p in free_ports(self.n)]
        for i, addr in enumerate(addrs):
            partners = ",".join(a for a in addrs if a != addr)
            log = open(self.root / f"pysyncobj{i + 1}.log", "w")  # the child owns it
            self.procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--node", addr, partners,
                 json.dumps(self.conf)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                preexec_fn=_die_with_parent,
            ))
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(s.get("leader") for s in self.ask_all("status")):
                return
            time.sleep(0.2)
        raise RuntimeError(f"PySyncObj cluster elected no ready leader in {timeout}s")

    def _ask(self, proc: subprocess.Popen[str], cmd: str, timeout: float) -> dict[str, Any]:
        if proc.poll() is not None:
            raise RuntimeError(f"PySyncObj node {proc.pid} exited with {proc.returncode}")
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        return _read_reply(proc.stdout, timeout)

    def ask_all(self, cmd: str, timeout: float = REPLY_TIMEOUT_S) -> list[dict[str, Any]]:
        """Send ``cmd`` to every node, return the replies (nodes answer one at a time)."""
        return [self._ask(p, cmd, timeout) for p in self.procs]

    def run(self, writers: int, warmup: float, duration: float, keys: int) -> dict[str, Any]:
        """The leader's figures for one cell."""
        for _ in range(3):  # a leader change between status and run: ask again
            for p in self.procs:
                st = self._ask(p, "status", REPLY_TIMEOUT_S)
                if st.get("leader"):
                    r = self._ask(p, f"run {writers} {warmup} {duration} {keys}",
                                  warmup + duration + REPLY_TIMEOUT_S)
                    if "writes" in r:
                        return r
            time.sleep(0.5)
        raise RuntimeError("no PySyncObj leader would run the cell")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    assert p.stdin is not None
                    p.stdin.write("quit\n")
                    p.stdin.flush()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs.clear()


def _read_reply(stream: IO[str], timeout: float) -> dict[str, Any]:
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise RuntimeError(f"PySyncObj node did not answer in {timeout}s")
    line = stream.readline()
    if not line:
        raise RuntimeError("PySyncObj node closed its output")
    reply: dict[str, Any] = json.loads(line)
    return reply


# --- accord through its own client ---------------------------------------------------------
async def _window(
    writer: Any, writers: int, warmup: float, duration: float, st: dict[str, int],
    stop: asyncio.Event,
) -> tuple[int, int, float, float]:
    """Run ``writers`` copies of ``writer(w)``; writes counted and times over the window."""
    tasks = [asyncio.create_task(writer(w)) for w in range(writers)]
    try:
        await asyncio.sleep(warmup)
        c0, t0 = st["ok"], time.monotonic()
        await asyncio.sleep(duration)
        c1, t1 = st["ok"], time.monotonic()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30.0)
    return c0, c1, t0, t1


async def accord_cell(
    endpoints: list[str], writers: int, warmup: float, duration: float, keys: int, txn_batch: int
) -> dict[str, Any]:
    """``writers`` tasks looping puts (or ``txn_batch`` puts per Txn) over one AccordClient."""
    from accord.client import AccordClient
    from accord.proto import rpc_pb2

    value = os.urandom(VALUE_SIZE)
    per_writer = max(txn_batch, 1, keys // writers)  # no key twice in one Txn
    st = {"ok": 0, "errors": 0}
    first_error: list[str] = []
    stop = asyncio.Event()

    async with AccordClient(endpoints, call_timeout_s=10.0) as client:
        async def writer(w: int) -> None:
            # Writer w's keys share a partition key, so a Txn of them stays in one shard.
            prefix, i = f"/bench/w{w}/", 0
            while not stop.is_set():
                try:
                    if txn_batch > 1:
                        ops = [rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(
                            key=f"{prefix}{(i + j) % per_writer}".encode(), value=value))
                            for j in range(txn_batch)]
                        await client.txn_raw(rpc_pb2.TxnRequest(success=ops))
                        st["ok"] += txn_batch
                        i += txn_batch
                    else:
                        await client.put(f"{prefix}{i % per_writer}", value)
                        st["ok"] += 1
                        i += 1
                except Exception as e:  # counted, not fatal: the table shows errors
                    st["errors"] += 1
                    if not first_error:
                        first_error.append(repr(e)[:300])

        c0, c1, t0, t1 = await _window(writer, writers, warmup, duration, st, stop)
    return {"writes": c1 - c0, "seconds": t1 - t0, "errors": st["errors"],
            "first_error": first_error[0] if first_error else ""}


async def accord_batch_cell(
    endpoints: list[str], writers: int, warmup: float, duration: float, keys: int,
    max_ops: int, partitions: int, bulk: int = 0,
) -> dict[str, Any]:
    """``writers`` tasks looping ``PutBatcher.put`` (accord's batching client API): the
    puts in flight are coalesced into Txns of up to ``max_ops`` puts per partition."""
    from accord.client import AccordClient

    value = os.urandom(VALUE_SIZE)
    per_writer = max(1, keys // writers, bulk)
    st = {"ok": 0, "errors": 0}
    first_error: list[str] = []
    stop = asyncio.Event()

    async with AccordClient(endpoints, call_timeout_s=10.0) as client:
        batcher = client.batcher(max_ops=max_ops)

        async def writer(w: int) -> None:
            prefix, i = f"/bench/p{w % partitions}/w{w}-", 0
            while not stop.is_set():
                try:
                    if bulk:
                        # put_many: one call hands over ``bulk`` writes spread over the
                        # partitions (no task per write on the client).
                        items = [(f"/bench/p{(i + j) % partitions}/w{w}-{(i + j) % per_writer}",
                                  value) for j in range(bulk)]
                        await batcher.put_many(items)
                        st["ok"] += bulk
                        i += bulk
                        continue
                    await batcher.put(f"{prefix}{i % per_writer}", value)
                    st["ok"] += 1
                    i += 1
                except Exception as e:  # counted, not fatal: the table shows errors
                    st["errors"] += 1
                    if not first_error:
                        first_error.append(repr(e)[:300])

        c0, c1, t0, t1 = await _window(writer, writers, warmup, duration, st, stop)
    return {"writes": c1 - c0, "seconds": t1 - t0, "errors": st["errors"],
            "first_error": first_error[0] if first_error else "", "batches": batcher.batches}


# --- the benchmark --------------------------------------------------------------------------
PSYNC_VARIANTS: dict[str, dict[str, Any]] = {
    "psync": {},  # PySyncObj's defaults: commands batched, sent every appendEntriesPeriod
    "psync-nb": {"appendEntriesUseBatch": False},  # every command sent at once
}


def _rate(r: dict[str, Any]) -> float:
    return float(r["writes"]) / float(r["seconds"]) if r["seconds"] > 0 else 0.0


def _levels(p: argparse.ArgumentParser, text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"{what} must be comma-separated integers, got {text!r}")
    if any(x < 1 for x in out):
        p.error(f"{what} must all be >= 1, got {text!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print the table and, last, one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writers", default="1,256,8192",
                   help="concurrent writers per cell, comma-separated (default 1,256,8192)")
    p.add_argument("--duration", type=float, default=5.0, help="counted seconds per cell (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds per cell (default 1)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys written (default 10000)")
    p.add_argument("--txn-batch", type=int, default=64,
                   help="puts per accord Txn in the batched cells (default 64; 0: no such cells)")
    p.add_argument("--txn-writers", default="1,32",
                   help="concurrent Txn writers of the batched accord cells (default 1,32)")
    p.add_argument("--batch-writers", default="1024,4096",
                   help="concurrent writers of the accord-batch cells, through the batching "
                        "client API PutBatcher (default 1024,4096; empty: no such cells)")
    p.add_argument("--bulk-writers", default="8",
                   help="concurrent writers of the accord-bulk cells, each looping "
                        "PutBatcher.put_many of --bulk-items writes (default 8; empty: none)")
    p.add_argument("--bulk-items", type=int, default=2048, help="writes per put_many (default 2048)")
    p.add_argument("--batch-ops", type=int, default=128,
                   help="most puts per batch (default 128, the Txn op limit)")
    p.add_argument("--partitions", type=int, default=8,
                   help="partition keys the batch writers' keys spread over (default 8)")
    p.add_argument("--node", nargs=3, metavar=("SELF", "PARTNERS", "CONF"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.node:
        return node_main(args.node[0], [a for a in args.node[1].split(",") if a],
                         json.loads(args.node[2]))
    levels = _levels(p, args.writers, "--writers")
    txn_levels = _levels(p, args.txn_writers, "--txn-writers") if args.txn_batch > 1 else []
    batch_levels = _levels(p, args.batch_writers, "--batch-writers")
    bulk_levels = _levels(p, args.bulk_writers, "--bulk-writers")
    if not levels or args.reps < 1 or args.duration <= 0 or args.warmup < 0 or args.keys < 1 \
            or args.txn_batch < 0:
        p.error("--writers non-empty, --reps >= 1, --duration > 0, --warmup >= 0, --keys >= 1, "
                "--txn-batch >= 0")
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    started = time.time()
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with Harness() as h:
        psyncs = {name: PySyncObjCluster(h.root / name, conf) for name, conf in PSYNC_VARIANTS.items()}
        try:
            for c in psyncs.values():
                c.root.mkdir(parents=True, exist_ok=True)
                c.start()
            cluster = h.add(AccordCluster(h.root))
            lead = cluster.leader().endpoint
            eps = [lead, *(e for e in cluster.endpoints if e != lead)]
            for rep in range(args.reps):
                todo = [(s, w, 0) for w in levels for s in [*psyncs, "accord"]]
                todo += [("accord-txn", w, args.txn_batch) for w in txn_levels]
                todo += [("accord-batch", w, args.batch_ops) for w in batch_levels]
                todo += [("accord-bulk", w, args.batch_ops) for w in bulk_levels]
                if rep % 2:
                    todo.reverse()
                for system, wr, batch in todo:
                    if system in psyncs:
                        r = psyncs[system].run(wr, args.warmup, args.duration, args.keys)
                    elif system in ("accord-batch", "accord-bulk"):
                        bulk = args.bulk_items if system == "accord-bulk" else 0
                        r = asyncio.run(accord_batch_cell(eps, wr, args.warmup, args.duration,
                                                          args.keys, batch, args.partitions, bulk))
                    else:
                        r = asyncio.run(accord_cell(eps, wr, args.warmup, args.duration,
                                                    args.keys, batch))
                    results.setdefault((system, wr), []).append(r)
                    print(f"  round {rep + 1} {system:<10} writers {wr:>5} {_rate(r):9.0f} writes/s "
                          f"errors {r['errors']} {r.get('first_error', '')}",
                          file=sys.stderr, flush=True)
        finally:
            for c in psyncs.values():
                c.stop()
    return report(args, levels, txn_levels, batch_levels, bulk_levels, results,
                  time.time() - started)


def report(args: argparse.Namespace, levels: list[int], txn_levels: list[int],
           batch_levels: list[int], bulk_levels: list[int], results: dict[tuple[str, int], list[dict[str, Any]]], elapsed: float) -> int:
    """Print the table of medians and the JSON line."""
    med = {k: statistics.median(_rate(r) for r in v) for k, v in results.items()}
    errs = {k: sum(int(r["errors"]) for r in v) for k, v in results.items()}
    print(f"\nwrites/s, 3 nodes each, 256 B values, {args.keys} keys; medians of {args.reps} "
          f"interleaved rounds of {args.duration:g}s (+{args.warmup:g}s warm-up)")
    print(f"machine: {machine()}  ({elapsed:.0f}s)")
    print("psync: PySyncObj defaults; psync-nb: appendEntriesUseBatch=False; both in-process calls "
          "on the leader, in-memory log, no fsync.\naccord: AccordClient.put over one channel "
          "(accord-txn: AccordClient.txn of K puts), 3 daemons, fsync on.")
    print(f"{'writers':>8}{'psync':>10}{'psync-nb':>10}{'accord':>10}{'a/best psync':>14}"
          f"{'errors':>10}")
    rows: dict[str, dict[str, float]] = {}
    ratios: dict[str, float] = {}
    for w in levels:
        ps = {name: med[(name, w)] for name in PSYNC_VARIANTS}
        ac = med[("accord", w)]
        best = max(ps.values())
        ratio = ac / best if best else float("nan")
        e = sum(errs[(s, w)] for s in [*PSYNC_VARIANTS, "accord"])
        rows[f"writers{w}"] = {**{f"{k}_writes_s": round(v, 1) for k, v in ps.items()},
                               "accord_writes_s": round(ac, 1)}
        ratios[f"writers{w}"] = round(ratio, 3)
        print(f"{w:>8}{ps['psync']:>10.0f}{ps['psync-nb']:>10.0f}{ac:>10.0f}{ratio:>14.2f}{e:>10}")
    best_ps = max(med[(n, w)] for n in PSYNC_VARIANTS for w in levels)
    best_put = max(med[("accord", w)] for w in levels)
    out: dict[str, Any] = {
        "bench": "pysyncobj", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(), "value_bytes": VALUE_SIZE, "reps": args.reps,
        "duration_s": args.duration, "rows": rows, "ratios_vs_best_psync_same_writers": ratios,
        "pysyncobj_best_writes_s": round(best_ps, 1), "accord_put_best_writes_s": round(best_put, 1),
        "put_ratio": round(best_put / best_ps, 3) if best_ps else None,
    }
    for w in txn_levels:
        tx = med[("accord-txn", w)]
        print(f"accord-txn: {w} writers x Txn of {args.txn_batch} puts: {tx:.0f} writes/s "
              f"(errors {errs[('accord-txn', w)]})")
        rows[f"txn{args.txn_batch}_writers{w}"] = {"accord_writes_s": round(tx, 1)}
    if txn_levels:
        best_tx = max(med[("accord-txn", w)] for w in txn_levels)
        out["accord_txn_batch"] = args.txn_batch
        out["accord_txn_best_writes_s"] = round(best_tx, 1)
        out["txn_ratio"] = round(best_tx / best_ps, 3) if best_ps else None
        print(f"best of each: PySyncObj {best_ps:.0f}; accord puts {best_put:.0f} "
              f"({best_put / best_ps:.2f}x); accord Txn batches {best_tx:.0f} "
              f"({best_tx / best_ps:.2f}x)  [issue #9 goal: >= 3x]")
    else:
        print(f"best of each: PySyncObj {best_ps:.0f}; accord puts {best_put:.0f} "
              f"({best_put / best_ps:.2f}x)  [issue #9 goal: >= 3x]")
    for w in batch_levels:
        bt = med[("accord-batch", w)]
        print(f"accord-batch: {w} writers through PutBatcher (<= {args.batch_ops} puts per "
              f"Txn, {args.partitions} partitions): {bt:.0f} writes/s "
              f"(errors {errs[('accord-batch', w)]})")
        rows[f"batch_writers{w}"] = {"accord_writes_s": round(bt, 1)}
    for w in bulk_levels:
        bk = med[("accord-bulk", w)]
        print(f"accord-bulk: {w} writers x PutBatcher.put_many of {args.bulk_items}: "
              f"{bk:.0f} writes/s (errors {errs[('accord-bulk', w)]})")
        rows[f"bulk{args.bulk_items}_writers{w}"] = {"accord_writes_s": round(bk, 1)}
    if batch_levels or bulk_levels:
        best_bt = max([med[("accord-batch", w)] for w in batch_levels]
                      + [med[("accord-bulk", w)] for w in bulk_levels])
        out["accord_batch_best_writes_s"] = round(best_bt, 1)
        out["batch_ratio"] = round(best_bt / best_ps, 3) if best_ps else None
        print(f"accord's batching client API, best: {best_bt:.0f} writes/s = "
              f"{best_bt / best_ps:.2f}x PySyncObj's best  [issue #9 goal: >= 3x]")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
