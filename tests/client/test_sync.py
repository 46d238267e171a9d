"""The blocking wrapper, driven from a worker thread against an in-process server."""

from __future__ import annotations

import asyncio

import pytest

from accord.client import FencedWriteRejected
from accord.client.sync import SyncClient
from tests.locks.inproc import serve_local


async def test_sync_client_lock_and_kv_from_a_thread() -> None:
    async with serve_local() as (endpoint, _backend):

        def work() -> tuple[int, int]:
            with SyncClient([endpoint]) as c:
                c.put("a", "1")
                assert c.get("a").value == b"1"  # type: ignore[union-attr]
                with c.lock("jobs/9", ttl=2) as first:
                    first.guarded_put("state/9", "x")
                with c.lock("jobs/9", ttl=2) as second:
                    with pytest.raises(FencedWriteRejected):
                        first.guarded_put("state/9", "stale")
                    assert not second.lost.is_set()
                assert c.delete("a").deleted == 1
                return first.token, second.token

        t1, t2 = await asyncio.to_thread(work)
        assert t2 > t1
