"""``AccordClient``: the asyncio client of an accord (or etcd) cluster.

::

    async with AccordClient(["127.0.0.1:2379", "127.0.0.1:22379"]) as client:
        await client.put("config/a", "1")
        async with client.lock("/jobs/7/lock", ttl=10) as lock:
            await lock.guarded_put("/jobs/7/state", "running")   # fenced by lock.token

Every call fails over across the endpoints and retries on ``UNAVAILABLE`` and deadlines
(see :mod:`accord.client.transport`); errors are :class:`~accord.client.errors.ClientError`
and the lock errors of :mod:`accord.locks.errors`.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from accord.client import stubs
from accord.client.batch import DEFAULT_MAX_OPS, PutBatcher
from accord.client.checkpoints import Checkpoints
from accord.client.election import Election
from accord.client.lock import Lock
from accord.client.lockstore import ClientLockStore
from accord.client.session import Session
from accord.client.tls import TLSOptions
from accord.client.transport import EndpointPool
from accord.locks.keys import prefix_end
from accord.locks.recipe import DEFAULT_RECHECK_S
from accord.proto import kv_pb2, rpc_pb2


def _b(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


class AccordClient:
    """A connection to a cluster through a list of endpoints (``host:port``).

    TLS as etcdctl: ``https://`` endpoints (or any endpoint once a TLS option is given)
    dial TLS, trusting ``cacert`` (else the system's roots) and presenting the client
    certificate ``cert``/``key`` when given::

        AccordClient(["https://10.0.0.1:2379"], cacert="ca.crt", cert="me.crt", key="me.key")

    ``tls`` passes the same as one ``TLSOptions`` (the two ways may not be mixed).
    """

    def __init__(
        self, endpoints: Sequence[str] | str, *, call_timeout_s: float = 5.0,
        retry_budget_s: float = 30.0, recheck_s: float = DEFAULT_RECHECK_S,
        cacert: str | None = None, cert: str | None = None, key: str | None = None,
        tls: TLSOptions | None = None,
    ) -> None:
        eps = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        if tls is not None and (cacert or cert or key):
            raise ValueError("give either tls=TLSOptions(...) or cacert/cert/key, not both")
        if tls is None and (cacert or cert or key):
            tls = TLSOptions(cacert=cacert, cert=cert, key=key)
        self.pool = EndpointPool(eps, call_timeout_s=call_timeout_s, retry_budget_s=retry_budget_s,
                                 tls=tls)
        self.lock_store = ClientLockStore(self)
        self.recheck_s = recheck_s
        # --- checkpoint manifests (accord/client/checkpoints.py) ---
        self.checkpoints = Checkpoints(self.pool)
        """The checkpoint manifest service: ``await client.checkpoints.manifest(job)``."""

    # --- raw calls ------------------------------------------------------------------------
    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """A Range request (linearizable unless ``req.serializable``)."""
        async def call(ch: grpc.aio.Channel, timeout: float) -> rpc_pb2.RangeResponse:
            r: rpc_pb2.RangeResponse = await stubs.kv(ch).Range(req, timeout=timeout)
            return r
        return await self.pool.call(call)

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """A Txn request."""
        async def call(ch: grpc.aio.Channel, timeout: float) -> rpc_pb2.TxnResponse:
            r: rpc_pb2.TxnResponse = await stubs.kv(ch).Txn(req, timeout=timeout)
            return r
        return await self.pool.call(call)

    # --- KV helpers -----------------------------------------------------------------------
    async def get(self, key: bytes | str) -> kv_pb2.KeyValue | None:
        """The key-value at ``key``, or ``None``."""
        resp = await self.range(rpc_pb2.RangeRequest(key=_b(key)))
        return resp.kvs[0] if resp.kvs else None

    async def get_prefix(self, prefix: bytes | str) -> list[kv_pb2.KeyValue]:
        """Every key-value under ``prefix``, in key order."""
        p = _b(prefix)
        resp = await self.range(rpc_pb2.RangeRequest(key=p, range_end=prefix_end(p)))
        return list(resp.kvs)

    async def put(self, key: bytes | str, value: bytes | str, *, lease: int = 0) -> int:
        """Write ``key``; the revision of the write."""
        async def call(ch: grpc.aio.Channel, timeout: float) -> int:
            r = await stubs.kv(ch).Put(
                rpc_pb2.PutRequest(key=_b(key), value=_b(value), lease=lease), timeout=timeout
            )
            return int(r.header.revision)
        return await self.pool.call(call)

    async def delete(self, key: bytes | str) -> int:
        """Delete ``key``; how many keys were deleted (0 or 1)."""
        async def call(ch: grpc.aio.Channel, timeout: float) -> int:
            r = await stubs.kv(ch).DeleteRange(
                rpc_pb2.DeleteRangeRequest(key=_b(key)), timeout=timeout
            )
            return int(r.deleted)
        return await self.pool.call(call)

    def batcher(self, *, max_ops: int = DEFAULT_MAX_OPS, max_in_flight: int = 64) -> PutBatcher:
        """A :class:`~accord.client.batch.PutBatcher`: concurrent puts sent as Txns of up
        to ``max_ops`` puts per partition (one round trip and one fsync per batch)."""
        return PutBatcher(self, max_ops=max_ops, max_in_flight=max_in_flight)

    # --- leases ---------------------------------------------------------------------------
    async def lease_grant(self, ttl: int) -> rpc_pb2.LeaseGrantResponse:
        """Grant a lease of ``ttl`` seconds (no keepalive: see :meth:`lease`)."""
        async def call(ch: grpc.aio.Channel, timeout: float) -> rpc_pb2.LeaseGrantResponse:
            r: rpc_pb2.LeaseGrantResponse = await stubs.lease(ch).LeaseGrant(
                rpc_pb2.LeaseGrantRequest(TTL=ttl), timeout=timeout
            )
            return r
        return await self.pool.call(call)

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys are deleted)."""
        async def call(ch: grpc.aio.Channel, timeout: float) -> None:
            await stubs.lease(ch).LeaseRevoke(
                rpc_pb2.LeaseRevokeRequest(ID=lease_id), timeout=timeout
            )
        await self.pool.call(call)

    def lease(self, ttl: int) -> Session:
        """A session: a lease renewed in the background (``async with client.lease(10)``)."""
        return Session(self, ttl)

    # --- locks and elections ----------------------------------------------------------------
    def lock(self, name: bytes | str, *, ttl: int = 10, lock_delay: float = 0.0,
             session: Session | None = None) -> Lock:
        """A fenced lock: ``async with client.lock("jobs/7", ttl=10) as lock``."""
        return Lock(self, name, ttl=ttl, lock_delay=lock_delay, session=session,
                    recheck_s=self.recheck_s)

    def election(self, name: bytes | str, *, ttl: int = 10) -> Election:
        """A participant in the election ``name``."""
        return Election(self, name, ttl=ttl, recheck_s=self.recheck_s)

    # --- lifetime -------------------------------------------------------------------------
    async def close(self) -> None:
        """Close the channels."""
        await self.pool.close()

    async def __aenter__(self) -> AccordClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
