"""etcd's automatic compaction (``--auto-compaction-mode``/``--auto-compaction-retention``):
the retention read as etcd reads it, the two compactors' decisions, the revision that
keeps the last n writes on one shard and on several, and nodes that compact by
themselves, on one shard and on four."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable

import pytest

import accord.node.autocompact as autocompact
from accord.node.autocompact import (
    PERIODIC,
    REVISION,
    PeriodicCompactor,
    Retention,
    RevisionCompactor,
    parse_retention,
)
from accord.node.config import Config, ConfigError, load_config
from accord.proto import rpc_pb2 as pb
from accord.services.kv.errors import MSG_COMPACTED, EtcdError
from accord.testing import cluster
from tests.kv.helpers import op_put
from tests.kv.test_xshard import Shards, spread_keys


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("1", 3600.0), ("0.5", 1800.0), ("72", 72 * 3600.0), ("30m", 1800.0),
    ("1h30m", 5400.0), ("90s", 90.0), ("1.5h", 5400.0), ("500ms", 0.5),
])
def test_periodic_retention_is_a_duration_or_a_number_of_hours_as_etcd_reads_it(
        text: str, seconds: float) -> None:
    r = parse_retention(PERIODIC, text)
    assert r == Retention(PERIODIC, seconds=seconds)
    assert r.enabled == (seconds > 0)


def test_revision_retention_is_a_whole_number_and_bad_values_are_refused_by_name() -> None:
    assert parse_retention(REVISION, "1000") == Retention(REVISION, revisions=1000)
    assert not parse_retention(REVISION, "0").enabled
    for mode, text in [(REVISION, "1h"), (REVISION, "-5"), (PERIODIC, "1 hour"),
                       (PERIODIC, "-1"), (PERIODIC, "h"), (PERIODIC, "")]:
        with pytest.raises(ValueError, match="auto-compaction-retention"):
            parse_retention(mode, text)
    with pytest.raises(ValueError, match="auto-compaction-mode 'weekly'"):
        parse_retention("weekly", "1")
    cfg = Config(auto_compaction_mode=REVISION, auto_compaction_retention="1h")
    with pytest.raises(ConfigError, match="auto-compaction-retention '1h'"):
        cfg.validate()
    # a node of several workers takes it too: worker 0 compacts for the whole node
    cfg = load_config(["--workers", "2", "--auto-compaction-retention", "1h"], {})
    assert cfg.workers == 2 and cfg.retention() == Retention(PERIODIC, seconds=3600.0)


def test_periodic_compacts_each_period_at_the_newest_sample_a_whole_retention_old() -> None:
    rng = random.Random(7)
    pc = PeriodicCompactor(10.0, start=0.0)
    assert (pc.period, pc.sample_every) == (10.0, 1.0)
    samples: list[tuple[float, int]] = []
    compactions: list[tuple[float, int]] = []
    now, rev = 0.0, 100
    while now < 100:
        now += pc.sample_every * rng.uniform(0.8, 1.2)  # a loop's sleep is never exact
        rev += rng.randint(0, 50)
        pc.sample(now, rev)
        samples.append((now, rev))
        at = pc.due(now)
        if at is not None:
            pc.done(now, at)
            compactions.append((now, at))
    assert len(compactions) >= 8
    for when, at in compactions:
        # the newest sample taken at least a retention before the compaction
        assert at == max(r for t, r in samples if t <= when - 10.0)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(compactions)]
    assert all(10.0 <= g < 11.5 for g in gaps)  # one per period
    long = PeriodicCompactor(72 * 3600.0, start=0.0)  # etcd: hourly, a tenth of it apart
    assert (long.period, long.sample_every) == (3600.0, 360.0)


async def test_revision_mode_compacts_once_an_interval_and_never_at_the_same_revision_twice(
        ) -> None:
    asked: list[int] = []

    async def kept_from(n: int) -> int:
        asked.append(n)
        return 5000 - n

    async def nothing(n: int) -> int:
        return 0

    async def unused() -> int:
        raise AssertionError("revision mode samples nothing")

    rc = RevisionCompactor(1000, start=0.0, interval=300.0)

    async def due(now: float, writes_ago: Callable[[int], Awaitable[int]] = kept_from,
                  leads: bool = True) -> int | None:
        return await rc.decide(now, leads, unused, writes_ago)

    assert await due(299.0) is None and not asked  # not asked before its time
    assert await due(300.0, leads=False) is None and not asked  # a follower never asks
    assert await due(300.0) == 4000 and asked == [1000]
    rc.done(300.0, 4000)
    assert await due(599.0) is None
    assert await due(600.0) is None  # nothing written since: nothing to do
    assert await due(600.0, nothing) is None  # a history of fewer than n revisions


async def _writes(b: Shards, keys: list[bytes], count: int, seed: int) -> list[int]:
    """``count`` puts and two-key Txns over ``keys``; the revision of each."""
    rng = random.Random(seed)
    revs: list[int] = []
    for i in range(count):
        if rng.random() < 0.3:
            k1, k2 = rng.sample(keys, 2)
            t = await b.txn(pb.TxnRequest(success=[op_put(k1, b"t%d" % i), op_put(k2, b"t")]))
            revs.append(t.header.revision)
        else:
            p = await b.put(pb.PutRequest(key=rng.choice(keys), value=b"p%d" % i))
            revs.append(p.header.revision)
    return revs


@pytest.mark.parametrize("shards", [1, 4])
async def test_a_compaction_at_revision_writes_ago_keeps_exactly_the_last_n_writes(
        shards: int) -> None:
    b = Shards(shards)
    keys = spread_keys(12, shards)
    revs = await _writes(b, keys, 120, seed=shards)
    written = sorted(set(revs))
    assert len(written) == len(revs)  # every write its own revision (a Txn's counted once)
    n = 25
    at = b.revision_writes_ago(n)
    assert at == written[-(n + 1)]
    assert b.revision_writes_ago(len(written)) < written[0]  # keeps every write there is
    await b.compact(pb.CompactionRequest(revision=at))
    for rev in written[-n:]:
        await b.range(pb.RangeRequest(key=b"\0", range_end=b"\0", revision=rev))
    with pytest.raises(EtcdError, match="compacted"):
        await b.range(pb.RangeRequest(key=b"\0", range_end=b"\0", revision=at - 1))


async def _compacted_at(client_range: Callable[[pb.RangeRequest], Awaitable[object]],
                        rev: int) -> bool:
    try:
        await client_range(pb.RangeRequest(key=b"\0", range_end=b"\0", revision=rev))
    except Exception as e:  # the client raises etcd's compacted error
        if MSG_COMPACTED.split(": ", 1)[1] in str(e):
            return True
        raise
    return False


@pytest.mark.parametrize("shards", [1, 4])
async def test_a_node_keeps_the_last_two_seconds_of_history_by_itself(shards: int) -> None:
    async with cluster(nodes=1, shards=shards,
                       extra=["--auto-compaction-retention", "2s"]) as c:
        client = c.client()
        first = (await client.put("/ac/k", "0")).revision
        marks: list[tuple[float, int]] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() - start < 4.5:
            marks.append((loop.time(), (await client.put("/ac/k", "x")).revision))
            await asyncio.sleep(0.1)
        node = c.nodes[0].node
        assert node is not None and node.metrics.auto_compactions >= 1
        kv = node.backend
        compacted = max(m.compact_revision for m in kv.machines)
        assert compacted > first
        assert await _compacted_at(client.range_raw, first)
        now = loop.time()
        # what was written within the retention (2 s) is still there: checked for the
        # last 1.5 s, a margin for a compaction that starts while this loop reads
        for t, rev in marks:
            if t >= now - 1.5:
                assert not await _compacted_at(client.range_raw, rev)


async def test_revision_mode_keeps_the_last_n_revisions_on_four_shards(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autocompact, "REVISION_CHECK_S", 0.3)
    async with cluster(nodes=1, shards=4, extra=["--auto-compaction-mode", "revision",
                                                 "--auto-compaction-retention", "5"]) as c:
        client = c.client()
        revs = [(await client.put(f"/ac/{i % 7}", "v")).revision for i in range(20)]
        node = c.nodes[0].node
        assert node is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10

        def compacted() -> int:
            return max(m.compact_revision for m in node.backend.machines)

        while compacted() < revs[-6] and loop.time() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # three more checks: nothing new written, nothing more to do
        logs = [m.recent_revisions(10) for m in node.backend.machines]
        assert compacted() == revs[-6] and node.metrics.auto_compactions >= 1, (revs, logs)
        for rev in revs[-5:]:
            assert not await _compacted_at(client.range_raw, rev)
        assert await _compacted_at(client.range_raw, revs[-7])
