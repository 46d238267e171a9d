"""The cluster-version gate: format-2 (compact) commands only once every member applies them.

An older accord applies only format-1 commands (``codec.decode`` refuses the compact
form), so a proposer that sent format 2 while such a member is in the cluster would stop
that member's apply loop. Members advertise their newest format through the meta group;
while one member has not (an older node), puts and put-only Txns go out as format 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgpack
import pytest

from accord.node.backend import KV_GROUP
from accord.node.members import META_GROUP
from accord.proto import rpc_pb2
from accord.services.cluster.members import ClusterStateMachine, MemberRecord
from accord.services.kv import codec
from accord.services.kv.statemachine import COMPACT_FORMAT
from accord.testing import TestCluster, cluster


async def _until(pred: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def _gates(c: TestCluster) -> list[bool]:
    return [tn.node.backend.compact_commands for tn in c.nodes if tn.node is not None]


async def test_compact_commands_wait_for_every_member_to_support_them() -> None:
    async with cluster(nodes=3) as c:
        await _until(lambda: all(_gates(c)))  # every member advertised format 2
        n1 = c.nodes[0].node
        n3 = c.nodes[2].node
        assert n1 is not None and n3 is not None
        sent: list[bytes] = []
        propose = n1.host.propose

        async def recording(group: int, command: bytes, **kw: Any) -> Any:
            if group == KV_GROUP:
                sent.append(command)
            return await propose(group, command, **kw)

        n1.host.propose = recording  # type: ignore[method-assign]
        for tn in c.nodes:  # no re-advertisement still in flight may undo what follows
            assert tn.node is not None
            for task in tn.node._tasks:
                if task.get_name() == "advertise-version":
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        # n3 now looks like an older node: it never advertised format 2. A cancelled
        # task's advertisement already proposed can still land after this one and open
        # the gates again (one per node at most): advertise again until they stay shut.
        for _attempt in range(4):
            await n1.host.propose(META_GROUP,
                                  ClusterStateMachine.encode_advertise(n3.member_id, 1))
            with contextlib.suppress(AssertionError):
                await _until(lambda: not any(_gates(c)), 5.0)
                break
        assert not any(_gates(c)), "the gates stayed open after n3 advertised format 1"
        puts = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(
            request_put=rpc_pb2.PutRequest(key=b"t%d" % i, value=b"v")) for i in range(3)])
        sent.clear()
        await n1.backend.put(rpc_pb2.PutRequest(key=b"gated", value=b"1"))
        await n1.backend.txn(puts)
        assert len(sent) == 2
        for command in sent:  # what an older node applies
            assert msgpack.unpackb(command)[0] == codec.FORMAT
            codec.decode(command)
        # n3 "upgraded": the gate opens and the compact form goes out again
        await n1.host.propose(META_GROUP, ClusterStateMachine.encode_advertise(n3.member_id, 2))
        await _until(lambda: all(_gates(c)))
        sent.clear()
        await n1.backend.put(rpc_pb2.PutRequest(key=b"open", value=b"2"))
        await n1.backend.txn(puts)
        assert [msgpack.unpackb(cmd)[0] for cmd in sent] == [COMPACT_FORMAT, COMPACT_FORMAT]
        with pytest.raises(Exception, match="malformed KV command"):
            codec.decode(sent[0])  # why the gate exists: format 1's decoder refuses it
        kv = n1.kv.range(rpc_pb2.RangeRequest(key=b"gated"))
        assert kv.kvs[0].value == b"1"


def test_the_member_table_keeps_advertised_formats_and_reads_older_snapshots() -> None:
    t = ClusterStateMachine({1: MemberRecord(1, "a", ("http://h:1",)),
                             2: MemberRecord(2, "b", ("http://h:2",))})
    assert t.min_command_format() == 1
    t.apply(1, ClusterStateMachine.encode_advertise(1, 2))
    assert t.min_command_format() == 1
    t.apply(2, ClusterStateMachine.encode_advertise(2, 2))
    assert t.min_command_format() == 2
    back = ClusterStateMachine({})
    back.restore(t.snapshot())
    assert back.min_command_format() == 2
    old = msgpack.unpackb(t.snapshot())
    old["members"] = [row[:5] for row in old["members"]]  # as an older version wrote it
    back.restore(msgpack.packb(old))
    assert back.min_command_format() == 1
    with pytest.raises(ValueError, match="not part of this cluster"):
        t.apply(3, ClusterStateMachine.encode_advertise(9, 2))
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        t.apply(4, ClusterStateMachine.encode_advertise(1, 0))
    assert t.min_command_format() == 2
