"""Micro-benchmark of the Raft core alone: CPU per replicated entry, and per codec round trip.

Three :class:`RaftCore` instances in one process, wired by an in-memory queue (no disk,
no sockets, no event loop): node 1 campaigns, then the loop proposes ``--batch`` entries
of 256 bytes at a time on the leader and pumps ``ready``/``step``/``advance`` on every
node until all three have applied them. The figure is process CPU time
(``time.process_time``) per entry, summed over the three cores, so it is what the
replication path costs in the core itself. A second cell encodes and decodes every
message the first cell sent (``accord.raft.transport.codec``), per message.

It reports whether the core it ran is compiled (a mypyc ``.so`` next to ``raft.py``) or
pure Python. To weigh a compiled core, compile a copy of the package (``mypyc
accord/raft/core/*.py ...`` in a ``git archive`` of it) and run this with
``PYTHONPATH=<that copy> python -P bench/core.py``, then once without (bench/README.md,
"mypyc", has the figures of 2026-12-02).

Usage: ``python bench/core.py [--entries 20000] [--batch 64] [--reps 5]``. Prints a table
(best of ``--reps``: the run least disturbed by the machine's other tenants); the last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH, so a pure copy given there wins

from accord.raft.core import raft as raft_module  # noqa: E402
from accord.raft.core.raft import Config, RaftCore  # noqa: E402
from accord.raft.core.types import Message, PersistentState, Role  # noqa: E402
from accord.raft.transport.codec import decode_message, encode_message  # noqa: E402

VALUE = b"v" * 256
IDS = (1, 2, 3)


def compiled() -> bool:
    """Whether the imported core is a mypyc extension rather than ``raft.py``."""
    return not str(raft_module.__file__).endswith(".py")


class Cluster:
    """Three cores and a message queue; every Ready made "durable" at once."""

    def __init__(self) -> None:
        self.cores = {i: RaftCore(Config(id=i, seed=i), PersistentState(), IDS, ())
                      for i in IDS}
        self.queue: deque[Message] = deque()
        self.applied = dict.fromkeys(IDS, 0)
        self.sent: list[Message] = []
        self.keep = False

    def pump(self) -> None:
        """Until no core has anything left to do."""
        busy = True
        while busy:
            busy = False
            while self.queue:
                m = self.queue.popleft()
                self.cores[m.to].step(m)
            for i, c in self.cores.items():
                if not c.has_ready():
                    continue
                busy = True
                rd = c.ready()
                self.queue.extend(rd.messages)
                self.queue.extend(rd.persisted_messages)
                if self.keep:
                    self.sent.extend(rd.messages)
                    self.sent.extend(rd.persisted_messages)
                self.applied[i] += len(rd.committed_entries)
                c.advance(rd)

    def elect(self) -> RaftCore:
        leader = self.cores[1]
        leader.campaign()
        self.pump()
        if leader.role != Role.LEADER:
            raise RuntimeError(f"node 1 did not become leader ({leader.role})")
        return leader


def replicate(entries: int, batch: int, keep: bool = False) -> tuple[float, list[Message]]:
    """CPU seconds to replicate and apply ``entries`` on all three cores."""
    c = Cluster()
    leader = c.elect()
    c.keep = keep
    start = dict(c.applied)
    t0 = time.process_time()
    done = 0
    while done < entries:
        n = min(batch, entries - done)
        for _ in range(n):
            leader.propose(VALUE)
        c.pump()
        done += n
    used = time.process_time() - t0
    if any(c.applied[i] - start[i] < entries for i in IDS):
        raise RuntimeError(f"not every core applied {entries} entries: {c.applied}")
    return used, c.sent


def codec_round_trips(msgs: list[Message]) -> float:
    """CPU seconds to encode and decode every message of ``msgs``."""
    t0 = time.process_time()
    for m in msgs:
        if decode_message(encode_message(m)).type != m.type:
            raise RuntimeError("codec round trip changed a message")
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=20_000, help="entries per run (default 20000)")
    p.add_argument("--batch", type=int, default=64, help="proposals per pump (default 64)")
    p.add_argument("--reps", type=int, default=5, help="runs; the best is reported (default 5)")
    args = p.parse_args(argv)
    if args.entries < 1 or args.batch < 1 or args.reps < 1:
        p.error("--entries, --batch and --reps must be >= 1")
    rep_s, codec_s, n_msgs = [], [], 0
    for _ in range(args.reps):
        used, _ = replicate(args.entries, args.batch)
        rep_s.append(used)
        _, msgs = replicate(min(args.entries, 5_000), args.batch, keep=True)
        n_msgs = len(msgs)
        codec_s.append(codec_round_trips(msgs))
    per_entry = min(rep_s) / args.entries * 1e6
    per_msg = min(codec_s) / n_msgs * 1e6 if n_msgs else float("nan")
    kind = "compiled (mypyc)" if compiled() else "pure Python"
    print(f"Raft core, 3 cores in one process, {kind}; best of {args.reps}")
    print(f"{'cell':<28}{'us':>9}")
    print(f"{'replicate, per entry':<28}{per_entry:>9.2f}   ({args.entries} entries, batch {args.batch})")
    print(f"{'codec round trip, per msg':<28}{per_msg:>9.2f}   ({n_msgs} messages)")
    print(json.dumps({"bench": "core", "compiled": compiled(), "entries": args.entries,
                      "batch": args.batch, "reps": args.reps,
                      "replicate_us_per_entry": round(per_entry, 3),
                      "codec_us_per_message": round(per_msg, 3), "messages": n_msgs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
