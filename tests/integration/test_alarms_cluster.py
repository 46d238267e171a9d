"""Alarms are the cluster's, as in etcd: raised on one member, listed and enforced by all."""

from __future__ import annotations

import pytest

import accord.testing
from accord.proto import rpc_pb2
from accord.services.cluster.members import ClusterStateMachine, MemberRecord
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError

A = rpc_pb2.AlarmRequest


async def test_an_alarm_raised_on_one_member_is_seen_and_enforced_by_every_member() -> None:
    async with accord.testing.cluster(nodes=3) as c:
        n1, n2, n3 = (tn.node for tn in c.nodes)
        assert n1 is not None and n2 is not None and n3 is not None
        await n1.backend.put(rpc_pb2.PutRequest(key=b"before", value=b"1"))
        raised = await n1.backend.alarm(A(action=A.ACTIVATE, memberID=0, alarm=rpc_pb2.NOSPACE))
        assert raised == [(0, rpc_pb2.NOSPACE)]
        await n2.backend.alarm(A(action=A.ACTIVATE, memberID=n2.member_id, alarm=rpc_pb2.NOSPACE))
        listed = await n3.backend.alarm(A(action=A.GET))
        assert sorted(listed) == sorted([(0, rpc_pb2.NOSPACE), (n2.member_id, rpc_pb2.NOSPACE)])
        with pytest.raises(EtcdError) as info:
            await n3.backend.put(rpc_pb2.PutRequest(key=b"refused", value=b"x"))
        assert info.value == errors.NO_SPACE
        assert "alarm:NOSPACE " in (await n3.backend.status()).errors
        # the alarms survive a restart of a member (they are in the meta group's log)
        await c.kill(2)
        await c.restart(2)
        again = c.nodes[2].node
        assert again is not None
        assert sorted(await again.backend.alarm(A(action=A.GET))) == sorted(listed)
        await n1.backend.alarm(A(action=A.DEACTIVATE, memberID=0, alarm=rpc_pb2.NOSPACE))
        left = await n1.backend.alarm(A(action=A.GET))
        assert left == [(n2.member_id, rpc_pb2.NOSPACE)]
        await n1.backend.alarm(A(action=A.DEACTIVATE, memberID=n2.member_id, alarm=rpc_pb2.NOSPACE))
        assert await again.backend.alarm(A(action=A.GET)) == []
        await again.backend.put(rpc_pb2.PutRequest(key=b"after", value=b"2"))


def test_alarms_travel_in_the_meta_groups_snapshot() -> None:
    t = ClusterStateMachine({1: MemberRecord(1, "a", ("http://h:1",))})
    t.apply(1, ClusterStateMachine.encode_alarm(A(action=A.ACTIVATE, memberID=0,
                                                  alarm=rpc_pb2.CORRUPT)))
    back = ClusterStateMachine({})
    held = back.alarms
    back.restore(t.snapshot())
    assert back.alarms is held and held.raised == [(0, rpc_pb2.CORRUPT)]
    with pytest.raises(ValueError, match="action"):
        t.apply(2, ClusterStateMachine.encode_alarm(A(action=A.GET)))
