"""The client's behaviour, one test body run against both twins: ``AccordClient`` (async)
and ``SyncClient`` (blocking), each against a real ``accord.node.grpc_server`` process.

A body awaits what the async client returns and takes what the sync one returns as is
(:func:`r`), and iterates a watch with :func:`take`, so the same assertions hold both.
The server runs in its own process, so the sync twin may block the test's loop.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from accord.client import (
    AccordClient,
    ClientError,
    Compare,
    EventType,
    Op,
    OutcomeUnknown,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    Unavailable,
    WatchCompacted,
)
from accord.client.sync import SyncClient
from tests.compat.servers import accord_server
from tests.integration.cluster import free_ports

_ns = itertools.count()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with accord_server() as server:
        yield server.endpoint


@pytest.fixture(params=["async", "sync"])
async def c(request: pytest.FixtureRequest, endpoint: str) -> AsyncIterator[Any]:
    if request.param == "async":
        async with AccordClient([endpoint], call_timeout_s=5.0) as client:
            yield client
    else:
        with SyncClient([endpoint], call_timeout_s=5.0) as sync:
            yield sync


@pytest.fixture
def ns() -> str:
    """A key prefix of this test alone."""
    return f"/t{next(_ns)}/"


async def r(x: Any) -> Any:
    """The result of a twin's call: awaited for the async client, as is for the sync one."""
    return await x if inspect.isawaitable(x) else x


async def take(watch: Any, n: int) -> list[Any]:
    """The next ``n`` events of either twin's watch."""
    out = []
    for _ in range(n):
        out.append(await watch.__anext__() if hasattr(watch, "__anext__") else next(watch))
    return out


async def test_range_with_every_option(c: Any, ns: str) -> None:
    revs = [(await r(c.put(f"{ns}{k}", v))).revision
            for k, v in [("a", "3"), ("b", "1"), ("c", "2"), ("d", "5"), ("e", "4")]]
    await r(c.put(f"{ns}a", "9"))
    res = await r(c.range(ns, prefix=True, limit=2))
    assert isinstance(res, RangeResult)
    assert [kv.key for kv in res.kvs] == [f"{ns}a".encode(), f"{ns}b".encode()]
    assert res.more and res.count == 5
    desc = await r(c.range(ns, prefix=True, sort_order=SortOrder.DESCEND,
                           sort_target=SortTarget.VALUE))
    assert [kv.value for kv in desc.kvs] == [b"9", b"5", b"4", b"2", b"1"]
    keys = await r(c.range(ns, prefix=True, keys_only=True))
    assert all(kv.value == b"" for kv in keys.kvs) and len(keys.kvs) == 5
    count = await r(c.range(ns, prefix=True, count_only=True))
    assert count.kvs == () and count.count == 5
    old = await r(c.range(f"{ns}a", revision=revs[0]))
    assert old.kvs[0].value == b"3" and old.kvs[0].version == 1
    ser = await r(c.get(f"{ns}a", serializable=True))
    assert ser.value == b"9" and ser.version == 2
    window = await r(c.range(f"{ns}b", f"{ns}d"))
    assert [kv.key[-1:] for kv in window.kvs] == [b"b", b"c"]
    after = await r(c.range(f"{ns}d", from_key=True))
    assert [kv.key for kv in after.kvs][:2] == [f"{ns}d".encode(), f"{ns}e".encode()]
    newer = await r(c.range(ns, prefix=True, min_mod_revision=revs[3]))
    assert {kv.key[-1:] for kv in newer.kvs} == {b"a", b"d", b"e"}
    assert await r(c.get(f"{ns}zz")) is None


async def test_put_and_delete_options(c: Any, ns: str) -> None:
    first = await r(c.put(f"{ns}k", "1"))
    assert isinstance(first, PutResult) and first.prev_kv is None
    second = await r(c.put(f"{ns}k", "2", prev_kv=True))
    assert second.prev_kv.value == b"1" and second.revision == first.revision + 1
    lease = await r(c.lease_grant(60))
    kept = await r(c.put(f"{ns}k", "", lease=lease.id, ignore_value=True, prev_kv=True))
    assert kept.prev_kv.value == b"2"
    got = await r(c.get(f"{ns}k"))
    assert got.value == b"2" and got.lease == lease.id
    await r(c.put(f"{ns}k", "3", ignore_lease=True))
    got = await r(c.get(f"{ns}k"))
    assert got.value == b"3" and got.lease == lease.id
    with pytest.raises(ClientError, match="key not found") as bad:
        await r(c.put(f"{ns}missing", "", ignore_value=True))
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and bad.value.endpoint
    await r(c.put(f"{ns}k2", "x"))
    gone = await r(c.delete(ns, prefix=True, prev_kv=True))
    assert gone.deleted == 2 and sorted(kv.value for kv in gone.prev_kvs) == [b"3", b"x"]
    assert (await r(c.delete(f"{ns}k"))).deleted == 0
    assert await r(c.lease_ttl(lease.id)) > 0
    await r(c.lease_revoke(lease.id))
    with pytest.raises(ClientError, match="lease not found"):
        await r(c.lease_ttl(lease.id))


