"""Background DECIDEs riding with the coordinator's next command to their shard (BATCH).

A multi-shard Txn answered after its decision leaves its other participants' commits
(``DECIDE``) to the background; each waits up to ``DECIDE_LINGER_S`` for another command
of the coordinator to the same shard and goes with it in one entry. Shown here: a
client that writes the same keys again costs two entries per Txn, not three; a command
in a batch that fails leaves the others applied; a reader meeting a queued DECIDE's
intent sends it at once; a carrier that fails still delivers what rode with it (the
broken variant that drops them is caught); the gate keeps one entry per DECIDE.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors, xcommands, xcoord
from tests.kv.helpers import cmp, op_get, op_put
from tests.kv.test_xshard import Shards, _one_key_on_each


class Counting(Shards):
    """Counts the entries proposed per kind (a BATCH counts once, as one entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[int] = []
        self.fail_next_batch = False

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        if command[1:2] == bytes([xcommands.XFORMAT]):
            kind = xcommands.decode(command)[0]
            self.entries.append(kind)
            if kind == xcommands.XKind.BATCH and self.fail_next_batch:
                self.fail_next_batch = False
                await asyncio.sleep(0)
                raise errors.TIMEOUT  # lost on the way: nothing of it applied
        return await super().commit(command, shard)


class Ungated(Counting):
    batched_decides = False


def _cas(keys: list[bytes], value: bytes) -> pb.TxnRequest:
    return pb.TxnRequest(compare=[cmp(k, "VERSION", "GREATER", -1) for k in keys],
                         success=[op_put(k, value) for k in keys])


async def test_a_client_writing_the_same_keys_again_costs_two_entries_per_txn() -> None:
    b = Counting()
    keys = _one_key_on_each(b, (0, 1))
    rounds = 20
    for i in range(rounds):
        resp = await b.txn(_cas(keys, f"v{i}".encode()))
        assert resp.succeeded
    await b.xcoord.drain()
    assert not b.machines[1].intents, "every DECIDE landed"
    for k in keys:
        (kv,) = (await b.range(pb.RangeRequest(key=k))).kvs
        assert kv.value == f"v{rounds - 1}".encode() and kv.version == rounds
    # Per Txn: the prepare on shard 1 (with the previous DECIDE riding), the record's
    # prepare-decide; the last DECIDE alone.
    assert len(b.entries) == 2 * rounds + 1
    assert b.entries.count(xcommands.XKind.BATCH) == rounds - 1
    assert b.xcoord.stats_batched == rounds - 1


async def test_without_the_gate_each_decide_is_an_entry_of_its_own() -> None:
    b = Ungated()
    keys = _one_key_on_each(b, (0, 1))
    for i in range(5):
        assert (await b.txn(_cas(keys, f"v{i}".encode()))).succeeded
    await b.xcoord.drain()
    assert xcommands.XKind.BATCH not in b.entries
    assert b.entries.count(xcommands.XKind.DECIDE) == 5


async def test_a_failing_command_in_a_batch_leaves_the_others_applied() -> None:
    b = Shards()
    keys = _one_key_on_each(b, (0, 1))
    prepare = xcommands.encode_prepare(7, 0, 0, 1, b.shards, 10**15, 0,
                                       _cas(keys, b"x").SerializeToString())
    bad = xcommands.encode_reserve(99, 5)  # an intent that is not there: refused, no change
    answers = b.machines[1].apply(xcommands.encode_batch([bad, prepare, prepare]))
    assert isinstance(answers, list) and len(answers) == 3
    assert answers[0].ok is False and answers[0].reason == "gone"
    assert answers[1].ok is True
    assert answers[2].ok is False and answers[2].reason == "again"
    assert 7 in b.machines[1].intents.intents


@pytest.mark.parametrize("members", [[], [b"not a command"],
                                     [xcommands.encode_batch([xcommands.encode_reserve(1, 2)])]])
async def test_a_malformed_batch_is_refused_whole(members: list[bytes]) -> None:
    b = Shards()
    before = b.machines[1].revision
    with pytest.raises(errors.EtcdError, match="malformed KV command"):
        b.machines[1].apply(xcommands.encode_batch(members))
    assert b.machines[1].revision == before


async def test_a_reader_meeting_a_queued_decide_sends_it_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xcoord, "DECIDE_LINGER_S", 3600.0)  # it would never go by itself
    b = Counting()
    keys = _one_key_on_each(b, (0, 1))
    assert (await b.txn(_cas(keys, b"new"))).succeeded
    assert b.machines[1].intents, "shard 1's DECIDE is queued"
    got = await asyncio.wait_for(b.txn(pb.TxnRequest(success=[op_get(keys[1])])), 10)
    assert got.responses[0].response_range.kvs[0].value == b"new"
    assert not b.machines[1].intents
    await b.xcoord.close()


async def _carrier_fails(broken: bool) -> bool:
    """A Txn's queued DECIDE rides with the next Txn's prepare, whose entry is lost: is
    the first Txn's intent gone soon after (long before its deadline)?"""
    b = Counting()
    b.xcoord.broken_drop_riders = broken
    keys = _one_key_on_each(b, (0, 1))
    other = _one_key_on_each(b, (2,))[0]
    assert (await b.txn(_cas(keys, b"one"))).succeeded
    b.fail_next_batch = True
    with pytest.raises(errors.EtcdError):
        await b.txn(_cas([keys[0], other, keys[1]], b"two"))
    for _ in range(200):
        if not any(i.txn_id for i in b.machines[1].intents.intents.values()):
            break
        await asyncio.sleep(0.001)
    gone = not b.machines[1].intents
    await b.xcoord.close()
    return gone


async def test_commands_riding_with_a_failed_carrier_still_land() -> None:
    assert await _carrier_fails(broken=False)


async def test_the_broken_variant_that_drops_the_riders_is_caught() -> None:
    assert not await _carrier_fails(broken=True)
