"""`accord jobs` and `accord nodes` against an in-process Scheduler server (one replica,
leader loop running), called in a worker thread as the shell would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from accord import cli
from accord.services.scheduling.replicated import SchedulerShard, ShardConfig, local_shard
from accord.services.scheduling.servicer import add_scheduler_service, node_to_pb
from accord.services.scheduling.topology import make_node


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, SchedulerShard]]:
    shard = local_shard(ShardConfig(cycle_interval=0.05, leader_grace=60.0))
    server = grpc.aio.server()
    add_scheduler_service(server, shard)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    shard.start()
    try:
        yield f"127.0.0.1:{port}", shard
    finally:
        await shard.stop()
        await server.stop(0)


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_jobs_and_nodes_commands(endpoint: tuple[str, SchedulerShard], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ep, shard = endpoint
    spec = tmp_path / "node.json"
    spec.write_text(json_format.MessageToJson(node_to_pb(make_node("gpu-a", gpus=8))))
    code, out, _ = await run(capsys, "nodes", "register", "--from-json", str(spec), "--endpoints", ep)
    assert code == 0 and "gpu-a registered (8 devices)" in out
    code, out, _ = await run(capsys, "nodes", "register", "--fake", "amd-1", "--vendor", "amd",
                             "--gpus", "4", "--endpoints", ep)
    assert code == 0
    code, out, _ = await run(capsys, "jobs", "submit", "--id", "t1", "--tasks", "2", "--gpus", "4",
                             "--selector", "vendor == nvidia", "--wait", "10", "--endpoints", ep)
    assert code == 0, out
    assert "t1 running" in out and "CUDA_VISIBLE_DEVICES=" in out and "WORLD_SIZE=8" in out
    code, out, _ = await run(capsys, "jobs", "watch", "t1", "--since", "1", "--count", "1",
                             "--endpoints", ep)
    assert code == 0 and " placed t1 0@gpu-a:" in out
    code, out, _ = await run(capsys, "jobs", "show", "t1", "--json", "--endpoints", ep)
    info = json.loads(out)
    assert info["status"] == "running" and len(info["tasks"]) == 2
    code, out, _ = await run(capsys, "jobs", "ls", "--endpoints", ep)
    assert code == 0 and "t1" in out and "running" in out
    code, out, _ = await run(capsys, "nodes", "drain", "amd-1", "--endpoints", ep)
    assert code == 0 and "amd-1 drained" in out
    code, out, _ = await run(capsys, "nodes", "ls", "--endpoints", ep)
    assert "drained" in out and "gpu-a" in out and "t1" in out
    code, out, _ = await run(capsys, "nodes", "undrain", "amd-1", "--endpoints", ep)
    assert code == 0
    # Slurm's hold and release: t2 waits for t1's devices, held it is passed over
    code, out, _ = await run(capsys, "jobs", "submit", "--id", "t2", "--gpus", "4",
                             "--selector", "vendor == nvidia", "--endpoints", ep)
    assert code == 0, out
    code, out, _ = await run(capsys, "jobs", "hold", "t2", "--endpoints", ep)
    assert code == 0 and "t2 held" in out
    code, out, _ = await run(capsys, "jobs", "ls", "--status", "held", "--endpoints", ep)
    assert code == 0 and "t2" in out and "t1" not in out
    code, out, _ = await run(capsys, "jobs", "cancel", "t1", "--endpoints", ep)
    assert code == 0 and shard.sm.jobs["t1"].status == "cancelled"
    await asyncio.sleep(0.3)  # six scheduling cycles with gpu-a idle
    assert shard.sm.jobs["t2"].status == "held"
    code, out, _ = await run(capsys, "jobs", "release", "t2", "--endpoints", ep)
    assert code == 0 and "t2 released" in out
    for _ in range(100):  # bounded: placed by the next cycles
        if shard.sm.jobs["t2"].status == "running":
            break
        await asyncio.sleep(0.05)
    assert shard.sm.jobs["t2"].status == "running"
    code, _, err = await run(capsys, "jobs", "release", "t2", "--endpoints", ep)
    assert code == 1 and "FAILED_PRECONDITION" in err and "only a held job" in err
    code, _, err = await run(capsys, "jobs", "ls", "--status", "hold", "--endpoints", ep)
    assert code != 0 and "status must be one of" in err
    code, out, _ = await run(capsys, "jobs", "cancel", "t2", "--endpoints", ep)
    assert code == 0
    applied = shard.leader_info()[3]
    code, out, _ = await run(capsys, "nodes", "agent", "--fake", "gpu-x", "--interval", "0.05",
                             "--count", "3", "--endpoints", ep)
    assert code == 0 and "gpu-x registered" in out
    assert shard.sm.nodes["gpu-x"].alive
    assert shard.leader_info()[3] - applied == 4  # one registration, three heartbeats
    # errors: a clear message and a non-zero status
    code, _, err = await run(capsys, "nodes", "agent", "--fake", "gpu-y", "--interval", "5",
                             "--orphan-timeout", "8", "--endpoints", ep)
    assert code == 2 and "must be more than two heartbeat intervals" in err
    assert "gpu-y" not in shard.sm.nodes
    code, _, err = await run(capsys, "jobs", "submit", "--selector", "vendor ==", "--endpoints", ep)
    assert code == 1 and "INVALID_ARGUMENT" in err
    code, _, err = await run(capsys, "jobs", "show", "nope", "--endpoints", ep)
    assert code == 1 and "NOT_FOUND" in err
    code, _, err = await run(capsys, "jobs", "submit", "--gpus", "64", "--endpoints", ep)
    assert code == 1 and "FAILED_PRECONDITION" in err
    code, _, err = await run(capsys, "nodes", "register", "--from-json", str(tmp_path / "missing"),
                             "--endpoints", ep)
    assert code == 2 and "cannot read a node spec" in err
