"""Registrations on the hot path: validated once into the packed form, applied from it,
and coalesced into batch entries (one Raft entry for many concurrent calls)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from accord.client.checkpoints import shard_message
from accord.services.checkpoints.batching import Coalescer, batch_payload
from accord.services.checkpoints.model import CheckpointError, Shard, wire_shard_cmd
from accord.services.checkpoints.replicated import local_group
from accord.services.checkpoints.servicer import shard_cmd_from_pb
from accord.services.checkpoints.state import CheckpointStateMachine
from tests.checkpoints.helpers import Driver, records, shard


def _cmd(cid: str, op: str, **fields: Any) -> dict[str, Any]:
    return {"id": cid, "op": op, "now": 1000.0, **fields}


def _packb(cmd: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(cmd, use_bin_type=True))


# ----- the packed form --------------------------------------------------------------------------


def test_packed_registration_leaves_the_same_state_as_the_dict_form() -> None:
    by_dict, by_packed = Driver(), Driver()
    for d in (by_dict, by_packed):
        assert d.begin(ranks=4)["ok"]
    shards = [shard(r) for r in range(4)]
    assert by_dict.do("register", job="j", step=1, token=1, shards=shards)["registered"] == 4
    packed = [wire_shard_cmd(s) for s in shards]
    assert by_packed.do("register", job="j", step=1, token=1, packed=packed)["registered"] == 4
    assert [s.packed() for s in by_dict.sm.jobs["j"].steps.values()] == \
        [s.packed() for s in by_packed.sm.jobs["j"].steps.values()]
    assert by_packed.sm.refs == by_dict.sm.refs
    again = by_packed.do("register", job="j", step=1, token=1, packed=packed)
    assert again["registered"] == 0 and again["duplicates"] == 4


@pytest.mark.parametrize("bad", [
    ["rank-0", 0, 1, "crc32c", "00000000", ["file:///x", "shared_fs"]],  # an item short
    ["rank-0", "0", 1, "crc32c", "00000000", ["file:///x", "shared_fs"], b""],
    ["rank-0", 0, 1, "crc32c", "00000000", ["file:///x"], b""],  # a uri without its tier
    ["rank-0", 0, 1, "crc32c", "00000000", [], b""],
    {"shard_id": "rank-0"},
])
def test_a_malformed_packed_shard_is_refused_and_changes_nothing(bad: Any) -> None:
    d = Driver()
    assert d.begin(ranks=2)["ok"]
    before = records(d.sm)
    good = wire_shard_cmd(shard(1))
    r = d.do("register", job="j", step=1, token=1, packed=[good, bad])
    assert not r["ok"] and "a packed shard is [shard_id, rank" in r["error"]
    assert records(d.sm) == before
    with pytest.raises(CheckpointError):
        Shard.from_cmd(bad)


@pytest.mark.parametrize("change, text", [
    ({"uri": "not a url"}, "is malformed"),
    ({"checksum": ["md5", "00"]}, "checksum algorithm 'md5' is unknown"),
    ({"checksum": ["crc32c", "abc"]}, "a crc32c digest is 8 hex digits"),
    ({"checksum": ["crc32c", ""]}, "the checksum is missing"),
    ({"tensors": [["w", [4], [2], [4], "f32"]]}, "offset 2 + size 4 exceeds the global size 4"),
    ({"tensors": [["w", [4, 4], [0], [4], "f32"]]}, "need the same number of dimensions"),
    ({"tensors": [["", [4], [0], [4], "f32"]]}, "tensor name must be a non-empty string"),
    ({"shard_id": ""}, "shard id must be a non-empty string"),
    ({"uri": "", "locations": []}, "no uri: a shard needs at least one location"),
])
def test_the_servicer_refuses_a_protobuf_shard_as_the_service_refuses_its_dict(
        change: dict[str, Any], text: str) -> None:
    d = {**shard(0), **change}
    with pytest.raises(CheckpointError) as from_dict:
        wire_shard_cmd(d)
    with pytest.raises(CheckpointError) as from_pb:
        shard_cmd_from_pb(shard_message(d))
    assert text in str(from_dict.value)
    assert str(from_pb.value) == str(from_dict.value)


def test_the_servicer_packs_a_protobuf_shard_as_the_service_packs_its_dict() -> None:
    d = {**shard(3), "locations": [["s3://b/k", "object_store"]],
         "tensors": [["a", [8, 4], [4, 0], [4, 4], "bf16"], ["b", [2], [0], [2], ""]]}
    assert shard_cmd_from_pb(shard_message(d)) == wire_shard_cmd(d)


async def test_a_bad_shard_is_refused_before_anything_is_proposed() -> None:
    group = local_group()
    svc = group.service
    await svc.begin("j", 1, 1, {"world_size": 2}, [["rank-0", 0], ["rank-1", 1]])
    before = records(group.sm)
    with pytest.raises(CheckpointError) as e:
        await svc.register("j", 1, 1, [shard(0), {**shard(1), "uri": "bad url"}])
    assert "is malformed" in str(e.value)
    assert group.coalescer.commands == 0 and records(group.sm) == before


# ----- batch entries in the state machine ------------------------------------------------------


def test_a_batch_applies_each_command_on_its_own() -> None:
    d = Driver()
    assert d.begin(ranks=3)["ok"]
    batch = {"op": "batch", "cmds": [
        _cmd("a", "register", job="j", step=1, token=1, packed=[wire_shard_cmd(shard(0))]),
        _cmd("b", "register", job="j", step=1, token=1, packed=[wire_shard_cmd(shard(9))]),
        _cmd("c", "register", job="j", step=1, token=1,
             packed=[wire_shard_cmd(shard(1)), wire_shard_cmd(shard(2))]),
        {"op": "batch", "cmds": [_cmd("d", "commit", job="j", step=1, token=1)]},
    ]}
    first = d.sm.apply(_packb(batch))
    ok, outside, both, nested = first["results"]
    assert first["ok"] and ok["registered"] == 1 and both["registered"] == 2
    assert not outside["ok"] and "not in the expected shard set" in outside["error"]
    assert not nested["ok"] and "a batch holds commands, not batches" in nested["error"]
    assert sorted(d.sm.jobs["j"].steps[1].shards) == ["rank-0", "rank-1", "rank-2"]
    # the same entry again (a retried batch): every command answers as it did, nothing
    # applies twice
    before = d.sm.snapshot()
    again = d.sm.apply(_packb(batch))["results"]
    assert [r.get("duplicate") for r in again[:3]] == [True, True, True]
    assert [r["ok"] for r in again] == [r["ok"] for r in first["results"]]
    assert d.sm.snapshot() == before
    assert d.commit()["latest"] == 1


def test_an_empty_or_malformed_batch_is_refused() -> None:
    sm = CheckpointStateMachine()
    for cmds in ([], None, "x"):
        r = sm.apply({"op": "batch", "cmds": cmds})
        assert not r["ok"] and "'cmds' must be a non-empty list" in r["error"]


def test_batch_payload_is_the_msgpack_of_the_batch() -> None:
    cmds = [_cmd("a", "pin", job="j", step=1), _cmd("b", "unpin", job="j", step=2)]
    assert msgpack.unpackb(batch_payload([_packb(c) for c in cmds]), raw=False) == {
        "op": "batch", "cmds": cmds}


# ----- the coalescer ------------------------------------------------------------------------------


class Recorder:
    """A ``send`` that records each batch and answers every command with its id."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def __call__(self, payload: bytes) -> object:
        ids = [c["id"] for c in msgpack.unpackb(payload, raw=False)["cmds"]]
        self.batches.append(ids)
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), 10)
        if self.fail is not None:
            raise self.fail
        return {"ok": True, "results": [{"ok": True, "id": i} for i in ids]}


