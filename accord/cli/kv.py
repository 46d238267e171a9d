"""`accord status` and `accord kv`: look at a cluster and its keys from the shell.

Both speak the etcd v3 gRPC API, so they work against any accord member (and any
etcd). Endpoints come from ``--endpoints`` or ``ACCORD_ENDPOINTS`` (comma-separated
``host:port`` or ``http://host:port``), default ``127.0.0.1:2379``; a request goes
to the first endpoint that answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from accord.cli import common
from accord.proto import rpc_pb2, rpc_pb2_grpc

_stubs: Any = rpc_pb2_grpc  # the generated stubs carry no type annotations

T = TypeVar("T")
TIMEOUT = 5.0


def _endpoints(args: argparse.Namespace) -> common.Endpoints:
    return common.from_args(args)


def _first(endpoints: list[str], call: Callable[[grpc.Channel], T]) -> T:
    """Run ``call`` against the first endpoint that answers."""
    return common.first(endpoints, call)


def _status(args: argparse.Namespace) -> int:
    eps = _endpoints(args)
    members = _first(eps, lambda ch: _stubs.ClusterStub(ch).MemberList(
        rpc_pb2.MemberListRequest(), timeout=TIMEOUT)).members
    rows: list[dict[str, Any]] = []
    for m in members:
        row: dict[str, Any] = {"name": m.name, "id": f"{m.ID:x}",
                               "client": ",".join(m.clientURLs), "peer": ",".join(m.peerURLs)}
        if not m.clientURLs:
            row.update(error="no client URL published yet (the member may be starting)")
            rows.append(row)
            continue
        try:
            st = _first(eps.only(m.clientURLs[0]), lambda ch: _stubs.MaintenanceStub(ch).Status(
                rpc_pb2.StatusRequest(), timeout=2.0))
            row.update(leader=st.leader == m.ID, term=st.raftTerm, index=st.raftIndex,
                       applied=st.raftAppliedIndex, version=st.version, db=st.dbSize,
                       errors=list(st.errors))
        except grpc.RpcError as e:
            row.update(error=e.details() or e.code().name)
        rows.append(row)
    ok = all("error" not in r for r in rows)
    if args.json:
        print(json.dumps(rows))
        return 0 if ok else 1
    print(f"{'NAME':<10} {'ID':<17} {'CLIENT':<24} {'LEADER':<6} {'TERM':>5} "
          f"{'INDEX':>8} {'APPLIED':>8}  STATE")
    for r in rows:
        state = r.get("error") or ("ok" if not r.get("errors") else ";".join(r["errors"]))
        print(f"{r['name']:<10} {r['id']:<17} {r['client']:<24} "
              f"{'*' if r.get('leader') else '':<6} {r.get('term', ''):>5} "
              f"{r.get('index', ''):>8} {r.get('applied', ''):>8}  {state}")
    return 0 if ok else 1


DEBUG_GROUPS_METHOD = "/accord.Debug/Groups"
"""The node's raw-bytes method answering every group's membership as JSON
(``accord.node.members.groups_report``)."""


def _group_name(gid: int) -> str:
    """What a group id stands for (``accord.node.backend.kv_group`` and the services')."""
    if gid == 1:
        return "meta"
    if gid == 2:
        return "kv shard 0"
    if gid == 3:
        return "scheduler"
    if gid > 100:
        return f"kv shard {gid - 100}"
    return f"group {gid}"


def _groups(args: argparse.Namespace) -> int:
    """Every Raft group as the first answering member sees it: leader, voters, learners."""
    eps = _endpoints(args)
    members = _first(eps, lambda ch: _stubs.ClusterStub(ch).MemberList(
        rpc_pb2.MemberListRequest(), timeout=TIMEOUT)).members
    names = {m.ID: m.name or f"{m.ID:x}" for m in members}
    raw: bytes = _first(eps, lambda ch: ch.unary_unary(DEBUG_GROUPS_METHOD)(b"", timeout=TIMEOUT))
    report = json.loads(raw)
    if args.json:
        print(json.dumps(report))
        return 0

    def who(ids: list[int]) -> str:
        return ",".join(sorted(names.get(i, f"{i:x}") for i in ids)) or "-"

    print(f"{'GROUP':<14} {'LEADER':<10} {'VOTERS':<30} {'LEARNERS':<16} {'APPLIED':>8}")
    for gid, g in sorted(report["groups"].items(), key=lambda kv: int(kv[0])):
        leader = names.get(g["leader"], "-") if g["leader"] else "-"
        print(f"{_group_name(int(gid)):<14} {leader:<10} {who(g['voters']):<30} "
              f"{who(g['learners']):<16} {g['applied']:>8}")
    print(f"(as seen by {names.get(report['member_id'], report['member_id'])})")
    return 0


def _prefix_end(key: bytes) -> bytes:
    b = bytearray(key)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\0"
    b[-1] += 1
    return bytes(b)


def _kv(args: argparse.Namespace) -> int:
    eps = _endpoints(args)
    key = args.key.encode()
    if args.op == "put":
        if args.value is None:
            print("accord kv put: a value is required", file=sys.stderr)
            return 2
        req = rpc_pb2.PutRequest(key=key, value=args.value.encode())
        r = _first(eps, lambda ch: _stubs.KVStub(ch).Put(req, timeout=TIMEOUT))
        print(f"OK (revision {r.header.revision})")
        return 0
    end = _prefix_end(key) if args.prefix else b""
    if args.op == "get":
        rreq = rpc_pb2.RangeRequest(key=key, range_end=end, serializable=args.serializable)
        rr = _first(eps, lambda ch: _stubs.KVStub(ch).Range(rreq, timeout=TIMEOUT))
        for kv in rr.kvs:
            print(f"{kv.key.decode(errors='replace')}\t{kv.value.decode(errors='replace')}")
        return 0 if rr.kvs else 1
    dreq = rpc_pb2.DeleteRangeRequest(key=key, range_end=end)
    dr = _first(eps, lambda ch: _stubs.KVStub(ch).DeleteRange(dreq, timeout=TIMEOUT))
    print(dr.deleted)
    return 0


def status_main(argv: Sequence[str]) -> int:
    """`accord status`: every member, who leads, terms and indexes."""
    p = argparse.ArgumentParser(prog="accord status", description=_status.__doc__)
    common.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--groups", action="store_true",
                   help="every Raft group (meta, KV shards, scheduler): leader, voters, learners")
    args = p.parse_args(list(argv))
    return _run(_groups if args.groups else _status, args)


def kv_main(argv: Sequence[str]) -> int:
    """`accord kv get|put|del KEY [VALUE]`."""
    p = argparse.ArgumentParser(prog="accord kv", description="read and write keys")
    p.add_argument("op", choices=["get", "put", "del"])
    p.add_argument("key")
    p.add_argument("value", nargs="?")
    p.add_argument("--prefix", action="store_true", help="get/del every key with this prefix")
    p.add_argument("--serializable", action="store_true",
                   help="read locally without a ReadIndex round (may be stale)")
    common.add_arguments(p)
    return _run(_kv, p.parse_args(list(argv)))


def _run(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return fn(args)
    except grpc.RpcError as e:
        print(f"accord: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
