"""The workloads of the load generator, as run inside one worker process.

A :class:`Worker` keeps one ``grpc.aio`` channel per endpoint and the state that
outlives a run (seeded read keys, granted leases). :meth:`Worker.prepare` does a
spec's setup and returns the coroutine that runs it between two monotonic instants;
see ``bench/loadgen.py`` for the workloads' definitions.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from accord.client.tls import TLSOptions, aio_channel, split_endpoint
from accord.proto import rpc_pb2
from accord.proto import rpc_pb2_grpc as _rpc_grpc
from accord.services.kv.sharding import shard_of
from bench.loadgen import READ_KEYS, RPC_TIMEOUT, Spec, random_value, share, stamp, unstamp

rpc_pb2_grpc: Any = _rpc_grpc  # generated stubs are untyped

SEED_CONCURRENCY = 64
SCAN_KEYS = 16
"""Keys of the ``scan`` workload, one per partition (so spread over every shard)."""
LEASE_TTL = 3600


@dataclass(slots=True)
class RunResult:
    """One worker's figures for one run."""

    ops: int = 0
    errors: int = 0
    latencies: array.array[float] = field(default_factory=lambda: array.array("d"))
    kinds: Counter[str] = field(default_factory=Counter)
    extra: Counter[str] = field(default_factory=Counter)
    end: float = 0.0

    def error(self, e: BaseException) -> None:
        self.errors += 1
        code = e.code().name if isinstance(e, grpc.RpcError) else type(e).__name__
        self.kinds[str(code)] += 1


Op = Callable[[], Awaitable[None]]
Runner = Callable[[float, float], Awaitable[RunResult]]


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def closed_loop(ops: list[Op], start: float, end: float) -> RunResult:
    """Each op in its own task, back to back, from ``start`` to ``end``."""
    res = RunResult()

    async def client(op: Op) -> None:
        await _sleep_until(start)
        mono = time.monotonic
        while True:
            t0 = mono()
            if t0 >= end:
                return
            try:
                await op()
            except Exception as e:  # counted, then the client goes on
                if mono() <= end:
                    res.error(e)
                await asyncio.sleep(0.01)
                continue
            t1 = mono()
            if t1 <= end:
                res.ops += 1
                res.latencies.append(t1 - t0)

    await asyncio.gather(*(client(op) for op in ops))
    res.end = end
    return res


