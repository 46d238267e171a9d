"""The cluster-version gate for auth: ``auth.*`` meta commands go out only once every
member advertised ``AUTH_FORMAT`` (an older member would stop at an unknown command)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from accord.node import auth as node_auth
from accord.node.config import load_config
from accord.services.auth.statemachine import AUTH_FORMAT, encode
from accord.services.cluster.members import ClusterStateMachine, MemberRecord
from accord.services.kv.errors import EtcdError


class FakeHost:
    def __init__(self) -> None:
        self.proposed: list[tuple[int, bytes]] = []

    async def propose(self, group: int, command: bytes) -> Any:
        self.proposed.append((group, command))
        return "applied"

    async def read_barrier(self, group: int) -> None:
        return None


async def test_auth_changes_wait_for_every_member(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_auth, "GATE_WAIT_S", 0.3)
    cluster = ClusterStateMachine({1: MemberRecord(1, "a", ("http://h:1",)),
                                   2: MemberRecord(2, "b", ("http://h:2",))})
    host = FakeHost()
    guard = node_auth.auth_guard(load_config(["--name", "a"], environ={}), cluster,
                                 host)  # type: ignore[arg-type]
    cluster.apply(1, ClusterStateMachine.encode_advertise(1, AUTH_FORMAT))
    cluster.apply(2, ClusterStateMachine.encode_advertise(2, 2))  # an older member
    with pytest.raises(EtcdError) as e:
        await guard.commit(encode("role_add", "", "r"))
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "upgrade every member" in e.value.message and not host.proposed
    cluster.apply(3, ClusterStateMachine.encode_advertise(2, AUTH_FORMAT))
    assert await guard.commit(encode("role_add", "", "r")) == "applied"
    assert len(host.proposed) == 1
