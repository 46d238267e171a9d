"""A new sharded cluster gives etcd's guarantees from its first call: a starting member's
first key-space calls wait (bounded) until every member advertised the command format
this version applies, instead of being served in the formats every older version applies
(shards counting their own revisions, multi-shard Txns refused).

The members' advertisements are held back until the test lets them go, so the first calls
surely come before them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from accord.node import backend as node_backend
from accord.node.server import Node
from accord.proto import rpc_pb2 as pb
from accord.services.kv.sharding import shard_of
from accord.testing import TestCluster, cluster
from tests.kv.helpers import op_put

SHARDS = 4


def _keys_on_every_shard() -> list[str]:
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < SHARDS:
        k = f"/boot{i}/k"
        keys.setdefault(shard_of(k.encode(), SHARDS), k)
        i += 1
    return [keys[s] for s in range(SHARDS)]


class Advertisements:
    """Holds every member's advertisement back until :meth:`release` (``never``: the
    members named there never advertise, as a member that is down)."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.never: set[str] = set()

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Advertisements]:
    adv = Advertisements()
    advertise = Node._advertise

    async def held_back(self: Node) -> None:
        await adv.released.wait()
        if self.config.name in adv.never:
            await asyncio.Event().wait()
        await advertise(self)

    monkeypatch.setattr(Node, "_advertise", held_back)
    yield adv


def _increasing(revs: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(revs))


async def _first_calls(c: TestCluster, adv: Advertisements, *,
                       wait: bool = True) -> tuple[list[int], bool]:
    """Revisions of puts going round every shard and whether a Txn over two shards
    succeeded, all asked before the advertisements are let go: 0.3 s after the calls
    began (``wait``: the calls are held until then), or once they are all answered."""
    keys = _keys_on_every_shard()
    client = c.client()

    async def calls() -> tuple[list[int], bool]:
        txn = pb.TxnRequest(success=[op_put(keys[0].encode(), b"t"),
                                     op_put(keys[1].encode(), b"t")])
        try:
            await client.txn_raw(txn)
            txn_ok = True
        except Exception:
            txn_ok = False
        revs = [(await client.put(keys[i % SHARDS], "v")).revision for i in range(12)]
        return revs, txn_ok

    task = asyncio.create_task(calls())
    if wait:
        await asyncio.sleep(0.3)
    else:
        await task
    adv.release()
    return await task


async def test_the_first_calls_of_a_new_sharded_cluster_wait_for_every_format(
        held: Advertisements, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_backend, "FORMATS_WAIT_ELECTIONS", 20)  # not the bound here
    async with cluster(nodes=3, shards=SHARDS) as c:
        revs, txn_ok = await _first_calls(c, held)
    assert txn_ok
    assert _increasing(revs), revs


async def test_without_the_wait_the_first_calls_get_the_old_formats(
        held: Advertisements) -> None:
    """The broken variant, caught: served at once, the multi-shard Txn is refused and the
    shards count their own revisions, so the puts that go round them do not take
    increasing revisions."""
    async with cluster(nodes=3, shards=SHARDS) as c:
        for tn in c.nodes:
            assert tn.node is not None
            tn.node.backend.formats_settled = True
        revs, txn_ok = await _first_calls(c, held, wait=False)
    assert not txn_ok and not _increasing(revs), revs


async def test_a_member_that_never_advertises_holds_the_first_calls_for_a_while_only(
        held: Advertisements) -> None:
    """As a founder that is down: the others serve once two election timeouts since
    their start have passed, in the formats every version applies (docs/operations.md:
    the gates stay closed until it advertises)."""
    held.never.add("n3")
    async with cluster(nodes=3, shards=SHARDS) as c:
        async with asyncio.timeout(10):
            revs, txn_ok = await _first_calls(c, held)
        assert len(revs) == 12 and not txn_ok
