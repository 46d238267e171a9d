"""What the lock recipes need from the KV store, and that port on a server-side backend.

The recipes in :mod:`accord.locks.recipe` and :mod:`accord.locks.election` run the same
code in the server (the v3lock/v3election servicers, on a
:class:`~accord.services.kv.backend.Backend`) and in the client library (over gRPC, in
:mod:`accord.client.lockstore`). They only need Txn, Range, lease grant and a *hint* that
something changed: :meth:`LockStore.wait_change` may return early or late, and with or
without the events it saw, because the recipes re-read the store after every wake-up;
correctness never rests on a watch event (election observers use the events to report
every proclaimed value, and fall back to a re-read when none come).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Protocol

from accord.proto import kv_pb2, rpc_pb2
from accord.services.kv.backend import Backend


class LockStore(Protocol):
    """The KV operations the lock and election recipes use."""

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """Commit a transaction (through consensus)."""

    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """A linearizable read."""

    async def lease_grant(self, ttl: int) -> int:
        """Grant a lease of ``ttl`` seconds; its id."""

    async def wait_change(
        self, ranges: Sequence[tuple[bytes, bytes]], after_revision: int, timeout: float
    ) -> list[kv_pb2.Event]:
        """Once any key in ``ranges`` changed after ``after_revision``: the events seen.

        Returns ``[]`` on timeout or when the watch broke.
        """


class BackendLockStore:
    """:class:`LockStore` on a server-side backend and its member-local watch hub."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """Through the backend (Raft on a replicated node)."""
        return await self.backend.txn(req)

    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """Linearizable read through the backend."""
        return await self.backend.range(req)

    async def lease_grant(self, ttl: int) -> int:
        """Grant a lease through the backend."""
        resp = await self.backend.lease_grant(rpc_pb2.LeaseGrantRequest(TTL=ttl))
        return int(resp.ID)

    async def wait_change(
        self, ranges: Sequence[tuple[bytes, bytes]], after_revision: int, timeout: float
    ) -> list[kv_pb2.Event]:
        """Watch ``ranges`` on this member's hub from ``after_revision + 1``."""
        hub = self.backend.watch_hub
        watchers = [hub.watch(k, e, start_revision=after_revision + 1) for k, e in ranges]
        tasks = [asyncio.ensure_future(w.next_batch(max_events=16)) for w in watchers]
        try:
            done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t in done and not t.cancelled() and t.exception() is None:
                    batch = t.result()
                    if not batch.canceled:
                        return list(batch.events)
            return []
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            for w in watchers:
                w.close()
