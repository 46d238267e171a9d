"""What the client's helpers need of the client: the calls sessions, locks, elections
and the put batcher are built on.

``AccordClient`` (``client.py``) builds those helpers and satisfies this protocol; the
helpers depend on the protocol, not on the client, so no helper module imports the
client module that imports it.
"""

from __future__ import annotations

from typing import Protocol

from accord.client.kv import LeaseGrant, PutResult
from accord.client.transport import EndpointPool
from accord.locks.store import LockStore
from accord.proto import rpc_pb2


class ClientCalls(Protocol):
    """The raw calls of an ``AccordClient`` that its helpers use."""

    @property
    def pool(self) -> EndpointPool:
        """The endpoints, with failover and deadlines."""

    @property
    def lock_store(self) -> LockStore:
        """The KV operations the lock and election recipes run on."""

    async def range_raw(self, req: rpc_pb2.RangeRequest, *,
                        timeout: float | None = None) -> rpc_pb2.RangeResponse:
        """A Range request (retried: reads are idempotent)."""

    async def txn_raw(self, req: rpc_pb2.TxnRequest, *, idempotent: bool = False,
                      timeout: float | None = None) -> rpc_pb2.TxnResponse:
        """A Txn request (``idempotent``: safe to send again after a lost answer)."""

    async def put(self, key: bytes | str, value: bytes | str, *, lease: int = 0,
                  prev_kv: bool = False, ignore_value: bool = False,
                  ignore_lease: bool = False, timeout: float | None = None) -> PutResult:
        """Write ``key``; the revision of the write."""

    async def lease_grant(self, ttl: int, *, timeout: float | None = None) -> LeaseGrant:
        """Grant a lease of ``ttl`` seconds."""

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke a lease."""
