"""`accord status` and `accord kv`: look at a cluster and its keys from the shell.

Both go through :mod:`accord.client` (:mod:`accord.cli.common`), which speaks the etcd
v3 gRPC API, so they work against any accord member (and, but for ``--groups``, any
etcd). Endpoints come from ``--endpoints`` or ``ACCORD_ENDPOINTS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from accord.cli import common


def _status(args: argparse.Namespace) -> int:
    """Every member, who leads, terms and indexes, each as the member itself says."""
    with common.client(args, call_timeout_s=5.0) as c:
        reports = c.cluster.statuses(timeout=2.0)
    rows: list[dict[str, Any]] = []
    for r in reports:
        m = r.member
        row: dict[str, Any] = {"name": m.name, "id": f"{m.id:x}",
                               "client": ",".join(m.client_urls), "peer": ",".join(m.peer_urls)}
        if r.status is not None:
            st = r.status
            row.update(leader=st.leader == m.id, term=st.raft_term, index=st.raft_index,
                       applied=st.raft_applied_index, version=st.version, db=st.db_size,
                       errors=list(st.errors))
        else:
            assert r.error is not None
            row.update(error=r.error.message or r.error.code.name)
        rows.append(row)
    ok = all("error" not in row for row in rows)
    if args.json:
        print(json.dumps(rows))
        return 0 if ok else 1
    print(f"{'NAME':<10} {'ID':<17} {'CLIENT':<24} {'LEADER':<6} {'TERM':>5} "
          f"{'INDEX':>8} {'APPLIED':>8}  STATE")
    for row in rows:
        state = row.get("error") or ("ok" if not row.get("errors") else ";".join(row["errors"]))
        print(f"{row['name']:<10} {row['id']:<17} {row['client']:<24} "
              f"{'*' if row.get('leader') else '':<6} {row.get('term', ''):>5} "
              f"{row.get('index', ''):>8} {row.get('applied', ''):>8}  {state}")
    return 0 if ok else 1


def _groups(args: argparse.Namespace) -> int:
    """Every Raft group as the first answering member sees it: leader, voters, learners."""
    with common.client(args) as c:
        names = {m.id: m.name or f"{m.id:x}" for m in c.cluster.members()}
        report = c.cluster.groups()
    if args.json:
        print(json.dumps({"member_id": report.member_id, "groups": {
            str(g.id): {"voters": list(g.voters), "learners": list(g.learners),
                        "leader": g.leader, "applied": g.applied} for g in report.groups}}))
        return 0

    def who(ids: Sequence[int]) -> str:
        return ",".join(sorted(names.get(i, f"{i:x}") for i in ids)) or "-"

    print(f"{'GROUP':<14} {'LEADER':<10} {'VOTERS':<30} {'LEARNERS':<16} {'APPLIED':>8}")
    for g in report.groups:
        leader = names.get(g.leader, "-") if g.leader else "-"
        print(f"{g.name:<14} {leader:<10} {who(g.voters):<30} {who(g.learners):<16} "
              f"{g.applied:>8}")
    print(f"(as seen by {names.get(report.member_id, report.member_id)})")
    return 0


def _kv(args: argparse.Namespace) -> int:
    with common.client(args) as c:
        if args.op == "put":
            if args.value is None:
                print("accord kv put: a value is required", file=sys.stderr)
                return 2
            r = c.put(args.key, args.value)
            print(f"OK (revision {r.revision})")
            return 0
        if args.op == "get":
            rr = c.range(args.key, prefix=args.prefix, serializable=args.serializable)
            for kv in rr.kvs:
                print(f"{kv.key.decode(errors='replace')}\t{kv.value.decode(errors='replace')}")
            return 0 if rr.kvs else 1
        print(c.delete(args.key, prefix=args.prefix).deleted)
        return 0


def status_main(argv: Sequence[str]) -> int:
    """`accord status`: every member, who leads, terms and indexes."""
    p = argparse.ArgumentParser(prog="accord status", description=_status.__doc__)
    common.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--groups", action="store_true",
                   help="every Raft group (meta, KV shards, scheduler): leader, voters, learners")
    args = p.parse_args(list(argv))
    return common.run(_groups if args.groups else _status, args)


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
    return common.run(_kv, p.parse_args(list(argv)))
