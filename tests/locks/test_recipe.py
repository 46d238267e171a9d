"""The fenced lock recipe on an in-process store: queue, grant, release, fencing, lock-delay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from accord.locks import keys, recipe
from accord.locks.errors import FencedWriteRejected, InvalidLockName, NotHeld, SessionExpired
from accord.locks.ops import put
from accord.locks.store import BackendLockStore
from accord.proto import rpc_pb2
from accord.services.kv.errors import EtcdError
from accord.services.kv.local import LocalBackend
from tests.locks.helpers import CountingStore, get, grant, queue, revoke, settle
from tests.locks.inproc import local_backend

NAME = b"jobs/7"


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with local_backend() as b:
        yield b


async def test_uncontended_grant_token_is_the_keys_create_revision(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    lease = await grant(backend)
    held = await recipe.acquire(store, NAME, lease)
    kv = await get(backend, held.key)
    assert kv is not None and held.key == NAME + b"/" + format(lease, "x").encode()
    assert held.token == kv.create_revision and kv.lease == lease
    record = await get(backend, keys.grant_key(NAME))
    assert record is not None and json.loads(record.value)["token"] == held.token
    assert record.mod_revision == held.grant_revision > held.token
    await recipe.release(store, held)
    assert await get(backend, held.key) is None
    assert await get(backend, keys.grant_key(NAME)) is None


async def test_grants_follow_create_revision_order_and_only_the_successor_wakes(
    backend: LocalBackend,
) -> None:
    store = CountingStore(backend)
    leases = [await grant(backend) for _ in range(5)]
    first = await recipe.acquire(store, NAME, leases[0])
    tasks = []
    for lease in leases[1:]:
        tasks.append(asyncio.create_task(recipe.acquire(store, NAME, lease)))
        await settle()
    assert not any(t.done() for t in tasks)
    before = dict(store.wakeups)
    tokens = [first.token]
    current = first
    for t in tasks:
        await recipe.release(store, current)
        current = await asyncio.wait_for(t, 5)
        await settle()
        # the release woke exactly one waiter: the released holder's successor
        woken = {k for k, n in store.wakeups.items() if n != before.get(k, 0)}
        assert woken == {current.key}
        before = dict(store.wakeups)
        tokens.append(current.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    await recipe.release(store, current)


async def test_guarded_write_is_refused_once_the_token_is_stale(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    a, b = await grant(backend), await grant(backend)
    held_a = await recipe.acquire(store, NAME, a)
    await recipe.guarded_txn(store, held_a, [put(b"data/x", b"from-a")])
    waiter = asyncio.create_task(recipe.acquire(store, NAME, b))
    await settle()
    await revoke(backend, a)  # a's lease ends without a release
    held_b = await asyncio.wait_for(waiter, 5)
    assert held_b.token > held_a.token
    rev = backend.revision
    with pytest.raises(FencedWriteRejected) as err:
        await recipe.guarded_txn(store, held_a, [put(b"data/x", b"late-a")])
    assert err.value.current == held_b.token
    assert str(err.value) == (
        f"fencing token {held_a.token} is stale: lock 'jobs/7' is held with token "
        f"{held_b.token}; nothing was written"
    )
    assert backend.revision == rev and (await get(backend, b"data/x")).value == b"from-a"  # type: ignore[union-attr]
    await recipe.guarded_txn(store, held_b, [put(b"data/x", b"from-b")])
    await recipe.release(store, held_b)
    with pytest.raises(FencedWriteRejected, match="is not held by anyone"):
        await recipe.guarded_txn(store, held_b, [put(b"data/x", b"after-release")])


async def test_a_token_of_another_lock_is_refused(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    held_a = await recipe.acquire(store, b"lock-a", await grant(backend))
    held_b = await recipe.acquire(store, b"lock-b", await grant(backend))
    forged = recipe.Holding(held_a.name, held_a.key, held_a.lease, held_b.token, 0)
    rev = backend.revision
    with pytest.raises(FencedWriteRejected, match="is not a token of lock 'lock-a'"):
        await recipe.guarded_txn(store, forged, [put(b"data/y", b"x")])
    assert backend.revision == rev


async def test_guarded_write_into_the_queue_prefix_is_refused(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    held = await recipe.acquire(store, NAME, await grant(backend))
    rev = backend.revision
    with pytest.raises(InvalidLockName, match="inside the queue"):
        await recipe.guarded_txn(store, held, [put(NAME + b"/state", b"x")])
    assert backend.revision == rev


async def test_release_of_a_lock_not_held_is_an_error_and_changes_nothing(
    backend: LocalBackend,
) -> None:
    store = BackendLockStore(backend)
    lease = await grant(backend)
    held = await recipe.acquire(store, NAME, lease)
    await recipe.release(store, held)
    rev = backend.revision
    with pytest.raises(NotHeld, match="released already, or its lease expired"):
        await recipe.release(store, held)
    with pytest.raises(NotHeld):
        await recipe.unlock_key(store, held.key)
    with pytest.raises(InvalidLockName, match="is not a lock key"):
        await recipe.unlock_key(store, b"no-slash-here")
    assert backend.revision == rev


async def test_unknown_lease_and_bad_arguments_are_refused_before_any_write(
    backend: LocalBackend,
) -> None:
    store = BackendLockStore(backend)
    rev = backend.revision
    with pytest.raises(EtcdError, match="requested lease not found"):
        await recipe.acquire(store, NAME, 0x1234)
    with pytest.raises(InvalidLockName, match="empty"):
        await recipe.acquire(store, b"", 1)
    with pytest.raises(InvalidLockName, match="lease id 0"):
        await recipe.acquire(store, NAME, 0)
    with pytest.raises(InvalidLockName, match="lock_delay_ms"):
        await recipe.acquire(store, NAME, 1, lock_delay_ms=-5)
    assert backend.revision == rev
    assert await queue(backend, NAME) == []


async def test_lease_expiring_while_waiting_is_never_reported_as_a_grant(
    backend: LocalBackend,
) -> None:
    """etcd #11456: the waiter's lease ends while it waits; the grant must not happen."""
    store = BackendLockStore(backend)
    holder = await recipe.acquire(store, NAME, await grant(backend))
    doomed = await grant(backend, ttl=2)  # never renewed: expires in ~2 s
    waiter = asyncio.create_task(recipe.acquire(store, NAME, doomed))
    with pytest.raises(SessionExpired, match="expired or was revoked while it waited"):
        await asyncio.wait_for(waiter, 10)
    assert [kv.lease for kv in await queue(backend, NAME)] == [holder.lease]
    await recipe.release(store, holder)
    assert await queue(backend, NAME) == []


