"""`accord nodes`: the cluster's members as SWIM sees them, and the scheduler's GPU nodes.

    accord nodes [--role gpu-agent] [--json]   # every SWIM member: role, state, address
    accord nodes watch [--count N]             # the view, then membership events as they happen
    accord nodes --gpus                        # the scheduler's GPU nodes (= accord nodes ls)
    accord nodes ls|drain|undrain|register|agent ...   # GPU node operations (see jobs.py)

Members come from ``accord.membership.v1.Membership`` on the first endpoint that
answers (``--endpoints`` or ``ACCORD_ENDPOINTS``, default ``127.0.0.1:2379``): that
node's view, which SWIM keeps converged with every other node's within a few probe
intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format

from accord.cli import common
from accord.proto import membership_pb2 as pb
from accord.proto import membership_pb2_grpc

_stubs: Any = membership_pb2_grpc  # the generated stubs carry no type annotations
T = TypeVar("T")
TIMEOUT = 10.0
GPU_OPS = ("ls", "drain", "undrain", "register", "agent")
"""Subcommands that operate on the scheduler's GPU nodes (``accord.cli.jobs``)."""


def _endpoints(args: argparse.Namespace) -> common.Endpoints:
    return common.from_args(args)


def _first(endpoints: list[str], call: Callable[[Any], T]) -> T:
    """Run ``call(stub)`` against the first endpoint that answers."""
    return common.first(endpoints, lambda ch: call(_stubs.MembershipStub(ch)))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _details(m: pb.Member) -> str:
    meta = m.metadata
    if meta.get("role") == "accord":
        return f"id {meta.get('id', '?')} client {meta.get('client', '-')} v{meta.get('version', '?')}"
    if meta.get("role") == "gpu-agent":
        node = meta.get("node", m.name)
        return (f"node {node}: {meta.get('gpus', '?')} GPU(s) {meta.get('models', '') or ''} "
                f"inventory {meta.get('inventory', '-')}").replace("  ", " ")
    return ",".join(f"{k}={v}" for k, v in sorted(meta.items())) or "-"


def _row(m: pb.Member) -> str:
    role = m.metadata.get("role", "-")
    return (f"{m.name:<16} {role:<10} {m.state:<8} {m.address:<22} {m.incarnation:>4} "
            f"{_age(m.state_age):>5}  {_details(m)}")


HEADER = f"{'NAME':<16} {'ROLE':<10} {'STATE':<8} {'ADDRESS':<22} {'INC':>4} {'AGE':>5}  DETAILS"


def _dump(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                                    always_print_fields_with_no_presence=True)
    return out


def _members(a: argparse.Namespace) -> int:
    eps = _endpoints(a)
    resp = _first(eps, lambda s: s.Members(pb.MembersRequest(role=a.role or ""), timeout=TIMEOUT))
    if a.json:
        print(json.dumps([_dump(m) for m in resp.members]))
        return 0
    print(HEADER)
    for m in resp.members:
        print(_row(m))
    live = sum(1 for m in resp.members if m.state in ("alive", "suspect"))
    print(f"({len(resp.members)} member(s), {live} live, as seen by {resp.self})")
    return 0


def _watch(a: argparse.Namespace) -> int:
    eps = _endpoints(a)
    with common.channel(eps[0], eps) as ch:
        stream = _stubs.MembershipStub(ch).Watch(pb.WatchRequest(role=a.role or ""))
        seen = 0
        try:
            for resp in stream:
                if resp.kind == "snapshot":
                    if a.json:
                        print(json.dumps({"kind": "snapshot",
                                          "members": [_dump(m) for m in resp.snapshot]}), flush=True)
                    else:
                        print(HEADER)
                        for m in resp.snapshot:
                            print(_row(m))
                        print("-- events --", flush=True)
                    continue
                m = resp.member
                print(json.dumps({"kind": resp.kind, "member": _dump(m)}) if a.json else
                      f"{resp.kind:<8} {m.name} {m.address} {m.metadata.get('role', '-')} "
                      f"incarnation {m.incarnation}", flush=True)
                seen += 1
                if a.count and seen >= a.count:
                    break
        except KeyboardInterrupt:
            pass
        finally:
            stream.cancel()
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
    try:
        return _watch(a) if a.op == "watch" else _members(a)
    except grpc.RpcError as e:
        print(f"accord: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
