"""`accord nodes`: the cluster's members as SWIM sees them, and the scheduler's GPU nodes.

    accord nodes [--role gpu-agent] [--json]   # every SWIM member: role, state, address
    accord nodes watch [--count N]             # the view, then membership events as they happen
    accord nodes --gpus                        # the scheduler's GPU nodes (= accord nodes ls)
    accord nodes ls|drain|undrain|register|agent ...   # GPU node operations (see jobs.py)

Members come from ``client.membership`` (:mod:`accord.client.membership`) on the first
endpoint that answers (``--endpoints`` or ``ACCORD_ENDPOINTS``, default ``127.0.0.1:2379``): that
node's view, which SWIM keeps converged with every other node's within a few probe
intervals.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from accord.cli import common
from accord.client.membership import SwimMember

TIMEOUT = 10.0
GPU_OPS = ("ls", "drain", "undrain", "register", "agent")
"""Subcommands that operate on the scheduler's GPU nodes (``accord.cli.jobs``)."""


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _details(m: SwimMember) -> str:
    meta = m.metadata
    if m.role == "accord":
        return f"id {meta.get('id', '?')} client {meta.get('client', '-')} v{meta.get('version', '?')}"
    if m.role == "gpu-agent":
        node = meta.get("node", m.name)
        return (f"node {node}: {meta.get('gpus', '?')} GPU(s) {meta.get('models', '') or ''} "
                f"inventory {meta.get('inventory', '-')}").replace("  ", " ")
    return ",".join(f"{k}={v}" for k, v in sorted(meta.items())) or "-"


def _row(m: SwimMember) -> str:
    return (f"{m.name:<16} {m.role or '-':<10} {m.state:<8} {m.address:<22} {m.incarnation:>4} "
            f"{_age(m.state_age):>5}  {_details(m)}")


HEADER = f"{'NAME':<16} {'ROLE':<10} {'STATE':<8} {'ADDRESS':<22} {'INC':>4} {'AGE':>5}  DETAILS"


def _members(a: argparse.Namespace) -> int:
    with common.client(a, call_timeout_s=TIMEOUT) as c:
        view = c.membership.members(role=a.role or "")
    if a.json:
        print(common.dumps(list(view.members)))
        return 0
    print(HEADER)
    for m in view.members:
        print(_row(m))
    live = sum(1 for m in view.members if m.live)
    print(f"({len(view.members)} member(s), {live} live, as seen by {view.self_name})")
    return 0


def _watch(a: argparse.Namespace) -> int:
    seen = 0
    with common.client(a, call_timeout_s=TIMEOUT) as c, \
            c.membership.watch(role=a.role or "") as events:
        try:
            for ev in events:
                if ev.kind == "snapshot":
                    if a.json:
                        print(json.dumps({"kind": "snapshot",
                                          "members": common.to_json(list(ev.members))}),
                              flush=True)
                    else:
                        print(HEADER)
                        for m in ev.members:
                            print(_row(m))
                        print("-- events --", flush=True)
                    continue
                who = ev.member
                assert who is not None
                print(json.dumps({"kind": ev.kind, "member": common.to_json(who)}) if a.json else
                      f"{ev.kind:<8} {who.name} {who.address} {who.role or '-'} "
                      f"incarnation {who.incarnation}", flush=True)
                seen += 1
                if a.count and seen >= a.count:
                    break
        except KeyboardInterrupt:
            pass
    return 0


def nodes_main(argv: Sequence[str]) -> int:
    """`accord nodes [members|watch] | --gpus | ls|drain|undrain|register|agent ...`."""
    args = list(argv)
    if args and args[0] in GPU_OPS:
        from accord.cli import jobs

        return jobs.nodes_main(args)
    if "--gpus" in args:
        from accord.cli import jobs

        args.remove("--gpus")
        return jobs.nodes_main(["ls", *args])
    p = argparse.ArgumentParser(
        prog="accord nodes", description="cluster members (SWIM) and GPU nodes",
        epilog="GPU nodes: accord nodes --gpus | ls | drain NAME | undrain NAME | register | agent "
               "(see `accord nodes ls --help`)")
    p.add_argument("op", nargs="?", default="members", choices=["members", "watch"],
                   help="members (default): the SWIM view; watch: it, then its events")
    common.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--role", help="only members with this role (accord, gpu-agent)")
    p.add_argument("--count", type=int, default=0, help="watch: stop after this many events")
    p.add_argument("--gpus", action="store_true", help="show the scheduler's GPU nodes instead")
    a = p.parse_args(args)
    return common.run(_watch if a.op == "watch" else _members, a)
