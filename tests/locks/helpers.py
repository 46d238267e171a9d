"""Shared helpers for lock tests: a counting store wrapper, lease and read shortcuts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from accord.locks import keys
from accord.locks.store import BackendLockStore
from accord.proto import kv_pb2, rpc_pb2
from accord.services.kv.local import LocalBackend


class CountingStore(BackendLockStore):
    """A backend store that counts each waiter's wake-ups (returns of ``wait_change``)."""

    def __init__(self, backend: LocalBackend) -> None:
        super().__init__(backend)
        self.wakeups: dict[bytes, int] = {}

    async def wait_change(
        self, ranges: Sequence[tuple[bytes, bytes]], after_revision: int, timeout: float
    ) -> list[kv_pb2.Event]:
        events = await super().wait_change(ranges, after_revision, timeout)
        own = ranges[-1][0]
        self.wakeups[own] = self.wakeups.get(own, 0) + 1
        return events


async def grant(backend: LocalBackend, ttl: int = 30) -> int:
    """A fresh lease id."""
    return int((await backend.lease_grant(rpc_pb2.LeaseGrantRequest(TTL=ttl))).ID)


async def revoke(backend: LocalBackend, lease: int) -> None:
    """Revoke ``lease`` (its keys go in the same apply, as on expiry)."""
    await backend.lease_revoke(rpc_pb2.LeaseRevokeRequest(ID=lease))


async def get(backend: LocalBackend, key: bytes) -> kv_pb2.KeyValue | None:
    resp = await backend.range(rpc_pb2.RangeRequest(key=key))
    return resp.kvs[0] if resp.kvs else None


async def queue(backend: LocalBackend, name: bytes) -> list[kv_pb2.KeyValue]:
    p = keys.prefix(name)
    resp = await backend.range(rpc_pb2.RangeRequest(key=p, range_end=keys.prefix_end(p)))
    return sorted(resp.kvs, key=lambda kv: kv.create_revision)


async def settle(rounds: int = 60) -> None:
    """Let every runnable task run (the in-process store answers without real I/O)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
