"""``AccordClient``: the asyncio client of an accord (or etcd) cluster — one object for
everything the cluster offers.

::

    async with await AccordClient.connect(["127.0.0.1:2379"]) as client:  # discovers members
        await client.put("config/a", "1")
        res = await client.range("config/", prefix=True, limit=10)
        async for event in client.watch("config/", prefix=True, start_revision=res.revision + 1):
            ...
        job = await client.scheduler.submit(JobSpec(tasks=2, devices_per_task=8))
        async with client.lock("/jobs/7/lock", ttl=10) as lock:
            await lock.guarded_put("/jobs/7/state", "running")   # fenced by lock.token

KV calls are methods of the client (``range``, ``get``, ``put``, ``delete``, ``txn``,
``compact``, ``watch``, leases, locks, elections, the put batcher); the other services
are namespaces: ``client.cluster`` (:mod:`accord.client.cluster`), ``client.scheduler``
(:mod:`accord.client.scheduling`), ``client.membership``
(:mod:`accord.client.membership`). Results are frozen dataclasses. Every call carries a
deadline (``call_timeout_s`` or its own ``timeout=``) and fails over across endpoints;
what is retried is said in :mod:`accord.client.retry`. Errors are
:class:`~accord.client.errors.ClientError` and its few subclasses.
:mod:`accord.client.sync` is the blocking twin of the same shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

import grpc

from accord.client import stubs
from accord.client.batch import DEFAULT_MAX_OPS, PutBatcher
from accord.client.checkpoints import Checkpoints
from accord.client.cluster import ClusterApi
from accord.client.election import Election
from accord.client.errors import ClientError, LeaseNotFound
from accord.client.kv import (
    CompactResult,
    Data,
    DeleteResult,
    EventType,
    KeyValue,
    LeaseGrant,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    Txn,
    TxnResult,
    delete_request,
    put_request,
    range_request,
)
from accord.client.lock import Lock
from accord.client.lockstore import ClientLockStore
from accord.client.membership import MembershipApi
from accord.client.retry import RetryPolicy
from accord.client.scheduling import SchedulerApi
from accord.client.session import Session
from accord.client.tls import TLSOptions
from accord.client.transport import EndpointPool
from accord.client.watch import Watch
from accord.locks.recipe import DEFAULT_RECHECK_S
from accord.proto import rpc_pb2


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
        retry_budget_s: float = 30.0, connect_timeout_s: float = 2.0,
        retry_policy: RetryPolicy | None = None, recheck_s: float = DEFAULT_RECHECK_S,
        cacert: str | None = None, cert: str | None = None, key: str | None = None,
        tls: TLSOptions | None = None,
    ) -> None:
        eps = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        if tls is not None and (cacert or cert or key):
            raise ValueError("give either tls=TLSOptions(...) or cacert/cert/key, not both")
        if tls is None and (cacert or cert or key):
            tls = TLSOptions(cacert=cacert, cert=cert, key=key)
        self._pool = EndpointPool(eps, call_timeout_s=call_timeout_s,
                                  retry_budget_s=retry_budget_s,
                                  connect_timeout_s=connect_timeout_s, policy=retry_policy,
                                  tls=tls)
        self._lock_store = ClientLockStore(self)
        self.recheck_s = recheck_s
        self.cluster = ClusterApi(self._pool)
        """Members, their status, leader, alarms, defragment, snapshot, move leader."""
        self.scheduler = SchedulerApi(self._pool)
        """The GPU scheduler: jobs, placements, nodes."""
        self.membership = MembershipApi(self._pool)
        """SWIM members, their states, and membership events."""
        self.checkpoints = Checkpoints(self._pool)
        """The checkpoint manifest service: ``await client.checkpoints.manifest(job)``
        (accord/client/checkpoints.py)."""
        self._watches: set[Watch] = set()

    @classmethod
    async def connect(cls, endpoints: Sequence[str] | str, *, discover: bool = True,
                      **options: Any) -> AccordClient:
        """A client that (with ``discover``) also knows every member's endpoint, learnt
        from whichever given endpoint answers first."""
        client = cls(endpoints, **options)
        if discover:
            try:
                await client.discover()
            except BaseException:
                await client.close()
                raise
        return client

    async def discover(self) -> list[str]:
        """Add every member's client endpoint; the endpoints that were new."""
        return await self.cluster.discover()

    @property
    def pool(self) -> EndpointPool:
        """The endpoints, with failover, deadlines and the retry policy."""
        return self._pool

    @property
    def lock_store(self) -> ClientLockStore:
        """The KV operations the lock and election recipes run on."""
        return self._lock_store

    @property
    def endpoints(self) -> list[str]:
        """The endpoints the client knows (given and discovered)."""
        return list(self._pool.endpoints)

    # --- raw calls (the helpers' protocol, accord.client.base) ---------------------------
    async def range_raw(self, req: rpc_pb2.RangeRequest, *,
                        timeout: float | None = None) -> rpc_pb2.RangeResponse:
        """A Range request as protobuf (retried: reads are idempotent)."""
        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.RangeResponse:
            r: rpc_pb2.RangeResponse = await stubs.kv(ch).Range(req, timeout=t)
            return r
        return await self._pool.call(call, idempotent=True, timeout=timeout)

    async def txn_raw(self, req: rpc_pb2.TxnRequest, *, idempotent: bool = False,
                      timeout: float | None = None) -> rpc_pb2.TxnResponse:
        """A Txn request as protobuf. ``idempotent=True`` only for a txn whose repetition
        is harmless (a read-only txn, a guarded write that fails its guard the second
        time): then it is retried after a lost answer."""
        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.TxnResponse:
            r: rpc_pb2.TxnResponse = await stubs.kv(ch).Txn(req, timeout=t)
            return r
        read_only = all(op.HasField("request_range") for op in (*req.success, *req.failure))
        return await self._pool.call(call, idempotent=idempotent or read_only, timeout=timeout)

    # --- KV --------------------------------------------------------------------------------
    async def range(
        self, key: Data, range_end: Data | None = None, *, prefix: bool = False,
        from_key: bool = False, limit: int = 0, revision: int = 0,
        sort_order: SortOrder = SortOrder.NONE, sort_target: SortTarget = SortTarget.KEY,
        serializable: bool = False, keys_only: bool = False, count_only: bool = False,
        min_mod_revision: int = 0, max_mod_revision: int = 0, min_create_revision: int = 0,
        max_create_revision: int = 0, timeout: float | None = None,
    ) -> RangeResult:
        """Keys of ``key``, ``[key, range_end)``, a ``prefix`` or everything ``from_key``,
        with every etcd option (linearizable unless ``serializable``)."""
        req = range_request(
            key, range_end, prefix=prefix, from_key=from_key, limit=limit, revision=revision,
            sort_order=sort_order, sort_target=sort_target, serializable=serializable,
            keys_only=keys_only, count_only=count_only, min_mod_revision=min_mod_revision,
            max_mod_revision=max_mod_revision, min_create_revision=min_create_revision,
            max_create_revision=max_create_revision)
        return RangeResult.from_pb(await self.range_raw(req, timeout=timeout))

    async def get(self, key: Data, *, revision: int = 0, serializable: bool = False,
                  timeout: float | None = None) -> KeyValue | None:
        """The key-value at ``key``, or ``None``."""
        r = await self.range(key, revision=revision, serializable=serializable, timeout=timeout)
        return r.kvs[0] if r.kvs else None

    async def get_prefix(self, prefix: Data, *, timeout: float | None = None) -> list[KeyValue]:
        """Every key-value under ``prefix``, in key order."""
        return list((await self.range(prefix, prefix=True, timeout=timeout)).kvs)

    async def put(self, key: Data, value: Data, *, lease: int = 0, prev_kv: bool = False,
                  ignore_value: bool = False, ignore_lease: bool = False,
                  timeout: float | None = None) -> PutResult:
        """Write ``key``; the revision (and with ``prev_kv`` the previous key-value).

        Not retried once it may have reached a server: a lost answer raises
        :class:`~accord.client.errors.OutcomeUnknown`."""
        req = put_request(key, value, lease=lease, prev_kv=prev_kv, ignore_value=ignore_value,
                          ignore_lease=ignore_lease)

        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.PutResponse:
            r: rpc_pb2.PutResponse = await stubs.kv(ch).Put(req, timeout=t)
            return r
        return PutResult.from_pb(await self._pool.call(call, idempotent=False, timeout=timeout))

    async def delete(self, key: Data, range_end: Data | None = None, *, prefix: bool = False,
                     from_key: bool = False, prev_kv: bool = False,
                     timeout: float | None = None) -> DeleteResult:
        """Delete a key, a range or a prefix; how many keys went (and with ``prev_kv``
        their last values). Not retried once it may have reached a server."""
        req = delete_request(key, range_end, prefix=prefix, from_key=from_key, prev_kv=prev_kv)

        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.DeleteRangeResponse:
            r: rpc_pb2.DeleteRangeResponse = await stubs.kv(ch).DeleteRange(req, timeout=t)
            return r
        return DeleteResult.from_pb(await self._pool.call(call, idempotent=False,
                                                          timeout=timeout))

    def txn(self, *, timeout: float | None = None) -> Txn[Coroutine[Any, Any, TxnResult]]:
        """A transaction builder: ``await client.txn().if_(...).then(...).else_(...).commit()``
        (see :mod:`accord.client.kv`)."""
        async def send(req: rpc_pb2.TxnRequest) -> TxnResult:
            return TxnResult.from_pb(await self.txn_raw(req, timeout=timeout))
        return Txn(send)

    async def compact(self, revision: int, *, physical: bool = False,
                      timeout: float | None = None) -> CompactResult:
        """Drop the history before ``revision`` (``physical``: wait until it is gone)."""
        req = rpc_pb2.CompactionRequest(revision=revision, physical=physical)

        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.CompactionResponse:
            r: rpc_pb2.CompactionResponse = await stubs.kv(ch).Compact(req, timeout=t)
            return r
        r = await self._pool.call(call, idempotent=False, timeout=timeout)
        return CompactResult(int(r.header.revision))

    def watch(
        self, key: Data, range_end: Data | None = None, *, prefix: bool = False,
        from_key: bool = False, start_revision: int = 0, prev_kv: bool = False,
        filters: Iterable[EventType] = (), on_progress: Callable[[int], None] | None = None,
        require_leader: bool = True,
    ) -> Watch:
        """Events of a key, range or prefix from ``start_revision`` (0: from now), as an
        async iterator that resumes across member failures (see :mod:`accord.client.watch`)."""
        w = Watch(self._pool, key, range_end, prefix=prefix, from_key=from_key,
                  start_revision=start_revision, prev_kv=prev_kv, filters=filters,
                  on_progress=on_progress,
                  require_leader=require_leader, on_close=self._watches.discard)
        self._watches.add(w)
        return w

    def batcher(self, *, max_ops: int = DEFAULT_MAX_OPS, max_in_flight: int = 64) -> PutBatcher:
        """A :class:`~accord.client.batch.PutBatcher`: concurrent puts sent as Txns of up
        to ``max_ops`` puts per partition (one round trip and one fsync per batch)."""
        return PutBatcher(self, max_ops=max_ops, max_in_flight=max_in_flight)

    # --- leases ---------------------------------------------------------------------------
    async def lease_grant(self, ttl: int, *, timeout: float | None = None) -> LeaseGrant:
        """Grant a lease of ``ttl`` seconds (no keepalive: see :meth:`lease`).

        Retried after a lost answer: a lease granted twice leaves one unused lease with
        no keys, which expires after its TTL."""
        if ttl <= 0:
            raise ValueError(f"a lease needs a positive TTL in seconds, got {ttl}")

        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.LeaseGrantResponse:
            r: rpc_pb2.LeaseGrantResponse = await stubs.lease(ch).LeaseGrant(
                rpc_pb2.LeaseGrantRequest(TTL=ttl), timeout=t)
            return r
        r = await self._pool.call(call, idempotent=True, timeout=timeout)
        if r.error:
            raise ClientError(grpc.StatusCode.FAILED_PRECONDITION, r.error,
                              endpoint=self._pool.current)
        return LeaseGrant(int(r.ID), int(r.TTL))

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke a lease (its keys are deleted). Retried after a lost answer: a retry
        that finds the lease gone counts as done."""
        attempts = 0

        async def call(ch: grpc.aio.Channel, t: float) -> None:
            nonlocal attempts
            attempts += 1
            try:
                await stubs.lease(ch).LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lease_id),
                                                  timeout=t)
            except grpc.aio.AioRpcError as e:
                if attempts > 1 and e.code() == grpc.StatusCode.NOT_FOUND:
                    return  # the earlier attempt revoked it
                raise
        await self._pool.call(call, idempotent=True, timeout=timeout)

    async def lease_ttl(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Seconds left on a lease (:class:`LeaseNotFound` when it is gone)."""
        async def call(ch: grpc.aio.Channel, t: float) -> rpc_pb2.LeaseTimeToLiveResponse:
            r: rpc_pb2.LeaseTimeToLiveResponse = await stubs.lease(ch).LeaseTimeToLive(
                rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id), timeout=t)
            return r
        r = await self._pool.call(call, idempotent=True, timeout=timeout)
        if r.TTL < 0:
            raise LeaseNotFound(grpc.StatusCode.NOT_FOUND,
                                f"etcdserver: requested lease not found ({lease_id:x})")
        return int(r.TTL)

    def lease(self, ttl: int) -> Session:
        """A session: a lease renewed in the background (``async with client.lease(10)``)."""
        return Session(self, ttl)

    # --- locks and elections ----------------------------------------------------------------
    def lock(self, name: Data, *, ttl: int = 10, lock_delay: float = 0.0,
             session: Session | None = None) -> Lock:
        """A fenced lock: ``async with client.lock("jobs/7", ttl=10) as lock``."""
        return Lock(self, name, ttl=ttl, lock_delay=lock_delay, session=session,
                    recheck_s=self.recheck_s)

    def election(self, name: Data, *, ttl: int = 10) -> Election:
        """A participant in the election ``name``."""
        return Election(self, name, ttl=ttl, recheck_s=self.recheck_s)

    # --- lifetime -------------------------------------------------------------------------
    async def close(self) -> None:
        """End every watch of this client, then close the channels."""
        for w in list(self._watches):
            with contextlib.suppress(Exception):
                await w.close()
        with contextlib.suppress(Exception):
            await self.scheduler.close()
        await self._pool.close()

    async def __aenter__(self) -> AccordClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
