"""What the client's helpers need of the client: the calls sessions, locks, elections
and the put batcher are built on.

``AccordClient`` (``client.py``) builds those helpers and satisfies this protocol; the
helpers depend on the protocol, not on the client, so no helper module imports the
client module that imports it.
"""

from __future__ import annotations

from typing import Protocol

from accord.client.transport import EndpointPool
from accord.locks.store import LockStore
from accord.proto import rpc_pb2


class ClientCalls(Protocol):
    """The raw calls of an ``AccordClient`` that its helpers use."""

    @property
    def pool(self) -> EndpointPool:
        """The endpoints, with failover and deadlines."""
        ...

    @property
    def lock_store(self) -> LockStore:
        """The KV operations the lock and election recipes run on."""
        ...

    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """A Range request."""
        ...

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """A Txn request."""
        ...

    async def put(self, key: bytes | str, value: bytes | str, *, lease: int = 0) -> int:
        """Write ``key``; the revision of the write."""
        ...

    async def lease_grant(self, ttl: int) -> rpc_pb2.LeaseGrantResponse:
        """Grant a lease of ``ttl`` seconds."""
        ...

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease."""
        ...
