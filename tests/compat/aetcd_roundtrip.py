"""Scenarios with the ``aetcd`` PyPI client (asyncio etcd v3 client), run as a subprocess.

Usage: python aetcd_roundtrip.py HOST PORT [SCENARIO,SCENARIO,...]  (default: all)

aetcd ships its own generated ``rpc.proto`` (package ``etcdserverpb``), whose descriptors
clash with accord's in one process, so the pytest process never imports it: it runs this
script, which prints one JSON line per scenario -- ``{"scenario": NAME, "ok": true}`` or
``{"scenario": NAME, "ok": false, "error": TRACEBACK}`` -- and ``ALL DONE`` at the end.
Each scenario uses its own key prefix, so one failing does not hide the others; the
compaction scenario runs last because compaction affects the whole keyspace.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rtypes

Scenario = Callable[[Any], Awaitable[None]]
EVENT_TIMEOUT_S = 5.0


def _check(cond: bool, what: str, got: object) -> None:
    if not cond:
        raise AssertionError(f"{what}; got {got!r}")


async def kv(c: Any) -> None:
    """put/get/range with prefix/delete: values, revisions, versions, prev_kv."""
    r1 = await c.put(b"/ae/kv/a", b"1")
    r2 = await c.put(b"/ae/kv/b", b"2")
    r3 = await c.put(b"/ae/kv/c", b"3")
    revs = [r1.header.revision, r2.header.revision, r3.header.revision]
    _check(revs[0] > 0 and revs == sorted(set(revs)), "put revisions strictly increase", revs)

    g = await c.get(b"/ae/kv/a")
    _check(g is not None and g.value == b"1" and g.key == b"/ae/kv/a", "get a", g)
    _check(g.version == 1 and g.create_revision == revs[0] == g.mod_revision, "fresh key meta", g)
    _check(g.header.revision >= revs[2], "read header revision is current", g.header.revision)
    _check(await c.get(b"/ae/kv/missing") is None, "missing key reads as None", "a value")

    upd = await c.put(b"/ae/kv/a", b"1b", prev_kv=True)
    _check(upd.prev_kv is not None and upd.prev_kv.value == b"1", "put prev_kv", upd.prev_kv)
    # A later revision (not necessarily revs[2] + 1: the lease-expiry scenario running
    # alongside deletes its key when its lease runs out, which takes a revision too).
    _check(upd.header.revision > revs[2], "overwrite takes a later revision", upd.header)
    g = await c.get(b"/ae/kv/a")
    _check(g.value == b"1b" and g.version == 2, "second version", g)
    _check(g.create_revision == revs[0] and g.mod_revision == upd.header.revision, "revs", g)

    rng = await c.get_prefix(b"/ae/kv/")
    _check([kv.key for kv in rng] == [b"/ae/kv/a", b"/ae/kv/b", b"/ae/kv/c"], "prefix keys", rng)
    _check([kv.value for kv in rng] == [b"1b", b"2", b"3"] and len(rng) == 3, "prefix vals", rng)
    desc = await c.get_prefix(b"/ae/kv/", sort_order="descend", sort_target="key")
    _check([kv.key for kv in desc] == [b"/ae/kv/c", b"/ae/kv/b", b"/ae/kv/a"], "descending", desc)
    only = await c.get_prefix(b"/ae/kv/", keys_only=True)
    _check(all(kv.value == b"" for kv in only) and len(only) == 3, "keys_only", only)
    _check(len(await c.get_prefix(b"/ae/kv/z")) == 0, "empty prefix", "non-empty")
    rg = await c.get_range(b"/ae/kv/a", b"/ae/kv/c")
    _check([kv.key for kv in rg] == [b"/ae/kv/a", b"/ae/kv/b"], "half-open range", rg)

    d = await c.delete(b"/ae/kv/b", prev_kv=True)
    _check(d is not None and d.deleted == 1 and d.prev_kv.value == b"2", "delete prev_kv", d)
    _check(await c.get(b"/ae/kv/b") is None, "deleted key is gone", "a value")
    _check(await c.delete(b"/ae/kv/b") is None, "deleting a missing key reports nothing", "x")
    dr = await c.delete_prefix(b"/ae/kv/", prev_kv=True)
    _check(dr.deleted == 2 and sorted(kv.value for kv in dr) == [b"1b", b"3"], "delete_prefix", dr)
    _check(len(await c.get_prefix(b"/ae/kv/")) == 0, "prefix empty after delete", "keys left")
    again = await c.put(b"/ae/kv/a", b"new")
    g = await c.get(b"/ae/kv/a")
    _check(g.version == 1 and g.create_revision == again.header.revision, "recreated key", g)


async def txn(c: Any) -> None:
    """Compare-and-set on mod revision and on value; put-if-absent on version."""
    t = c.transactions
    ok, _ = await c.transaction(
        compare=[t.version(b"/ae/txn/k") == 0],
        success=[t.put(b"/ae/txn/k", b"v1")],
        failure=[],
    )
    _check(ok is True, "put-if-absent on a new key succeeds", ok)
    ok, _ = await c.transaction(
        compare=[t.version(b"/ae/txn/k") == 0],
        success=[t.put(b"/ae/txn/k", b"clobbered")],
        failure=[],
    )
    _check(ok is False, "put-if-absent on an existing key fails", ok)
    cur = await c.get(b"/ae/txn/k")
    _check(cur.value == b"v1", "failed txn wrote nothing", cur)

    ok, _ = await c.transaction(
        compare=[t.mod(b"/ae/txn/k") == cur.mod_revision],
        success=[t.put(b"/ae/txn/k", b"v2")],
        failure=[t.get(b"/ae/txn/k")],
    )
    _check(ok is True, "CAS with the current mod revision succeeds", ok)
    ok, resp = await c.transaction(
        compare=[t.mod(b"/ae/txn/k") == cur.mod_revision],  # stale now
        success=[t.put(b"/ae/txn/k", b"lost")],
        failure=[t.get(b"/ae/txn/k")],
    )
    _check(ok is False, "CAS with a stale mod revision fails", ok)
    _check(len(resp) == 1 and resp[0][0][0] == b"v2", "failure branch reads current", resp)
    _check(resp[0][0][1].version == 2, "failure branch metadata", resp[0][0][1])

    _check(await c.replace(b"/ae/txn/k", b"v2", b"v3") is True, "replace on match", False)
    _check(await c.replace(b"/ae/txn/k", b"v2", b"v4") is False, "replace on mismatch", True)
    ok, resp = await c.transaction(
        compare=[t.value(b"/ae/txn/k") == b"v3", t.version(b"/ae/txn/k") > 2],
        success=[t.put(b"/ae/txn/k", b"v5"), t.put(b"/ae/txn/other", b"o"), t.get(b"/ae/txn/k")],
        failure=[],
    )
    _check(ok is True and len(resp) == 3, "multi-compare multi-op txn", resp)
    _check(resp[2][0][0] == b"v5", "a get inside the txn sees the txn's own put", resp[2])
    _check((await c.get(b"/ae/txn/other")).value == b"o", "both puts applied", "missing")
    await c.delete_prefix(b"/ae/txn/")


async def lease(c: Any) -> None:
    """grant, attach keys, keepalive, TimeToLive, revoke deletes keys."""
    ls = await c.lease(30)
    _check(ls.id > 0 and ls.ttl == 30, "lease granted with the asked TTL", (ls.id, ls.ttl))
    await c.put(b"/ae/lease/a", b"x", lease=ls)
    await c.put(b"/ae/lease/b", b"y", lease=ls.id)
    g = await c.get(b"/ae/lease/a")
    _check(g.lease == ls.id, "key carries its lease id", g.lease)
    remaining = await ls.remaining_ttl()
    _check(0 < remaining <= 30, "remaining TTL within the grant", remaining)
    _check(await ls.granted_ttl() == 30, "granted TTL", "other")
    _check(sorted(await ls.keys()) == [b"/ae/lease/a", b"/ae/lease/b"], "lease keys", "other")
    reply = await ls.refresh()
    _check(reply.ID == ls.id and reply.TTL == 30, "keepalive renews to the full TTL", reply)
    await ls.revoke()
    _check(await c.get(b"/ae/lease/a") is None, "revoke deletes attached keys", "a value")
    _check(len(await c.get_prefix(b"/ae/lease/")) == 0, "all attached keys gone", "keys left")
    info = await c.get_lease_info(ls.id)
    _check(info.TTL == -1, "revoked lease reports TTL -1", info.TTL)
    try:
        await c.put(b"/ae/lease/c", b"z", lease=ls.id)
    except aetcd.exceptions.ClientError as e:
        _check("lease not found" in str(e), "put with a revoked lease names the cause", str(e))
    else:
        raise AssertionError("put with a revoked lease must fail")


async def lease_expiry(c: Any) -> None:
    """A lease nobody keeps alive expires and takes its keys with it."""
    ls = await c.lease(2)
    await c.put(b"/ae/expiry/k", b"v", lease=ls)
    _check(await c.get(b"/ae/expiry/k") is not None, "key present while the lease lives", None)
    deadline = time.monotonic() + 12.0
    while time.monotonic() < deadline:
        if await c.get(b"/ae/expiry/k") is None:
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError("key of an expired 2 s lease still present after 12 s")
    info = await c.get_lease_info(ls.id)
    _check(info.TTL == -1, "expired lease reports TTL -1", info.TTL)


async def _take(it: Any, n: int) -> list[Any]:
    out: list[Any] = []

    async def run() -> None:
        async for ev in it:
            out.append(ev)
            if len(out) >= n:
                return

    await asyncio.wait_for(run(), EVENT_TIMEOUT_S)
    return out


async def watch(c: Any) -> None:
    """Live prefix watch, prev_kv, watch from a past revision, watch_once."""
    w = await c.watch_prefix(b"/ae/w/", prev_kv=True)
    it = w.__aiter__()
    p1 = await c.put(b"/ae/w/1", b"a")
    p2 = await c.put(b"/ae/w/1", b"b")
    await c.put(b"/ae/other", b"not watched")
    d = await c.delete(b"/ae/w/1")
    evs = await _take(it, 3)
    kinds = [e.kind for e in evs]
    _check(kinds == ["PUT", "PUT", "DELETE"], "event kinds in order", kinds)
    _check([e.kv.key for e in evs] == [b"/ae/w/1"] * 3, "only watched keys", evs)
    mods = [e.kv.mod_revision for e in evs]
    _check(mods == [p1.header.revision, p2.header.revision, d.header.revision], "event revs", mods)
    # A create has no previous pair: aetcd wraps the empty message (key b"").
    _check(evs[0].kv.value == b"a" and evs[0].prev_kv.key == b"", "create's prev_kv", evs[0])
    _check(evs[1].prev_kv is not None and evs[1].prev_kv.value == b"a", "put prev_kv", evs[1])
    _check(evs[2].prev_kv is not None and evs[2].prev_kv.value == b"b", "delete prev_kv", evs[2])
    await w.cancel()

    # From a past revision: the history replays at once, then live events follow.
    past = await c.watch(b"/ae/w/1", start_revision=p1.header.revision)
    pit = past.__aiter__()
    hist = await _take(pit, 3)
    _check([e.kind for e in hist] == ["PUT", "PUT", "DELETE"], "replayed kinds", hist)
    _check([e.kv.mod_revision for e in hist] == mods, "replayed revisions", hist)
    live = await c.put(b"/ae/w/1", b"c")
    nxt = await _take(pit, 1)
    _check(nxt[0].kv.value == b"c" and nxt[0].kv.mod_revision == live.header.revision, "live", nxt)
    await past.cancel()

    async def later() -> None:
        await asyncio.sleep(0.2)
        await c.put(b"/ae/w/once", b"z")

    task = asyncio.create_task(later())
    ev = await c.watch_once(b"/ae/w/once", timeout=EVENT_TIMEOUT_S)
    await task
    _check(ev.kind == "PUT" and ev.kv.value == b"z", "watch_once", ev)
    try:
        await c.watch_once(b"/ae/w/quiet", timeout=0.3)
    except aetcd.exceptions.WatchTimeoutError:
        pass
    else:
        raise AssertionError("watch_once on a quiet key must time out")
    await c.delete_prefix(b"/ae/w/")
    await c.delete(b"/ae/other")


async def status(c: Any) -> None:
    """Maintenance.Status and Cluster.MemberList as aetcd presents them."""
    st = await c.status()
    _check(bool(st.version), "status carries a server version", st.version)
    _check(st.raft_index > 0 and st.raft_term > 0, "raft index/term", (st.raft_index, st.raft_term))
    _check(st.db_size > 0, "dbSize", st.db_size)
    members = [m async for m in c.members()]
    _check(len(members) >= 1, "at least one member", members)
    _check(st.leader is not None, "status leader is one of the listed members", st.leader)
    _check(st.leader.id in {m.id for m in members}, "leader id listed", st.leader.id)
    _check(all(m.client_urls for m in members), "members advertise client URLs", members)


async def compaction(c: Any) -> None:
    """Compaction: watching or compacting below the compacted revision is an error."""
    first = await c.put(b"/ae/cmp/k", b"1")
    await c.put(b"/ae/cmp/k", b"2")
    last = await c.put(b"/ae/cmp/k", b"3")
    await c.compact(last.header.revision)
    _check((await c.get(b"/ae/cmp/k")).value == b"3", "latest value survives", "other")
    try:
        w = await c.watch(b"/ae/cmp/k", start_revision=first.header.revision)
        await _take(w.__aiter__(), 1)
    except aetcd.exceptions.RevisionCompactedError as e:
        _check(e.compacted_revision == last.header.revision, "compacted revision", e)
    else:
        raise AssertionError("watch from a compacted revision must raise RevisionCompactedError")
    try:
        await c.compact(first.header.revision)
    except aetcd.exceptions.ClientError as e:
        _check("compacted" in str(e), "re-compacting below names the cause", str(e))
    else:
        raise AssertionError("compacting below the compacted revision must fail")
    # Watching from exactly the compacted revision is still allowed.
    w = await c.watch(b"/ae/cmp/k", start_revision=last.header.revision)
    ev = await _take(w.__aiter__(), 1)
    _check(ev[0].kv.value == b"3", "watch at the compaction revision replays it", ev)
    await w.cancel()
    await c.delete_prefix(b"/ae/cmp/")


async def nested_txn(c: Any) -> None:
    """aetcd 1.0's integration test ``test_nested_transactions`` (``/doot/txn1`` and
    ``/doot/txn2``), then the same over ``/key1`` and ``/key2``, the keys issue 21 saw
    refused: two partitions each, so two shards of a sharded accord. Both puts must land,
    at one revision."""
    t = c.transactions
    for k1, k2 in ((b"/doot/txn1", b"/doot/txn2"), (b"/key1", b"/key2")):
        ok, _ = await c.transaction(
            compare=[],
            success=[t.put(k1, b"1"), t.txn(compare=[], success=[t.put(k2, b"2")], failure=[])],
            failure=[],
        )
        _check(ok is True, "the outer txn succeeds", ok)
        one, two = await c.get(k1), await c.get(k2)
        _check(one is not None and one.value == b"1", "the outer put applied", one)
        _check(two is not None and two.value == b"2", "the nested put applied", two)
        _check(one.mod_revision == two.mod_revision, "both puts at one revision",
               (one.mod_revision, two.mod_revision))
        await c.delete(k1)
        await c.delete(k2)


SCENARIOS: list[tuple[str, Scenario]] = [
    ("kv", kv),
    ("txn", txn),
    ("nested_txn", nested_txn),
    ("lease", lease),
    ("watch", watch),
    ("status", status),
    ("compaction", compaction),  # last: it compacts the whole keyspace
]


async def _run(name: str, fn: Scenario, c: Any) -> None:
    try:
        await asyncio.wait_for(fn(c), 30.0)
        print(json.dumps({"scenario": name, "ok": True}), flush=True)
    except BaseException:  # report and go on: every scenario gets its own verdict
        print(
            json.dumps({"scenario": name, "ok": False, "error": traceback.format_exc()}), flush=True
        )


async def main(host: str, port: int, only: set[str] | None = None) -> None:
    async with aetcd.Client(host=host, port=port, timeout=10) as c:
        # The expiry scenario mostly waits, so it runs alongside the others.
        expiry = None
        if only is None or "lease_expiry" in only:
            expiry = asyncio.create_task(_run("lease_expiry", lease_expiry, c))
        for name, fn in SCENARIOS:
            if only is None or name in only:
                await _run(name, fn, c)
        if expiry is not None:
            await expiry
    print("ALL DONE", flush=True)


if __name__ == "__main__":
    chosen = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), chosen))