async def test_txn_builder_both_branches(c: Any, ns: str) -> None:
    k = f"{ns}leader"
    await r(c.put(k, "n1"))
    ok = await r(c.txn().if_(Compare.value(k) == "n1", Compare.version(k) > 0)
                 .then(Op.put(k, "n2", prev_kv=True), Op.get(k))
                 .else_(Op.get(k)).commit())
    assert ok.succeeded and ok.responses[0].prev_kv.value == b"n1"
    assert ok.responses[1].kvs[0].value == b"n2"
    no = await r(c.txn().if_(Compare.value(k) == "n1").then(Op.delete(k))
                 .else_(Op.get(k), Op.txn([Compare.create(k) == 0], [], [Op.get(k)])).commit())
    assert not no.succeeded and no.revision == ok.revision
    assert no.responses[0].kvs[0].value == b"n2"
    assert not no.responses[1].succeeded and no.responses[1].responses[0].count == 1
    with pytest.raises(ClientError, match="duplicate key"):
        await r(c.txn().then(Op.put(k, "a"), Op.put(k, "b")).commit())


async def test_watch_filters_prev_kv_and_progress(c: Any, ns: str) -> None:
    start = (await r(c.put(f"{ns}a", "1"))).revision
    await r(c.put(f"{ns}a", "2"))
    await r(c.delete(f"{ns}a"))
    await r(c.put(f"{ns}b", "3"))
    w = c.watch(ns, prefix=True, start_revision=start, prev_kv=True,
                filters=[EventType.DELETE])
    try:
        events = await take(w, 3)
        assert [(e.type, e.kv.key[-1:], e.kv.value) for e in events] == [
            (EventType.PUT, b"a", b"1"), (EventType.PUT, b"a", b"2"), (EventType.PUT, b"b", b"3")]
        assert events[0].prev_kv is None and events[1].prev_kv.value == b"1"
        assert [e.revision for e in events] == [start, start + 1, start + 3]
        assert await r(w.request_progress()) >= start + 3
        assert w.progress_revision >= start + 3 and w.next_revision == start + 4
    finally:
        await r(w.close())


async def test_a_compacted_start_revision_raises_the_documented_error(c: Any, ns: str) -> None:
    old = (await r(c.put(f"{ns}a", "1"))).revision
    now = (await r(c.put(f"{ns}a", "2"))).revision
    await r(c.compact(now))
    w = c.watch(ns, prefix=True, start_revision=old)
    try:
        with pytest.raises(WatchCompacted) as e:
            await take(w, 1)
        assert e.value.compact_revision == now and e.value.requested == old
        assert e.value.code == grpc.StatusCode.OUT_OF_RANGE and "range the keys again" in str(e.value)
    finally:
        await r(w.close())


async def test_cluster_and_maintenance(c: Any, tmp_path: Path) -> None:
    members = await r(c.cluster.members())
    assert len(members) == 1 and members[0].endpoint
    st = await r(c.cluster.status())
    assert st.member_id == members[0].id and st.raft_index > 0 and st.version
    assert (await r(c.cluster.leader())).id == members[0].id
    assert await r(c.cluster.alarms()) == []
    await r(c.cluster.defragment())
    seen: list[tuple[int, int]] = []
    snap = await r(c.cluster.snapshot(tmp_path / "snap.db",
                                      progress=lambda got, total: seen.append((got, total))))
    assert snap.size == (tmp_path / "snap.db").stat().st_size > 0
    assert seen and seen[-1] == (snap.size, snap.size)
    assert not (tmp_path / "snap.db.part").exists()
    assert await r(c.cluster.discover()) == []  # its only member was given


async def test_errors_say_which_endpoint_failed_and_what_to_try(c: Any, ns: str) -> None:
    (dead,) = free_ports(1)
    kind = AccordClient if isinstance(c, AccordClient) else SyncClient
    other = kind([f"127.0.0.1:{dead}"], call_timeout_s=0.5, retry_budget_s=1.0)
    try:
        with pytest.raises(Unavailable) as e:
            await r(other.put(f"{ns}x", "1"))
        assert not isinstance(e.value, OutcomeUnknown)  # nothing was sent: plainly unavailable
        assert e.value.endpoint == f"127.0.0.1:{dead}" and "reachable" in e.value.hint
    finally:
        await r(other.close())


async def test_snapshot_fails_over_and_renames_only_a_checked_file(c: Any, endpoint: str,
                                                                   tmp_path: Path) -> None:
    (dead,) = free_ports(1)
    kind = AccordClient if isinstance(c, AccordClient) else SyncClient
    other = kind([f"127.0.0.1:{dead}", endpoint], call_timeout_s=2.0, retry_budget_s=10.0)
    try:
        # no endpoint named: the first that answers gives it (a snapshot is a read)
        seen: list[Path] = []
        snap = await r(other.cluster.snapshot(tmp_path / "a.db", check=seen.append))
        assert snap.endpoint == endpoint and snap.size == (tmp_path / "a.db").stat().st_size
        assert seen == [tmp_path / "a.db.part"]  # checked before the rename

        def refuse(part: Path) -> None:
            assert part.stat().st_size == snap.size
            raise ValueError("not a backup I like")

        with pytest.raises(ValueError, match="not a backup I like"):
            await r(other.cluster.snapshot(tmp_path / "b.db", check=refuse))
        assert not (tmp_path / "b.db").exists() and not (tmp_path / "b.db.part").exists()
        # a member named explicitly is asked alone: a dead one is an error naming it
        with pytest.raises(Unavailable) as e:
            await r(other.cluster.snapshot(tmp_path / "c.db", endpoint=f"127.0.0.1:{dead}"))
        assert e.value.endpoint == f"127.0.0.1:{dead}"
        assert not (tmp_path / "c.db").exists() and not (tmp_path / "c.db.part").exists()
    finally:
        await r(other.close())
