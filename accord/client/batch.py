"""Batched writes: many concurrent puts coalesced into few Txn requests.

::

    async with AccordClient(endpoints) as client:
        batcher = client.batcher()
        revs = await asyncio.gather(*(batcher.put(f"/jobs/7/rank-{r}", state) for r in ranks))

A put waits in a per-partition queue (keys that share a partition key share a shard,
see ``accord/services/kv/sharding.py``) until the end of the current event-loop turn or
until the queue holds ``max_ops`` puts; the queue is then sent as one Txn of puts. One
round trip, one Raft entry and one fsync then carry up to ``max_ops`` writes, which is
how a client reaches a throughput a request per write cannot (see ``bench/pysyncobj.py``).

What changes for the caller: the puts of one batch are applied atomically and share one
revision (each ``put`` returns it). Puts of one key are applied in the order they were
called: a batch never holds a key twice (etcd refuses a Txn that writes a key twice; a
second put of a key goes into the next batch), and a batch with a key that an earlier
batch still in flight writes is sent once that one is done. If a batch is refused as a whole (a put over
a size limit, a lease that does not exist), its puts are retried one by one, so each
caller gets its own answer and the good ones are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from accord.client.errors import ClientError
from accord.proto import rpc_pb2
from accord.services.kv.sharding import partition_key

if TYPE_CHECKING:
    from accord.client.base import ClientCalls

DEFAULT_MAX_OPS = 128
"""etcd's and accord's default ``--max-txn-ops``."""


_Put = tuple[bytes, bytes, int, "asyncio.Future[int]"]
"""A waiting put: key, value, lease, and the caller's future."""


@dataclass(slots=True)
class _Pending:
    """Puts waiting to go as one Txn (one partition)."""

    puts: list[_Put] = field(default_factory=list)
    keys: set[bytes] = field(default_factory=set)
    after: set[asyncio.Task[None]] = field(default_factory=set)
    """Batches in flight that write one of these keys: this one is sent after them."""