async def test_commands_submitted_together_share_one_entry_and_get_their_own_answers() -> None:
    send = Recorder()
    co = Coalescer(send)
    out = await asyncio.gather(*(co.submit(_packb(_cmd(f"c{i}", "pin"))) for i in range(20)))
    assert [r["id"] for r in out] == [f"c{i}" for i in range(20)]
    assert send.batches == [[f"c{i}" for i in range(20)]]
    assert (co.batches, co.commands) == (1, 20)


async def test_commands_arriving_while_a_batch_is_in_flight_go_in_the_next_one() -> None:
    send = Recorder()
    send.gate = asyncio.Event()
    co = Coalescer(send, max_commands=4)
    first = asyncio.ensure_future(co.submit(_packb(_cmd("first", "pin"))))
    await asyncio.sleep(0.01)
    assert send.batches == [["first"]]  # a lone command goes at once
    later = [asyncio.ensure_future(co.submit(_packb(_cmd(f"l{i}", "pin")))) for i in range(6)]
    await asyncio.sleep(0.01)
    assert len(send.batches) == 1  # one in flight: the others wait for it
    send.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 10)
    assert send.batches == [["first"], ["l0", "l1", "l2", "l3"], ["l4", "l5"]]


async def test_a_batch_that_fails_fails_each_of_its_commands() -> None:
    send = Recorder()
    send.fail = RuntimeError("no leader")
    co = Coalescer(send)
    out = await asyncio.gather(*(co.submit(_packb(_cmd(f"c{i}", "pin"))) for i in range(3)),
                               return_exceptions=True)
    assert all(isinstance(e, RuntimeError) and str(e) == "no leader" for e in out)
    send.fail = None
    assert (await co.submit(_packb(_cmd("after", "pin"))))["id"] == "after"


async def test_close_cancels_the_batch_in_flight_and_those_waiting() -> None:
    send = Recorder()
    send.gate = asyncio.Event()
    co = Coalescer(send)
    calls = [asyncio.ensure_future(co.submit(_packb(_cmd(f"c{i}", "pin")))) for i in range(2)]
    await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(co.submit(_packb(_cmd("w", "pin"))))
    await asyncio.sleep(0.01)
    await co.close()
    out = await asyncio.gather(*calls, waiting, return_exceptions=True)
    assert all(isinstance(e, asyncio.CancelledError) for e in out)


async def test_concurrent_registrations_of_a_job_take_few_entries_on_a_replica() -> None:
    group = local_group()
    svc = group.service
    hosts, per_host = 64, 8
    await svc.begin("j", 1, 1, {"world_size": hosts * per_host},
                    [[f"rank-{r}", r] for r in range(hosts * per_host)])
    answers = await asyncio.gather(*(
        svc.register("j", 1, 1, [shard(h * per_host + i) for i in range(per_host)])
        for h in range(hosts)))
    assert sum(a["registered"] for a in answers) == hosts * per_host
    assert group.coalescer.commands == hosts and group.coalescer.batches < hosts
    assert (await svc.commit("j", 1, 1))["latest"] == 1