class _Token(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``token`` metadata to every call (an authenticated etcd client)."""

    def __init__(self, token: str) -> None:
        self.md = (("token", token),)

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=tuple(details.metadata or ()) + self.md)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_stream(self, continuation: Any, details: Any,
                                      request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)



def _next_on_another_shard(name: Callable[[int], bytes], home: bytes, start: int,
                           shards: int) -> int:
    """The least ``i >= start`` whose ``name(i)`` an accord of ``shards`` shards keeps
    on another shard than ``home``."""
    i = start
    while shard_of(name(i), shards) == shard_of(home, shards):
        i += 1
    return i


def second_partition(first: str = "bench", shards: int = 8) -> str:
    """A relative partition name that an accord of ``shards`` shards keeps on another
    shard than ``first``'s (``sharding.partition_key``: a relative key's first segment)."""
    i = _next_on_another_shard(lambda i: f"{first}{i}/".encode(), f"{first}/".encode(), 2,
                               shards)
    return f"{first}{i}"


def two_shard_keys(base: str, shards: int = 8) -> tuple[bytes, bytes]:
    """Two keys of different partitions that an accord of ``shards`` shards (the
    default 8) keeps on different shards."""
    first = f"{base}-0".encode()
    i = _next_on_another_shard(lambda i: f"{base}-{i}".encode(), first, 1, shards)
    return first, f"{base}-{i}".encode()


def cas_request(keys: Sequence[bytes], revs: Sequence[int], value: bytes) -> rpc_pb2.TxnRequest:
    """A compare-and-set over ``keys``: if each is at its revision in ``revs``, put
    ``value`` in all of them, else read them."""
    return rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=k, target=rpc_pb2.Compare.MOD,
                                 result=rpc_pb2.Compare.EQUAL, mod_revision=r)
                 for k, r in zip(keys, revs, strict=True)],
        success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=k, value=value))
                 for k in keys],
        failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=k)) for k in keys],
    )


class Worker:
    """One worker process's channels, state and workloads."""

    def __init__(self, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.tls: TLSOptions | None = None
        self.token = ""
        """The token of the spec being prepared (channels are per endpoint and token)."""
        """How the current spec's endpoints are dialed (set by ``prepare``)."""
        self.seeded: set[tuple[str, ...]] = set()
        self.leases: dict[tuple[str, ...], list[int]] = {}

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        key = f"{endpoint} {self.token}"
        ch = self.channels.get(key)
        if ch is None:
            options = [("grpc.max_receive_message_length", -1)]
            url = f"https://{endpoint}" if self.tls is not None else endpoint
            if self.token:  # an authenticated client: the token on every call
                target, secure = split_endpoint(url, self.tls)
                auth = [_Token(self.token)]
                ch = (grpc.aio.secure_channel(target, (self.tls or TLSOptions()).credentials(),
                                              options=options, interceptors=auth) if secure
                      else grpc.aio.insecure_channel(target, options=options, interceptors=auth))
            else:
                ch = aio_channel(url, self.tls, options)
            self.channels[key] = ch
        return ch

    def kv(self, endpoint: str) -> rpc_pb2_grpc.KVStub:
        return rpc_pb2_grpc.KVStub(self.channel(endpoint))

    async def close(self) -> None:
        for ch in self.channels.values():
            with contextlib.suppress(Exception):
                await ch.close()

    def clients(self, spec: Spec) -> list[tuple[int, str]]:
        """(global client id, endpoint) of this worker's share of ``spec.concurrency``."""
        n = share(spec.concurrency, self.count, self.index)
        out = []
        for j in range(n):
            gid = j * self.count + self.index
            out.append((gid, spec.endpoints[gid % len(spec.endpoints)]))
        return out

    async def prepare(self, spec: Spec) -> Runner:
        """Do ``spec``'s setup; return its runner."""
        self.tls = TLSOptions(*spec.tls) if spec.tls else None
        self.token = spec.token
        make = getattr(self, f"_w_{spec.workload}")
        runner: Runner = await make(spec)
        return runner

    # --- helpers ---------------------------------------------------------------------
    async def _bounded(self, jobs: list[Callable[[], Awaitable[Any]]], width: int) -> None:
        sem = asyncio.Semaphore(width)

        async def one(job: Callable[[], Awaitable[Any]]) -> None:
            async with sem:
                for attempt in range(20):
                    try:
                        await job()
                        return
                    except grpc.RpcError:
                        if attempt == 19:
                            raise
                        await asyncio.sleep(0.1)

        await asyncio.gather(*(one(j) for j in jobs))

    def _read_key(self, spec: Spec, i: int) -> bytes:
        return f"bench/read/{i:06d}".encode()

    async def _seed_reads(self, spec: Spec) -> None:
        key = tuple(spec.endpoints)
        if key in self.seeded:
            return
        value = random_value(spec.value_size)
        kv = self.kv(spec.endpoints[0])
        mine = [i for i in range(READ_KEYS) if i % self.count == self.index]

        def put(i: int) -> Callable[[], Awaitable[Any]]:
            return lambda: kv.Put(rpc_pb2.PutRequest(key=self._read_key(spec, i), value=value),
                                  timeout=RPC_TIMEOUT)
        await self._bounded([put(i) for i in mine], SEED_CONCURRENCY)
        self.seeded.add(key)

    # --- workloads ---------------------------------------------------------------------
    async def _w_put(self, spec: Spec, spread: bool = False) -> Runner:
        value = random_value(spec.value_size)
        ops: list[Op] = []
        for gid, ep in self.clients(spec):
            kv = self.kv(ep)
            keys = [(f"/bench-{spec.tag}/put-{gid}/{i}" if spread
                     else f"bench/{spec.tag}/put/{gid}/{i}").encode() for i in range(100)]
            state = [0]

            async def op(kv: Any = kv, keys: list[bytes] = keys, state: list[int] = state) -> None:
                state[0] += 1
                await kv.Put(rpc_pb2.PutRequest(key=keys[state[0] % 100], value=value),
                             timeout=RPC_TIMEOUT)
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _reads(self, spec: Spec, serializable: bool) -> Runner:
        await self._seed_reads(spec)
        ops: list[Op] = []
        for _gid, ep in self.clients(spec):
            kv = self.kv(ep)

            async def op(kv: Any = kv) -> None:
                key = self._read_key(spec, random.randrange(READ_KEYS))
                r = await kv.Range(rpc_pb2.RangeRequest(key=key, serializable=serializable),
                                   timeout=RPC_TIMEOUT)
                if spec.check and not r.kvs and not serializable:
                    raise RuntimeError(f"seeded key {key!r} missing")
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_sput(self, spec: Spec) -> Runner:
        """``put`` with each client's keys in a partition of its own (``/bench-T/put-G/``),
        so that a sharded accord spreads them over its shards (and a node's workers)."""
        return await self._w_put(spec, spread=True)

    async def _w_get(self, spec: Spec) -> Runner:
        return await self._reads(spec, False)

    async def _w_sget(self, spec: Spec) -> Runner:
        return await self._reads(spec, True)

    async def _w_mixed(self, spec: Spec) -> Runner:
        await self._seed_reads(spec)
        value = random_value(spec.value_size)
        ops: list[Op] = []
        for _gid, ep in self.clients(spec):
            kv = self.kv(ep)

            async def op(kv: Any = kv) -> None:
                key = self._read_key(spec, random.randrange(READ_KEYS))
                if random.random() < 0.1:
                    await kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT)
                else:
                    await kv.Range(rpc_pb2.RangeRequest(key=key), timeout=RPC_TIMEOUT)
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_wscan(self, spec: Spec) -> Runner:
        """``scan``, with one op in ten a Put of one of the scanned keys instead."""
        return await self._w_scan(spec, writes=0.1)

    async def _w_scan(self, spec: Spec, writes: float = 0.0) -> Runner:
        """A linearizable Range over one key in each of ``SCAN_KEYS`` partitions."""
        value = random_value(spec.value_size)
        first = self.kv(spec.endpoints[0])
        for i in range(SCAN_KEYS):
            if i % self.count == self.index:
                await first.Put(rpc_pb2.PutRequest(key=b"/bench-scan-%02d/k" % i, value=value),
                                timeout=RPC_TIMEOUT)
        ops: list[Op] = []
        for _gid, ep in self.clients(spec):
            kv = self.kv(ep)

            async def op(kv: Any = kv) -> None:
                if writes and random.random() < writes:
                    key = b"/bench-scan-%02d/k" % random.randrange(SCAN_KEYS)
                    await kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT)
                    return
                r = await kv.Range(rpc_pb2.RangeRequest(key=b"/bench-scan-",
                                                        range_end=b"/bench-scan."),
                                   timeout=RPC_TIMEOUT)
                if spec.check and len(r.kvs) != SCAN_KEYS:
                    raise RuntimeError(f"a scan found {len(r.kvs)} of {SCAN_KEYS} keys")
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_txn(self, spec: Spec, spread: bool = False) -> Runner:
        value = random_value(spec.value_size)
        ops: list[Op] = []
        for gid, ep in self.clients(spec):
            kv = self.kv(ep)
            key = (f"/bench-{spec.tag}-scas/{gid}" if spread
                   else f"bench/{spec.tag}/cas/{gid}").encode()
            r = await kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT)
            rev = [int(r.header.revision)]

            async def op(kv: Any = kv, key: bytes = key, rev: list[int] = rev) -> None:
                cmp = rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD,
                                      result=rpc_pb2.Compare.EQUAL, mod_revision=rev[0])
                t = await kv.Txn(rpc_pb2.TxnRequest(
                    compare=[cmp],
                    success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value))],
                    failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))],
                ), timeout=RPC_TIMEOUT)
                if t.succeeded:
                    rev[0] = int(t.header.revision)
                else:
                    rev[0] = int(t.responses[0].response_range.kvs[0].mod_revision)
                    raise RuntimeError("compare-and-set lost on a key only this client writes")
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_stxn(self, spec: Spec) -> Runner:
        """``txn`` with each client's key in a partition of its own: one-shard Txns spread
        over the shards as ``txn2``'s are, the one-shard baseline with the same spread."""
        return await self._w_txn(spec, spread=True)

    async def _w_htxn2(self, spec: Spec) -> Runner:
        """``txn2`` with every client's two keys in the same two partitions, on two
        shards: the two-shard Txn at ``txn``'s layout (one shared partition)."""
        return await self._w_txn2(spec, hot=True)

    async def _w_txn2(self, spec: Spec, hot: bool = False) -> Runner:
        value = random_value(spec.value_size)
        ops: list[Op] = []
        other = second_partition()
        for gid, ep in self.clients(spec):
            kv = self.kv(ep)
            pair = ((f"bench/{spec.tag}/cas2/{gid}".encode(),
                     f"{other}/{spec.tag}/cas2/{gid}".encode()) if hot
                    else two_shard_keys(f"/bench-{spec.tag}-cas2/{gid}"))
            revs = []
            for key in pair:
                r = await kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT)
                revs.append(int(r.header.revision))

            async def op(kv: Any = kv, pair: tuple[bytes, bytes] = pair,
                         revs: list[int] = revs) -> None:
                t = await kv.Txn(cas_request(pair, revs, value), timeout=RPC_TIMEOUT)
                if not t.succeeded:
                    raise RuntimeError("compare-and-set lost on keys only this client writes")
                revs[:] = [int(t.header.revision)] * 2
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_lock(self, spec: Spec) -> Runner:
        ops: list[Op] = []
        lease_kv = rpc_pb2_grpc.LeaseStub(self.channel(spec.endpoints[0]))
        g = await lease_kv.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), timeout=RPC_TIMEOUT)
        lease = int(g.ID)
        for gid, ep in self.clients(spec):
            kv = self.kv(ep)
            key = f"bench/{spec.tag}/lock/{gid}/{lease:x}".encode()

            async def op(kv: Any = kv, key: bytes = key) -> None:
                cmp = rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.CREATE,
                                      result=rpc_pb2.Compare.EQUAL, create_revision=0)
                t = await kv.Txn(rpc_pb2.TxnRequest(
                    compare=[cmp],
                    success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(
                        key=key, value=b"", lease=lease))],
                    failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key))],
                ), timeout=RPC_TIMEOUT)
                if not t.succeeded:
                    raise RuntimeError(f"lock {key!r} already held")
                await kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=key), timeout=RPC_TIMEOUT)
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_revoke(self, spec: Spec) -> Runner:
        ops: list[Op] = []
        for gid, ep in self.clients(spec):
            kv = self.kv(ep)
            leases = rpc_pb2_grpc.LeaseStub(self.channel(ep))
            key = f"bench/{spec.tag}/session/{gid}".encode()

            async def op(kv: Any = kv, leases: Any = leases, key: bytes = key) -> None:
                g = await leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), timeout=RPC_TIMEOUT)
                await kv.Put(rpc_pb2.PutRequest(key=key, value=b"up", lease=g.ID),
                             timeout=RPC_TIMEOUT)
                await leases.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=g.ID), timeout=RPC_TIMEOUT)
            ops.append(op)
        return lambda s, e: closed_loop(ops, s, e)

    async def _w_load(self, spec: Spec) -> Runner:
        value = random_value(spec.value_size)
        mine = share(spec.total, self.count, self.index)
        clients = self.clients(spec)
        counter = [0]

        async def run(start: float, end: float) -> RunResult:
            res = RunResult()

            async def client(ep: str) -> None:
                kv = self.kv(ep)
                while counter[0] < mine:
                    i = counter[0]
                    counter[0] += 1
                    key = f"bench/{spec.tag}/mem/{self.index}/{i:08d}".encode()
                    t0 = time.monotonic()
                    for attempt in range(50):
                        try:
                            await kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=RPC_TIMEOUT)
                            break
                        except grpc.RpcError as e:
                            res.error(e)
                            if attempt == 49:
                                raise
                            await asyncio.sleep(0.05)
                    res.ops += 1
                    res.latencies.append(time.monotonic() - t0)

            await _sleep_until(start)
            await asyncio.gather(*(client(ep) for _gid, ep in clients))
            res.end = time.monotonic()
            return res
        return run

    async def _w_watch(self, spec: Spec) -> Runner:
        key = f"bench/{spec.tag}/watch".encode()
        n = share(spec.watchers, self.count, self.index)
        calls: list[Any] = []
        for j in range(n):
            gid = j * self.count + self.index
            stub = rpc_pb2_grpc.WatchStub(self.channel(spec.endpoints[gid % len(spec.endpoints)]))
            call = stub.Watch()
            await call.write(rpc_pb2.WatchRequest(
                create_request=rpc_pb2.WatchCreateRequest(key=key)))
            calls.append(call)
        for call in calls:
            first = await asyncio.wait_for(call.read(), RPC_TIMEOUT)
            if not first.created:
                raise RuntimeError(f"watch not created: {first}")

        async def run(start: float, end: float) -> RunResult:
            res = RunResult()

            async def reader(call: Any) -> None:
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        return
                    now = time.monotonic()
                    for ev in resp.events:
                        res.ops += 1
                        res.latencies.append(now - unstamp(ev.kv.value))

            async def writer() -> None:
                kv = self.kv(spec.endpoints[0])
                await _sleep_until(start)
                stop = end - min(1.0, (end - start) / 4)  # time for the last deliveries
                t = start
                while t < stop:
                    try:
                        await kv.Put(rpc_pb2.PutRequest(key=key, value=stamp(spec.value_size)),
                                     timeout=RPC_TIMEOUT)
                        res.extra["puts"] += 1
                    except grpc.RpcError as e:
                        res.error(e)
                    t += 1.0 / spec.rate
                    await _sleep_until(t)

            readers = [asyncio.ensure_future(reader(c)) for c in calls]
            if self.index == 0:
                await writer()
            await _sleep_until(end)
            for c in calls:
                c.cancel()
            for r in readers:
                with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                    await r
            res.extra["watchers"] += n
            res.end = end
            return res
        return run

    async def _w_lease(self, spec: Spec) -> Runner:
        key = tuple(spec.endpoints)
        ids = self.leases.get(key)
        if ids is None or len(ids) != share(spec.leases, self.count, self.index):
            stub = rpc_pb2_grpc.LeaseStub(self.channel(spec.endpoints[0]))
            ids = []

            async def grant() -> None:
                r = await stub.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=LEASE_TTL),
                                          timeout=RPC_TIMEOUT)
                ids.append(int(r.ID))
            await self._bounded([grant] * share(spec.leases, self.count, self.index),
                                SEED_CONCURRENCY)
            self.leases[key] = ids
        clients = self.clients(spec)
        calls = []
        for _gid, ep in clients:
            calls.append(rpc_pb2_grpc.LeaseStub(self.channel(ep)).LeaseKeepAlive())
        mine = ids

        async def run(start: float, end: float) -> RunResult:
            res = RunResult()

            async def client(j: int, call: Any) -> None:
                await _sleep_until(start)
                i = j
                while True:
                    t0 = time.monotonic()
                    if t0 >= end or not mine:
                        return
                    await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=mine[i % len(mine)]))
                    r = await call.read()
                    if r is grpc.aio.EOF:
                        raise RuntimeError("keepalive stream ended")
                    t1 = time.monotonic()
                    if r.TTL <= 0:
                        res.error(RuntimeError("lease not found"))
                    elif t1 <= end:
                        res.ops += 1
                        res.latencies.append(t1 - t0)
                    i += len(calls)

            try:
                await asyncio.gather(*(client(j, c) for j, c in enumerate(calls)))
            finally:
                for c in calls:
                    c.cancel()
            res.extra["leases"] += len(mine)
            res.end = end
            return res
        return run
