"""The batching writer: concurrent puts coalesced into Txns, per partition, key once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from accord.client import AccordClient, ClientError, LeaseNotFound
from accord.services.kv.local import LocalBackend
from tests.locks.inproc import serve_local


@pytest.fixture
async def client() -> AsyncIterator[tuple[AccordClient, LocalBackend]]:
    async with serve_local() as (endpoint, backend), AccordClient([endpoint]) as c:
        yield c, backend


async def test_concurrent_puts_share_few_txns_and_all_land(
    client: tuple[AccordClient, LocalBackend]
) -> None:
    c, backend = client
    b = c.batcher(max_ops=50)
    before = backend.revision
    keys = [f"/jobs/{j}/rank-{r}" for j in range(3) for r in range(100)]
    revs = await asyncio.gather(*(b.put(k, f"v{k}") for k in keys))
    # 3 partitions x 100 puts at 50 per Txn: 6 batches, 6 revisions.
    assert b.batches == 6
    assert len(set(revs)) == 6 and backend.revision == before + 6
    for j in range(3):
        got = await c.get_prefix(f"/jobs/{j}/")
        assert [kv.value for kv in got] == [f"v/jobs/{j}/rank-{r}".encode() for r in sorted(
            range(100), key=lambda r: f"rank-{r}")]


async def test_a_key_twice_goes_in_two_batches_and_the_last_value_stays(
    client: tuple[AccordClient, LocalBackend]
) -> None:
    c, _ = client
    b = c.batcher()
    r1, r2, r3 = await asyncio.gather(b.put("/a/b/k", "1"), b.put("/a/b/j", "x"),
                                      b.put("/a/b/k", "2"))
    assert r1 == r2 < r3
    kv = await c.get("/a/b/k")
    assert kv is not None and kv.value == b"2"


async def test_a_bad_put_fails_alone_and_the_rest_of_its_batch_is_written(
    client: tuple[AccordClient, LocalBackend]
) -> None:
    c, _ = client
    b = c.batcher()
    good = [b.put(f"/p/q/{i}", "ok") for i in range(5)]
    bad = b.put("/p/q/leased", "x", lease=12345)  # no such lease
    huge = b.put("/p/q/huge", b"x" * (2 * 1024 * 1024))  # over the request limit
    results = await asyncio.gather(*good, bad, huge, return_exceptions=True)
    assert all(isinstance(r, int) for r in results[:5])
    assert isinstance(results[5], LeaseNotFound)
    assert isinstance(results[6], ClientError) and not isinstance(results[6], LeaseNotFound)
    assert len(await c.get_prefix("/p/q/")) == 5


async def test_put_many_cuts_by_partition_keeps_key_order_and_reports_failures(
    client: tuple[AccordClient, LocalBackend]
) -> None:
    from accord.client.batch import BatchPutError

    c, backend = client
    b = c.batcher(max_ops=10)
    items = [(f"/m/{i % 2}/k{i % 15}", f"v{i}") for i in range(60)]
    revs = await b.put_many(items)
    assert len(revs) == 60 and all(r > 0 for r in revs)
    for key in {k for k, _ in items}:  # the last value given for each key stays
        last = [v for k, v in items if k == key][-1]
        kv = await c.get(key)
        assert kv is not None and kv.value == last.encode()
    before = backend.revision
    with pytest.raises(BatchPutError) as e:
        await b.put_many([("/m/x/a", "1"), ("/m/x/b", b"x" * (2 * 1024 * 1024)), ("/m/x/c", "3")])
    assert set(e.value.failures) == {1}
    assert e.value.revisions[0] > before and e.value.revisions[2] > before
    assert (await c.get("/m/x/c")) is not None and (await c.get("/m/x/b")) is None
