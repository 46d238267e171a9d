"""A thin blocking wrapper around :class:`~accord.client.client.AccordClient`.

For threaded programs: one background thread runs an asyncio loop that owns the async
client; each method submits a coroutine to it and waits. The lock is a plain context
manager::

    with SyncClient(["127.0.0.1:2379"]) as client:
        with client.lock("jobs/7", ttl=10) as lock:
            lock.guarded_put("state/jobs-7", "running")
            if lock.lost.is_set(): ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from accord.client.checkpoints_sync import SyncCheckpoints
from accord.client.client import AccordClient
from accord.client.lock import Lock
from accord.proto import kv_pb2

T = TypeVar("T")


class SyncLock:
    """A held (or about to be held) lock, usable from any thread."""

    def __init__(self, client: SyncClient, lock: Lock) -> None:
        self._client = client
        self._lock = lock
        self.lost = threading.Event()
        """Set from the loop thread when the async lock's ``lost`` is set."""

    @property
    def token(self) -> int:
        """The fencing token."""
        return self._lock.token

    def acquire(self) -> SyncLock:
        """Block until granted."""
        self._client.run(self._lock.acquire())
        self._client.run(self._forward_lost())
        return self

    async def _forward_lost(self) -> None:
        assert self._lock.session is not None
        self._lock.session.on_lost(self.lost.set)
        if self._lock.lost.is_set():
            self.lost.set()

    def guarded_put(self, key: bytes | str, value: bytes | str) -> int:
        """Put only while this lock's token holds (see :meth:`Lock.guarded_put`)."""
        return self._client.run(self._lock.guarded_put(key, value))

    def release(self) -> None:
        """Release the lock and its session."""
        self._client.run(self._lock.release())

    def __enter__(self) -> SyncLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SyncClient:
    """Blocking access to a cluster; close it (or use ``with``) to stop its thread."""

    def __init__(self, endpoints: Sequence[str] | str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="accord-sync-client",
                                        daemon=True)
        self._thread.start()
        self._client: AccordClient = self.run(self._make(endpoints, options))
        # --- checkpoint manifests (accord/client/checkpoints_sync.py) ---
        self.checkpoints = SyncCheckpoints(self.run, self._client.checkpoints)
        """Blocking access to the checkpoint manifest service."""

    @staticmethod
    async def _make(endpoints: Sequence[str] | str, options: dict[str, Any]) -> AccordClient:
        return AccordClient(endpoints, **options)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the client's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def get(self, key: bytes | str) -> kv_pb2.KeyValue | None:
        """See :meth:`AccordClient.get`."""
        return self.run(self._client.get(key))

    def put(self, key: bytes | str, value: bytes | str, *, lease: int = 0) -> int:
        """See :meth:`AccordClient.put`."""
        return self.run(self._client.put(key, value, lease=lease))

    def delete(self, key: bytes | str) -> int:
        """See :meth:`AccordClient.delete`."""
        return self.run(self._client.delete(key))

    def lock(self, name: bytes | str, *, ttl: int = 10, lock_delay: float = 0.0) -> SyncLock:
        """A fenced lock as a blocking context manager."""
        return SyncLock(self, self._client.lock(name, ttl=ttl, lock_delay=lock_delay))

    def close(self) -> None:
        """Close the client and stop the loop thread."""
        if not self._loop.is_closed():
            self.run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
