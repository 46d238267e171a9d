"""The blocking twin of :class:`~accord.client.client.AccordClient`, of the same shape.

For threaded programs and scripts: one background thread runs an asyncio loop that owns
the async client; each method submits the async method's coroutine to it and waits.
Names, arguments and results are the async client's: ``client.range``, ``client.put``,
``client.txn().if_(...).then(...).commit()``, ``for event in client.watch(...)``,
``client.cluster.members()``, ``client.scheduler.submit(spec)``,
``client.membership.members()``; iterators are plain iterators and the lock a plain
context manager::

    with SyncClient(["127.0.0.1:2379"]) as client:
        client.put("config/a", "1")
        with client.watch("config/", prefix=True, start_revision=rev + 1) as watch:
            for event in watch:
                ...
        with client.lock("jobs/7", ttl=10) as lock:
            lock.guarded_put("state/jobs-7", "running")
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

from accord.client.checkpoints_sync import SyncCheckpoints
from accord.client.client import AccordClient
from accord.client.cluster import (
    Alarm,
    GroupsReport,
    Member,
    MemberStatus,
    SnapshotInfo,
    StatusReport,
)
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
)
from accord.client.lock import Lock
from accord.client.membership import MembershipEvent, MembershipView
from accord.client.scheduling import (
    Job,
    JobSpec,
    Node,
    PlacementEvent,
    PlacementWatch,
    SchedulerStatus,
)
from accord.client.tasklogs import LogChunk
from accord.client.watch import Watch, WatchEvent
from accord.proto import rpc_pb2, scheduling_pb2

T = TypeVar("T")

WAKE_S = 0.2
"""How often a blocked call wakes to let the main thread handle a signal (Ctrl-C)."""


class _Loop:
    """The loop thread every sync object of one client submits its coroutines to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="accord-sync-client",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("the sync client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                # Short waits: a signal (Ctrl-C) may be delivered to one of gRPC's
                # threads, and the main thread runs its handler only once it wakes up.
                left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
                try:
                    return fut.result(max(left, 0.0))
                except TimeoutError:
                    if fut.done() or (deadline is not None and time.monotonic() >= deadline):
                        raise  # the coroutine's own TimeoutError, or ours
        except BaseException:
            fut.cancel()  # Ctrl-C (or a timeout) here ends the coroutine there too
            raise

    def stop(self) -> None:
        """Stop and close the loop (after its last coroutine ran)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


class SyncIterator(Generic[T]):
    """An async iterator of the loop thread as a blocking iterator (and context manager)."""

    def __init__(self, loop: _Loop, it: AsyncIterator[T],
                 close: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        self._loop = loop
        self._it = it
        self._close = close

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        async def step() -> tuple[bool, T | None]:
            try:
                return True, await self._it.__anext__()
            except StopAsyncIteration:
                return False, None
        ok, item = self._loop.run(step())
        if not ok:
            raise StopIteration
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop iterating and release the stream."""
        if self._close is not None:
            self._loop.run(self._close())
        else:
            aclose = getattr(self._it, "aclose", None)
            if aclose is not None:
                self._loop.run(aclose())

    def __enter__(self) -> SyncIterator[T]:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SyncWatch(SyncIterator[WatchEvent]):
    """:class:`~accord.client.watch.Watch`, blocking."""

    def __init__(self, loop: _Loop, watch: Watch) -> None:
        super().__init__(loop, watch, watch.close)
        self.watch = watch

    @property
    def next_revision(self) -> int:
        """See :attr:`Watch.next_revision`."""
        return self.watch.next_revision

    @property
    def progress_revision(self) -> int:
        """See :attr:`Watch.progress_revision`."""
        return self.watch.progress_revision

    @property
    def reconnects(self) -> int:
        """See :attr:`Watch.reconnects`."""
        return self.watch.reconnects

    def created(self, timeout: float | None = None) -> int:
        """See :meth:`Watch.created`."""
        return self._loop.run(self.watch.created(timeout))

    def request_progress(self, timeout: float | None = None) -> int:
        """See :meth:`Watch.request_progress`."""
        return self._loop.run(self.watch.request_progress(timeout))

    def __enter__(self) -> SyncWatch:
        self._loop.run(_start(self.watch))
        return self


async def _start(watch: Watch) -> None:
    watch.start()


class SyncLock:
    """A held (or about to be held) lock, usable from any thread."""

    def __init__(self, loop: _Loop, lock: Lock) -> None:
        self._loop = loop
        self._lock = lock
        self.lost = threading.Event()
        """Set from the loop thread when the async lock's ``lost`` is set."""

    @property
    def token(self) -> int:
        """The fencing token."""
        return self._lock.token

    def acquire(self) -> SyncLock:
        """Block until granted."""
        self._loop.run(self._lock.acquire())
        self._loop.run(self._forward_lost())
        return self

    async def _forward_lost(self) -> None:
        assert self._lock.session is not None
        self._lock.session.on_lost(self.lost.set)
        if self._lock.lost.is_set():
            self.lost.set()

    def guarded_put(self, key: Data, value: Data) -> int:
        """Put only while this lock's token holds (see :meth:`Lock.guarded_put`)."""
        return self._loop.run(self._lock.guarded_put(key, value))

    def release(self) -> None:
        """Release the lock and its session."""
        self._loop.run(self._lock.release())

    def __enter__(self) -> SyncLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SyncClusterApi:
    """:class:`~accord.client.cluster.ClusterApi`, blocking."""

    def __init__(self, loop: _Loop, client: AccordClient) -> None:
        self._loop = loop
        self._a = client.cluster

    def members(self, *, timeout: float | None = None) -> list[Member]:
        """See :meth:`ClusterApi.members`."""
        return self._loop.run(self._a.members(timeout=timeout))

    def status(self, endpoint: str | None = None, *, timeout: float | None = None) -> MemberStatus:
        """See :meth:`ClusterApi.status`."""
        return self._loop.run(self._a.status(endpoint, timeout=timeout))

    def statuses(self, *, timeout: float | None = None) -> list[StatusReport]:
        """See :meth:`ClusterApi.statuses`."""
        return self._loop.run(self._a.statuses(timeout=timeout))

    def leader(self, *, timeout: float | None = None) -> Member:
        """See :meth:`ClusterApi.leader`."""
        return self._loop.run(self._a.leader(timeout=timeout))

    def alarms(self, *, timeout: float | None = None) -> list[Alarm]:
        """See :meth:`ClusterApi.alarms`."""
        return self._loop.run(self._a.alarms(timeout=timeout))

    def disarm(self, alarm: Alarm, *, timeout: float | None = None) -> list[Alarm]:
        """See :meth:`ClusterApi.disarm`."""
        return self._loop.run(self._a.disarm(alarm, timeout=timeout))

    def defragment(self, endpoint: str | None = None, *, timeout: float | None = None) -> None:
        """See :meth:`ClusterApi.defragment`."""
        self._loop.run(self._a.defragment(endpoint, timeout=timeout))

    def snapshot(self, path: str | os.PathLike[str], *, endpoint: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 check: Callable[[Path], object] | None = None,
                 timeout: float | None = 300.0) -> SnapshotInfo:
        """See :meth:`ClusterApi.snapshot` (``progress`` runs on the loop thread)."""
        return self._loop.run(self._a.snapshot(path, endpoint=endpoint, progress=progress,
                                               check=check, timeout=timeout))

    def move_leader(self, target_id: int, *, timeout: float | None = None) -> None:
        """See :meth:`ClusterApi.move_leader`."""
        self._loop.run(self._a.move_leader(target_id, timeout=timeout))

    def groups(self, *, timeout: float | None = None) -> GroupsReport:
        """See :meth:`ClusterApi.groups`."""
        return self._loop.run(self._a.groups(timeout=timeout))

    def discover(self, *, timeout: float | None = None) -> list[str]:
        """See :meth:`ClusterApi.discover`."""
        return self._loop.run(self._a.discover(timeout=timeout))


class SyncSchedulerApi:
    """:class:`~accord.client.scheduling.SchedulerApi`, blocking."""

    def __init__(self, loop: _Loop, client: AccordClient) -> None:
        self._loop = loop
        self._a = client.scheduler

    def submit(self, spec: JobSpec, *, timeout: float | None = None) -> str:
        """See :meth:`SchedulerApi.submit`."""
        return self._loop.run(self._a.submit(spec, timeout=timeout))

    def get(self, job_id: str, *, timeout: float | None = None) -> Job:
        """See :meth:`SchedulerApi.get`."""
        return self._loop.run(self._a.get(job_id, timeout=timeout))

    def jobs(self, *, status: str = "", tenant: str = "",
             timeout: float | None = None) -> list[Job]:
        """See :meth:`SchedulerApi.jobs`."""
        return self._loop.run(self._a.jobs(status=status, tenant=tenant, timeout=timeout))

    def cancel(self, job_id: str, *, timeout: float | None = None) -> None:
        """See :meth:`SchedulerApi.cancel`."""
        self._loop.run(self._a.cancel(job_id, timeout=timeout))

    def hold(self, job_id: str, *, timeout: float | None = None) -> None:
        """See :meth:`SchedulerApi.hold`."""
        self._loop.run(self._a.hold(job_id, timeout=timeout))

    def release(self, job_id: str, *, timeout: float | None = None) -> None:
        """See :meth:`SchedulerApi.release`."""
        self._loop.run(self._a.release(job_id, timeout=timeout))

    def job_finished(self, job_id: str, *, failed: bool = False,
                     timeout: float | None = None) -> None:
        """See :meth:`SchedulerApi.job_finished`."""
        self._loop.run(self._a.job_finished(job_id, failed=failed, timeout=timeout))

    def wait_placed(self, job_id: str, *, timeout: float = 60.0, poll_s: float = 0.2) -> Job:
        """See :meth:`SchedulerApi.wait_placed`."""
        return self._loop.run(self._a.wait_placed(job_id, timeout=timeout, poll_s=poll_s))

    def watch_placements(self, job_id: str = "", *,
                         start_index: int = 0) -> SyncIterator[PlacementEvent]:
        """See :meth:`SchedulerApi.watch_placements`."""
        w: PlacementWatch = self._a.watch_placements(job_id, start_index=start_index)
        return SyncIterator(self._loop, w.__aiter__(), w.close)

    def log_endpoint(self, job_id: str, rank: int = 0, *, timeout: float | None = None) -> str:
        """See :meth:`SchedulerApi.log_endpoint`."""
        return self._loop.run(self._a.log_endpoint(job_id, rank, timeout=timeout))

    def logs(self, job_id: str, *, rank: int = 0, attempt: int = 0, stream: str = "stdout",
             offset: int = 0, follow: bool = False,
             timeout: float | None = None) -> SyncIterator[LogChunk]:
        """See :meth:`SchedulerApi.logs`."""
        return SyncIterator(self._loop, self._a.logs(
            job_id, rank=rank, attempt=attempt, stream=stream, offset=offset, follow=follow,
            timeout=timeout))

    def status(self, *, timeout: float | None = None) -> SchedulerStatus:
        """See :meth:`SchedulerApi.status`."""
        return self._loop.run(self._a.status(timeout=timeout))

    def nodes(self, *, timeout: float | None = None) -> list[Node]:
        """See :meth:`SchedulerApi.nodes`."""
        return self._loop.run(self._a.nodes(timeout=timeout))

    def drain(self, node: str, *, timeout: float | None = None) -> list[str]:
        """See :meth:`SchedulerApi.drain`."""
        return self._loop.run(self._a.drain(node, timeout=timeout))

    def undrain(self, node: str, *, timeout: float | None = None) -> list[str]:
        """See :meth:`SchedulerApi.undrain`."""
        return self._loop.run(self._a.undrain(node, timeout=timeout))

    def register_node(self, spec: scheduling_pb2.NodeSpec, *, agent_endpoint: str = "",
                      orphan_timeout: float | None = None,
                      timeout: float | None = None) -> str:
        """See :meth:`SchedulerApi.register_node`."""
        return self._loop.run(self._a.register_node(
            spec, agent_endpoint=agent_endpoint, orphan_timeout=orphan_timeout,
            timeout=timeout))

    def heartbeat(self, node: str, *, unhealthy: Sequence[int] = (),
                  timeout: float | None = None) -> list[str]:
        """See :meth:`SchedulerApi.heartbeat`."""
        return self._loop.run(self._a.heartbeat(node, unhealthy=unhealthy, timeout=timeout))


class SyncMembershipApi:
    """:class:`~accord.client.membership.MembershipApi`, blocking."""

    def __init__(self, loop: _Loop, client: AccordClient) -> None:
        self._loop = loop
        self._a = client.membership

    def members(self, *, role: str = "", timeout: float | None = None) -> MembershipView:
        """See :meth:`MembershipApi.members`."""
        return self._loop.run(self._a.members(role=role, timeout=timeout))

    def watch(self, *, role: str = "") -> SyncIterator[MembershipEvent]:
        """See :meth:`MembershipApi.watch`."""
        return SyncIterator(self._loop, self._a.watch(role=role))


class SyncClient:
    """Blocking access to a cluster; close it (or use ``with``) to stop its thread."""

    def __init__(self, endpoints: Sequence[str] | str, *, discover: bool = False,
                 **options: Any) -> None:
        self._loop = _Loop()
        try:
            self._client: AccordClient = self._loop.run(
                AccordClient.connect(endpoints, discover=discover, **options))
        except BaseException:
            self._loop.stop()
            raise
        self.cluster = SyncClusterApi(self._loop, self._client)
        """Members, their status, leader, alarms, defragment, snapshot, move leader."""
        self.scheduler = SyncSchedulerApi(self._loop, self._client)
        """The GPU scheduler: jobs, placements, nodes."""
        self.membership = SyncMembershipApi(self._loop, self._client)
        """SWIM members and membership events."""
        self.checkpoints = SyncCheckpoints(self.run, self._client.checkpoints)
        """Blocking access to the checkpoint manifest service."""

    @property
    def aio(self) -> AccordClient:
        """The async client underneath (its coroutines run on :meth:`run`'s loop)."""
        return self._client

    @property
    def endpoints(self) -> list[str]:
        """The endpoints the client knows (given and discovered)."""
        return self._client.endpoints

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the client's loop and wait for its result."""
        return self._loop.run(coro, timeout)

    def discover(self) -> list[str]:
        """See :meth:`AccordClient.discover`."""
        return self.run(self._client.discover())

    # --- KV --------------------------------------------------------------------------------
    def range(
        self, key: Data, range_end: Data | None = None, *, prefix: bool = False,
        from_key: bool = False, limit: int = 0, revision: int = 0,
        sort_order: SortOrder = SortOrder.NONE, sort_target: SortTarget = SortTarget.KEY,
        serializable: bool = False, keys_only: bool = False, count_only: bool = False,
        min_mod_revision: int = 0, max_mod_revision: int = 0, min_create_revision: int = 0,
        max_create_revision: int = 0, timeout: float | None = None,
    ) -> RangeResult:
        """See :meth:`AccordClient.range`."""
        return self.run(self._client.range(
            key, range_end, prefix=prefix, from_key=from_key, limit=limit, revision=revision,
            sort_order=sort_order, sort_target=sort_target, serializable=serializable,
            keys_only=keys_only, count_only=count_only, min_mod_revision=min_mod_revision,
            max_mod_revision=max_mod_revision, min_create_revision=min_create_revision,
            max_create_revision=max_create_revision, timeout=timeout))

    def get(self, key: Data, *, revision: int = 0, serializable: bool = False,
            timeout: float | None = None) -> KeyValue | None:
        """See :meth:`AccordClient.get`."""
        return self.run(self._client.get(key, revision=revision, serializable=serializable,
                                         timeout=timeout))

    def get_prefix(self, prefix: Data, *, timeout: float | None = None) -> list[KeyValue]:
        """See :meth:`AccordClient.get_prefix`."""
        return self.run(self._client.get_prefix(prefix, timeout=timeout))

    def put(self, key: Data, value: Data, *, lease: int = 0, prev_kv: bool = False,
            ignore_value: bool = False, ignore_lease: bool = False,
            timeout: float | None = None) -> PutResult:
        """See :meth:`AccordClient.put`."""
        return self.run(self._client.put(key, value, lease=lease, prev_kv=prev_kv,
                                         ignore_value=ignore_value, ignore_lease=ignore_lease,
                                         timeout=timeout))

    def delete(self, key: Data, range_end: Data | None = None, *, prefix: bool = False,
               from_key: bool = False, prev_kv: bool = False,
               timeout: float | None = None) -> DeleteResult:
        """See :meth:`AccordClient.delete`."""
        return self.run(self._client.delete(key, range_end, prefix=prefix, from_key=from_key,
                                            prev_kv=prev_kv, timeout=timeout))

    def txn(self, *, timeout: float | None = None) -> Txn[TxnResult]:
        """See :meth:`AccordClient.txn`; ``commit()`` blocks and returns the result."""
        async def send(req: rpc_pb2.TxnRequest) -> TxnResult:
            return TxnResult.from_pb(await self._client.txn_raw(req, timeout=timeout))
        return Txn(lambda req: self.run(send(req)))

    def compact(self, revision: int, *, physical: bool = False,
                timeout: float | None = None) -> CompactResult:
        """See :meth:`AccordClient.compact`."""
        return self.run(self._client.compact(revision, physical=physical, timeout=timeout))

    def watch(
        self, key: Data, range_end: Data | None = None, *, prefix: bool = False,
        from_key: bool = False, start_revision: int = 0, prev_kv: bool = False,
        filters: Iterable[EventType] = (), on_progress: Callable[[int], None] | None = None,
        require_leader: bool = True,
    ) -> SyncWatch:
        """See :meth:`AccordClient.watch` (``on_progress`` runs on the loop thread)."""
        async def make() -> Watch:
            return self._client.watch(
                key, range_end, prefix=prefix, from_key=from_key, start_revision=start_revision,
                prev_kv=prev_kv, filters=filters, on_progress=on_progress,
                require_leader=require_leader)
        return SyncWatch(self._loop, self.run(make()))

    # --- leases and locks -----------------------------------------------------------------
    def lease_grant(self, ttl: int, *, timeout: float | None = None) -> LeaseGrant:
        """See :meth:`AccordClient.lease_grant`."""
        return self.run(self._client.lease_grant(ttl, timeout=timeout))

    def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """See :meth:`AccordClient.lease_revoke`."""
        self.run(self._client.lease_revoke(lease_id, timeout=timeout))

    def lease_ttl(self, lease_id: int, *, timeout: float | None = None) -> int:
        """See :meth:`AccordClient.lease_ttl`."""
        return self.run(self._client.lease_ttl(lease_id, timeout=timeout))

    def lock(self, name: Data, *, ttl: int = 10, lock_delay: float = 0.0) -> SyncLock:
        """A fenced lock as a blocking context manager."""
        return SyncLock(self._loop, self._client.lock(name, ttl=ttl, lock_delay=lock_delay))

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the client and stop the loop thread."""
        if not self._loop.loop.is_closed():
            self.run(self._client.close())
            self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