class PutBatcher:
    """Coalesces concurrent puts into Txn requests of up to ``max_ops`` puts."""

    def __init__(self, client: ClientCalls, *, max_ops: int = DEFAULT_MAX_OPS,
                 max_in_flight: int = 64) -> None:
        if not 1 <= max_ops:
            raise ValueError(f"max_ops must be >= 1, got {max_ops}")
        if not 1 <= max_in_flight:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._client = client
        self._max_ops = max_ops
        self._slots = asyncio.Semaphore(max_in_flight)
        self._pending: dict[bytes, _Pending] = {}
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight: dict[bytes, asyncio.Task[None]] = {}
        """Key -> the last batch in flight that writes it (puts of a key keep call order)."""
        self.batches = 0
        """Txn requests sent (for tests and benchmarks)."""

    async def put(self, key: bytes | str, value: bytes | str, *, lease: int = 0) -> int:
        """Write ``key`` in the next batch of its partition; the batch's revision."""
        k = _bytes(key)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        part = partition_key(k)
        pending = self._pending.get(part)
        if pending is not None and k in pending.keys:
            self._send(part)  # a key once per Txn: this put starts the next batch
            pending = None
        if pending is None:
            pending = self._pending[part] = _Pending()
        pending.puts.append((k, _bytes(value), lease, fut))
        pending.keys.add(k)
        earlier = self._inflight.get(k)
        if earlier is not None:
            pending.after.add(earlier)
        if len(pending.puts) >= self._max_ops:
            self._send(part)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_all)
        return await fut

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        for part in list(self._pending):
            self._send(part)

    def _send(self, part: bytes) -> None:
        pending = self._pending.pop(part, None)
        if pending is None or not pending.puts:
            return
        task = asyncio.create_task(self._commit(pending.puts, pending.after), name="put-batch")
        self._tasks.add(task)
        for k in pending.keys:
            self._inflight[k] = task

        def done(t: asyncio.Task[None], keys: set[bytes] = pending.keys) -> None:
            self._tasks.discard(t)
            for k in keys:
                if self._inflight.get(k) is t:
                    del self._inflight[k]

        task.add_done_callback(done)

    async def _commit(self, puts: list[_Put], after: set[asyncio.Task[None]]) -> None:
        if after:
            await asyncio.wait(after)
        async with self._slots:
            try:
                if len(puts) == 1:
                    key, value, lease, fut = puts[0]
                    _settle(fut, (await self._client.put(key, value, lease=lease)).revision)
                    return
                self.batches += 1
                resp = await self._client.txn_raw(_txn_of(puts))
                rev = int(resp.header.revision)
                for *_, fut in puts:
                    _settle(fut, rev)
            except ClientError as e:
                if e.code in _PER_PUT_CODES and len(puts) > 1:
                    await asyncio.gather(*(self._one(*put) for put in puts))
                else:
                    for *_, fut in puts:
                        if not fut.done():
                            fut.set_exception(e)
            except BaseException as e:
                for *_, fut in puts:
                    if not fut.done():
                        fut.set_exception(e)
                if not isinstance(e, Exception):
                    raise

    async def _one(self, key: bytes, value: bytes, lease: int, fut: asyncio.Future[int]) -> None:
        try:
            _settle(fut, (await self._client.put(key, value, lease=lease)).revision)
        except ClientError as e:
            if not fut.done():
                fut.set_exception(e)

    async def put_many(self, items: Sequence[tuple[bytes | str, bytes | str]]) -> list[int]:
        """Write many keys at once, without a task per write; each one's revision, in order.

        Items are cut into Txns of up to ``max_ops`` puts per partition, a key at most once
        per Txn; a partition whose items repeat a key has its Txns sent one after another
        (so the last value given stays), others all at once (at most ``max_in_flight``).
        A refused Txn is retried put by put; if some puts still fail, the others are
        written and :class:`BatchPutError` says which failed and why."""
        reqs = [(_bytes(k), _bytes(v), 0, None) for k, v in items]
        by_part: dict[bytes, list[list[int]]] = {}
        repeats: set[bytes] = set()
        seen: set[bytes] = set()
        open_keys: dict[bytes, set[bytes]] = {}
        for i, (key, *_) in enumerate(reqs):
            part = partition_key(key)
            chunks = by_part.setdefault(part, [[]])
            keys = open_keys.setdefault(part, set())
            if key in seen:
                repeats.add(part)
            seen.add(key)
            if key in keys or len(chunks[-1]) >= self._max_ops:
                chunks.append([])
                keys.clear()
            chunks[-1].append(i)
            keys.add(key)
        revisions = [0] * len(reqs)
        failures: dict[int, ClientError] = {}

        async def send(chunk: list[int]) -> None:
            async with self._slots:
                try:
                    self.batches += 1
                    resp = await self._client.txn_raw(_txn_of([reqs[i] for i in chunk]))
                    for i in chunk:
                        revisions[i] = int(resp.header.revision)
                    return
                except ClientError as e:
                    if e.code not in _PER_PUT_CODES or len(chunk) == 1:
                        for i in chunk:
                            failures[i] = e
                        return
            for i in chunk:  # refused as a whole: each put for its own answer
                try:
                    key, value, *_ = reqs[i]
                    revisions[i] = (await self._client.put(key, value)).revision
                except ClientError as e:
                    failures[i] = e

        async def in_order(chunks: list[list[int]]) -> None:
            for chunk in chunks:
                await send(chunk)

        jobs = []
        for part, chunks in by_part.items():
            if part in repeats:
                jobs.append(in_order(chunks))
            else:
                jobs.extend(send(c) for c in chunks)
        await asyncio.gather(*jobs)
        if failures:
            raise BatchPutError(failures, revisions)
        return revisions

    async def flush(self) -> None:
        """Send what waits now and wait for every batch in flight."""
        self._flush_all()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


_PER_PUT_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                  grpc.StatusCode.FAILED_PRECONDITION)
"""Codes of a Txn refused for one of its puts: worth retrying put by put."""


class BatchPutError(Exception):
    """Some puts of :meth:`PutBatcher.put_many` failed; the others were written."""

    def __init__(self, failures: dict[int, ClientError], revisions: list[int]) -> None:
        first = failures[min(failures)]
        super().__init__(f"{len(failures)} of {len(revisions)} puts failed (nothing else "
                         f"was lost); item {min(failures)}: {first}")
        self.failures = failures
        """Index of the item -> why it was not written."""
        self.revisions = revisions
        """Revision of every item written (0 for the failed ones)."""


def _txn_of(puts: Sequence[tuple[bytes, bytes, int, object]]) -> rpc_pb2.TxnRequest:
    """A Txn of these puts, built in place (no PutRequest copied into each op: that copy
    cost the client more than the rest of a batched put)."""
    req = rpc_pb2.TxnRequest()
    add = req.success.add
    for key, value, lease, _ in puts:
        p = add().request_put
        p.key = key
        p.value = value
        if lease:
            p.lease = lease
    return req


def _bytes(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


def _settle(fut: asyncio.Future[int], rev: int) -> None:
    if not fut.done():
        fut.set_result(rev)
