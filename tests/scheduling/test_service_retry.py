"""The shard's command path across leader changes: retries keep the command id, so a
command whose answer was lost is applied once; a shard with no leader is UNAVAILABLE."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import scheduling_pb2 as pb
from accord.proto import scheduling_pb2_grpc
from accord.raft.host.multiraft import GroupUnavailable
from accord.services.scheduling.replicated import SchedulerShard, ShardConfig, ShardUnavailable
from accord.services.scheduling.servicer import add_scheduler_service, node_to_pb
from accord.services.scheduling.topology import make_node


class FlakyLog:
    """Applies every proposal, but loses the first ``lose`` answers (a leader change)."""

    def __init__(self, lose: int, down: bool = False) -> None:
        self.lose = lose
        self.down = down
        self.entries: list[bytes] = []
        self.shard: SchedulerShard | None = None

    async def propose(self, payload: bytes, timeout: float) -> object:
        if self.down:
            raise GroupUnavailable("no leader")
        assert self.shard is not None
        self.entries.append(payload)
        result = self.shard.apply(len(self.entries), payload)
        if self.lose > 0:
            self.lose -= 1
            raise GroupUnavailable("leader changed")
        return result

    async def barrier(self, timeout: float) -> None:
        if self.down:
            raise GroupUnavailable("no leader")


def make(lose: int, down: bool = False) -> tuple[SchedulerShard, FlakyLog]:
    flaky = FlakyLog(lose, down)
    shard = SchedulerShard(flaky.propose, flaky.barrier,
                           config=ShardConfig(request_timeout=0.5, attempt_timeout=0.1))
    flaky.shard = shard
    return shard, flaky


async def test_lost_answers_are_retried_with_the_same_id() -> None:
    shard, flaky = make(lose=2)
    node = make_node("gpu-a", gpus=4)
    out = await shard.service.register_node(node)
    assert out["ok"] and out.get("duplicate")
    await shard.service.submit_job({"id": "j", "devices_per_task": 4})
    assert len(flaky.entries) == 4  # 3 tries of the register, 1 submit
    assert list(shard.sm.jobs) == ["j"] and list(shard.sm.nodes) == ["gpu-a"]
    placed = await shard.lead_once()
    assert placed is not None and placed["accepted"] == ["j"]


async def test_no_leader_is_unavailable() -> None:
    shard, _ = make(lose=0, down=True)
    with pytest.raises(ShardUnavailable, match="no leader"):
        await shard.service.drain("gpu-a")
    server = grpc.aio.server()
    add_scheduler_service(server, shard)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = scheduling_pb2_grpc.SchedulerStub(ch)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.RegisterNode(pb.RegisterNodeRequest(node=node_to_pb(make_node("n"))))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ListJobs(pb.ListJobsRequest())
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)
