"""Property: any interleaving of acquire, release and expiry keeps at most one holder and
grants in create-revision order (with nobody skipped who was still alive and queued)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.locks import recipe
from accord.locks.errors import SessionExpired
from accord.locks.store import BackendLockStore
from tests.locks.helpers import grant, queue, revoke, settle
from tests.locks.inproc import local_backend

NAME = b"q"
CLIENTS = 5

Op = tuple[str, int]
ops_strategy = st.lists(
    st.tuples(st.sampled_from(["acquire", "release", "expire"]), st.integers(0, CLIENTS - 1)),
    min_size=1,
    max_size=40,
)


@dataclass
class Client:
    lease: int = 0
    task: asyncio.Task[recipe.Holding] | None = None
    token: int = 0
    holding: recipe.Holding | None = None


@dataclass
class World:
    clients: list[Client] = field(default_factory=lambda: [Client() for _ in range(CLIENTS)])
    grants: list[int] = field(default_factory=list)
    expired_tokens: set[int] = field(default_factory=set)


def _on_enqueued(c: Client):  # type: ignore[no-untyped-def]
    def record(_key: bytes, token: int) -> None:
        c.token = token
    return record


async def _collect(world: World, store: BackendLockStore) -> None:
    """Record finished acquisitions, checking order and exclusivity at each grant."""
    backend = store.backend
    for c in world.clients:
        if c.task is not None and c.task.done():
            task, c.task = c.task, None
            try:
                held = task.result()
            except SessionExpired:
                c.lease = 0
                continue
            holders = [x for x in world.clients if x.holding is not None]
            assert holders == [], "granted while another client still holds the lock"
            live = await queue(backend, NAME)  # type: ignore[arg-type]
            assert live and live[0].create_revision == held.token, "grant out of queue order"
            assert not world.grants or held.token > world.grants[-1], "token did not grow"
            world.grants.append(held.token)
            c.holding = held


async def _scenario(ops: list[Op]) -> World:
    world = World()
    async with local_backend() as backend:
        store = BackendLockStore(backend)
        for kind, i in ops:
            c = world.clients[i]
            if kind == "acquire" and c.task is None and c.holding is None:
                c.lease = await grant(backend)
                c.task = asyncio.create_task(recipe.acquire(
                    store, NAME, c.lease, recheck_s=30, on_enqueued=_on_enqueued(c),
                ))
            elif kind == "release" and c.holding is not None:
                await recipe.release(store, c.holding)
                c.holding = None
            elif kind == "expire" and c.lease:
                await revoke(backend, c.lease)
                if c.holding is not None:
                    world.expired_tokens.add(c.holding.token)
                    c.holding = None
                c.lease = 0
            await settle()
            await _collect(world, store)
        # drain: release whoever holds until every live waiter was served
        for _ in range(4 * CLIENTS):
            for c in world.clients:
                if c.holding is not None:
                    await recipe.release(store, c.holding)
                    c.holding = None
            await settle()
            await _collect(world, store)
            if all(c.task is None and c.holding is None for c in world.clients):
                break
        assert all(c.task is None for c in world.clients), "a live waiter was never granted"
        assert await queue(backend, NAME) == [], "a released or expired contender stayed queued"
    return world


@settings(deadline=None)
@given(ops_strategy)
def test_any_interleaving_keeps_one_holder_in_create_revision_order(ops: list[Op]) -> None:
    world = asyncio.run(_scenario(ops))
    assert world.grants == sorted(set(world.grants))
