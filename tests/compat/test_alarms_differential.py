"""Alarms as etcd keeps them: the same Alarm requests to a real etcd and to accord.

An alarm raised with ``memberID`` 0 is kept under member 0, apart from the same alarm
raised for a named member: ``GET`` lists both, deactivating one leaves the other.
Member ids differ between the servers, so each side's own id is written as ``SELF``;
etcd lists alarms from a map, so lists compare as sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accord.proto import rpc_pb2, rpc_pb2_grpc
from tests.compat.servers import accord_server, etcd_server

A = rpc_pb2.AlarmRequest
SELF = "SELF"


class Side:
    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self.m = rpc_pb2_grpc.MaintenanceStub(self.channel)
        self.id = self.m.Status(rpc_pb2.StatusRequest(), timeout=10).header.member_id

    def alarm(self, action: int, member: object, alarm: int) -> set[tuple[object, str]]:
        mid = self.id if member == SELF else int(member)  # type: ignore[call-overload]
        resp = self.m.Alarm(A(action=action, memberID=mid, alarm=alarm), timeout=10)  # type: ignore[arg-type]
        return {(SELF if a.memberID == self.id else a.memberID, rpc_pb2.AlarmType.Name(a.alarm))
                for a in resp.alarms}

    def errors(self) -> set[str]:
        st = self.m.Status(rpc_pb2.StatusRequest(), timeout=10)
        return {e.replace(f"memberID:{self.id} ", "memberID:SELF ").strip() for e in st.errors}


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    with etcd_server(Path(tmp_path_factory.mktemp("etcd-alarm"))) as etcd, accord_server() as acc:
        e, a = Side(etcd.endpoint), Side(acc.endpoint)
        yield e, a
        e.channel.close()
        a.channel.close()


STEPS = [
    (A.ACTIVATE, 0, rpc_pb2.NOSPACE),
    (A.GET, 0, rpc_pb2.NONE),
    (A.ACTIVATE, SELF, rpc_pb2.NOSPACE),
    (A.ACTIVATE, 0, rpc_pb2.NOSPACE),  # again: answered, still one entry for member 0
    (A.GET, 0, rpc_pb2.NONE),
    (A.GET, 0, rpc_pb2.NOSPACE),
    (A.GET, 0, rpc_pb2.CORRUPT),
    (A.ACTIVATE, 0, rpc_pb2.CORRUPT),
    (A.GET, 0, rpc_pb2.NONE),
    (A.DEACTIVATE, 0, rpc_pb2.NOSPACE),
    (A.GET, 0, rpc_pb2.NONE),
    (A.DEACTIVATE, 0, rpc_pb2.NOSPACE),  # already gone: nothing
    (A.DEACTIVATE, SELF, rpc_pb2.NOSPACE),
    (A.DEACTIVATE, 0, rpc_pb2.CORRUPT),
    (A.GET, 0, rpc_pb2.NONE),
]


def test_alarms_for_member_zero_and_a_named_member_are_kept_apart_as_etcd(
    sides: tuple[Side, Side],
) -> None:
    etcd, acc = sides
    for i, (action, member, alarm) in enumerate(STEPS):
        got = acc.alarm(action, member, alarm)
        want = etcd.alarm(action, member, alarm)
        assert got == want, f"step {i} {A.AlarmAction.Name(action)} {member} " \
                            f"{rpc_pb2.AlarmType.Name(alarm)}: accord {got}, etcd {want}"
        if i == 4:
            assert want == {(0, "NOSPACE"), (SELF, "NOSPACE")}
            assert acc.errors() == etcd.errors()
