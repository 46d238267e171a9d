"""The lock recipes' :class:`~accord.locks.store.LockStore` over the client's gRPC calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from accord.client import stubs
from accord.proto import kv_pb2, rpc_pb2

if TYPE_CHECKING:
    from accord.client.base import ClientCalls


class ClientLockStore:
    """Txn, Range and lease grant through the endpoint pool; watches as wake-up hints."""

    def __init__(self, client: ClientCalls) -> None:
        self._client = client

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """Commit a transaction (with failover). The recipes' transactions are guarded
        (a retry after an unseen success fails its guard, which the recipes read as
        "already done"), so they are retried like reads."""
        return await self._client.txn_raw(req, idempotent=True)

    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """Linearizable read (with failover)."""
        return await self._client.range_raw(req)

    async def lease_grant(self, ttl: int) -> int:
        """Grant a lease; its id."""
        return (await self._client.lease_grant(ttl)).id

    async def wait_change(
        self, ranges: Sequence[tuple[bytes, bytes]], after_revision: int, timeout: float
    ) -> list[kv_pb2.Event]:
        """Watch ``ranges`` from ``after_revision + 1`` on the current endpoint.

        Returns the first events, or ``[]`` on a cancel, on any stream error (after
        failing over) or after ``timeout``: the caller re-reads the store in every case.
        """
        pool = self._client.pool
        endpoint = pool.current
        call = stubs.watch(pool.channel()).Watch()
        try:
            async with asyncio.timeout(timeout):
                for key, end in ranges:
                    await call.write(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                        key=key, range_end=end, start_revision=after_revision + 1,
                    )))
                while True:
                    resp = await call.read()
                    if not isinstance(resp, rpc_pb2.WatchResponse):
                        return []
                    if resp.events:
                        return list(resp.events)
                    if resp.canceled or resp.compact_revision:
                        return []
        except TimeoutError:
            return []
        except grpc.aio.AioRpcError:
            pool.fail_over(endpoint)
            await asyncio.sleep(0.05)
        finally:
            with contextlib.suppress(Exception):
                call.cancel()
        return []