async def test_a_retried_grant_returns_the_same_holding(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    lease = await grant(backend)
    held = await recipe.acquire(store, NAME, lease)
    again = await recipe.wait_grant(store, NAME, held.key, held.token, lease)
    assert again == held


async def test_cancelled_waiter_leaves_the_queue(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    holder = await recipe.acquire(store, NAME, await grant(backend))
    waiter = asyncio.create_task(recipe.acquire(store, NAME, await grant(backend)))
    await settle()
    assert len(await queue(backend, NAME)) == 2
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await settle()
    assert [kv.lease for kv in await queue(backend, NAME)] == [holder.lease]


async def test_tokens_keep_growing_across_compaction(backend: LocalBackend) -> None:
    store = BackendLockStore(backend)
    first = await recipe.acquire(store, NAME, await grant(backend))
    await backend.compact(rpc_pb2.CompactionRequest(revision=backend.revision))
    await recipe.guarded_txn(store, first, [put(b"data/z", b"1")])
    await recipe.release(store, first)
    await backend.compact(rpc_pb2.CompactionRequest(revision=backend.revision))
    second = await recipe.acquire(store, NAME, await grant(backend))
    assert second.token > first.token


async def test_lock_delay_after_a_lost_holder_and_none_after_a_clean_release(
    backend: LocalBackend,
) -> None:
    store = BackendLockStore(backend)
    a = await grant(backend)
    held_a = await recipe.acquire(store, NAME, a, lock_delay_ms=2000)
    waiter = asyncio.create_task(recipe.acquire(store, NAME, await grant(backend)))
    await settle()
    await revoke(backend, a)  # lost without release: the lock-delay applies
    await asyncio.sleep(1.0)
    assert not waiter.done()  # the delay record (a 2 s lease) still stands
    record = await get(backend, keys.grant_key(NAME))
    assert record is not None and json.loads(record.value) == {
        "delay_after": held_a.token, "lock_delay_ms": 2000,
    }
    held_b = await asyncio.wait_for(waiter, 10)
    assert held_b.token > held_a.token
    # a clean release drops the grant record: the next contender is not delayed
    c = await grant(backend)
    waiter_c = asyncio.create_task(recipe.acquire(store, NAME, c, lock_delay_ms=2000))
    await settle()
    start_rev = backend.revision
    await recipe.release(store, held_b)
    held_c = await asyncio.wait_for(waiter_c, 5)
    hist = backend.watch_hub.watch(keys.grant_key(NAME), start_revision=start_rev)
    batch = await asyncio.wait_for(hist.next_batch(), 5)
    hist.close()
    assert batch.events and not batch.canceled
    assert all(b"delay_after" not in ev.kv.value for ev in batch.events)
    await recipe.release(store, held_c)


async def test_tokens_keep_growing_across_restart_and_snapshot_restore(tmp_path: Path) -> None:
    backend = await LocalBackend.open(tmp_path, lease_check_interval_s=0.05)
    try:
        store = BackendLockStore(backend)
        first = await recipe.acquire(store, NAME, await grant(backend))
        await recipe.release(store, first)
        held = await recipe.acquire(store, NAME, await grant(backend))
    finally:
        await backend.close()  # writes the snapshot the reopen restores from
    backend = await LocalBackend.open(tmp_path, lease_check_interval_s=0.05)
    try:
        store = BackendLockStore(backend)
        # the holder from before the restart still holds: its guarded writes pass
        await recipe.guarded_txn(store, held, [put(b"data/r", b"after-restart")])
        waiter = asyncio.create_task(recipe.acquire(store, NAME, await grant(backend)))
        await settle()
        await recipe.release(store, held)
        after = await asyncio.wait_for(waiter, 5)
        assert first.token < held.token < after.token
    finally:
        await backend.close()
