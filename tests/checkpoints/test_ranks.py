"""A job's ranks as real processes: each writes numpy arrays into a safetensors shard and
registers it; the coordinator commits; a loader reassembles the global tensors from the
manifest's tensor index; ``accord ckpt`` lists, shows, pins, verifies (catching a
truncated file and a flipped byte, by shard) and collects garbage."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
from safetensors.numpy import load

from accord.client import AccordClient
from accord.client.checkpoint_writer import CheckpointCoordinator
from accord.client.sync import SyncClient
from tests.checkpoints.rank_worker import COLS, ROWS, arrays
from tests.checkpoints.test_cluster import TTL
from tests.integration.cluster import ProcCluster

WORLD = 4


def ckpt_cli(cluster: ProcCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accord", "ckpt", *args], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "ACCORD_ENDPOINTS": cluster.endpoints})


def run_ranks(cluster: ProcCluster, job: str, step: int, token: int, base: str) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-m", "tests.checkpoints.rank_worker",
                               cluster.endpoints, job, str(step), str(token), str(r), str(WORLD),
                               base], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


async def test_ranks_write_register_commit_and_a_loader_reshards(cluster: ProcCluster,
                                                                tmp_path: Path) -> None:
    base = (tmp_path / "store").as_uri()
    job = "numpy-job"
    async with AccordClient(cluster.endpoints) as client, \
            CheckpointCoordinator(client, job, ttl=TTL) as coord:
        for step in (100, 200, 300):
            await coord.begin(step, layout={"world_size": WORLD, "dp": 1, "tp": WORLD},
                              expected=[(f"rank-{r}", r) for r in range(WORLD)])
            # In a thread: the coordinator's session keeps its lease alive meanwhile.
            reports = await asyncio.to_thread(run_ranks, cluster, job, step, coord.token, base)
            assert sorted(r["shard"]["rank"] for r in reports) == list(range(WORLD))
            assert await coord.commit(step, wait_s=30) == step
        m = await client.checkpoints.manifest(job)
        assert m.step == 300 and len(m.shards) == WORLD
        # A loader with another layout: the global tensors, rebuilt from the index alone.
        full_w = np.zeros((ROWS * WORLD, COLS), np.float32)
        full_b = np.zeros((WORLD, COLS), np.int64)
        for s in m.shards:
            with fsspec.open(s.uri, "rb") as f:
                tensors = load(f.read())
            for t in s.tensors:
                target = full_w if t.name == "w" else full_b
                assert list(t.global_shape) == list(target.shape)
                sl = tuple(slice(o, o + n) for o, n in zip(t.offsets, t.sizes, strict=True))
                target[sl] = tensors[t.name]
        for r in range(WORLD):
            want = arrays(r, WORLD)
            assert np.array_equal(full_w[ROWS * r:ROWS * (r + 1)], want["w"])
            assert np.array_equal(full_b[r:r + 1], want["bias"])

    # --- the CLI ---------------------------------------------------------------------------
    ls = ckpt_cli(cluster, "ls", job)
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    assert lines[0].split()[:3] == ["STEP", "STATE", "SHARDS"]
    assert [ln.split()[0] for ln in lines[1:]] == ["100", "200", "300"]
    assert "latest" in lines[3] and f"{WORLD}/{WORLD}" in lines[3]
    jobs = json.loads(ckpt_cli(cluster, "--json", "ls").stdout)
    assert {"job": job, "latest": "300"}.items() <= next(j for j in jobs if j["job"] == job).items()
    assert ckpt_cli(cluster, "latest", job).stdout.strip() == "300"
    show = ckpt_cli(cluster, "show", job, "200")
    assert "job numpy-job step 200: committed" in show.stdout and "rank-3" in show.stdout
    assert json.loads(ckpt_cli(cluster, "--json", "show", job).stdout)["step"] == "300"
    assert "pinned" in ckpt_cli(cluster, "pin", job, "100").stdout

    ok = ckpt_cli(cluster, "verify", job)
    assert ok.returncode == 0 and f"all {WORLD} shard copies verified" in ok.stdout
    assert f"{WORLD}/{WORLD} shards, 0 bad" in ok.stderr  # the progress bar
    m300 = json.loads(ckpt_cli(cluster, "--json", "show", job).stdout)
    paths = {s["shard_id"]: Path(s["uri"].removeprefix("file://")) for s in m300["shards"]}
    paths["rank-1"].write_bytes(paths["rank-1"].read_bytes()[:-3])           # truncated
    data = bytearray(paths["rank-2"].read_bytes())
    data[len(data) // 2] ^= 0x40                                             # a flipped byte
    paths["rank-2"].write_bytes(bytes(data))
    bad = ckpt_cli(cluster, "--json", "verify", job)
    assert bad.returncode == 1
    report = {b["shard_id"]: b["status"] for b in json.loads(bad.stdout)["bad"]}
    assert report == {"rank-1": "size", "rank-2": "checksum"}
    table = ckpt_cli(cluster, "verify", job)
    assert table.returncode == 1 and "2 of 4 shard copies are bad" in table.stdout
    # The same verdicts from Python: client.checkpoints.verify, what the command prints.
    async with AccordClient(cluster.endpoints) as client:
        seen: list[tuple[int, int]] = []
        rep = await client.checkpoints.verify(
            job, progress=lambda check, done, total: seen.append((done, total)))
        assert rep.manifest.step == 300 and len(rep.checks) == WORLD and not rep.ok
        assert {b.shard_id: b.status for b in rep.bad} == {"rank-1": "size", "rank-2": "checksum"}
        assert seen == [(i, WORLD) for i in range(1, WORLD + 1)]
        assert (await client.checkpoints.verify(job, 100)).ok  # an older step is untouched
        with pytest.raises(ValueError, match="workers must be >= 1"):
            await client.checkpoints.verify(job, workers=0)
    with SyncClient(cluster.endpoints) as sync:
        assert len(sync.checkpoints.verify(job, all_locations=True).bad) == 2

    # Retention: keep the last one; step 100 is pinned, so only 200 goes.
    async with AccordClient(cluster.endpoints) as client:
        await client.checkpoints.set_retention(job, keep_last=1)
    dry = json.loads(ckpt_cli(cluster, "--json", "gc", job, "--dry-run").stdout)
    assert [d["step"] for d in dry["deleted"]] == ["200"]
    assert json.loads(ckpt_cli(cluster, "--json", "ls", job).stdout)["steps"][1]["state"] == \
        "COMMITTED"  # a dry run changed nothing
    gc = ckpt_cli(cluster, "gc", job, "--delete")
    assert gc.returncode == 0 and "deleted 1 steps by retention" in gc.stdout, gc.stderr
    assert f"{WORLD} objects safe to delete, {WORLD} deleted now" in gc.stdout
    step200 = [Path(s["uri"].removeprefix("file://")) for s in json.loads(
        ckpt_cli(cluster, "--json", "show", job, "200").stdout)["shards"]]
    assert step200 and not any(p.exists() for p in step200)
    assert all(p.exists() for p in paths.values())  # the latest is untouched
    again = json.loads(ckpt_cli(cluster, "--json", "gc", job).stdout)
    assert again["deletable_total"] == "0" and again["deleted"] == []
    assert "unpinned" in ckpt_cli(cluster, "unpin", job, "100").stdout
    missing = ckpt_cli(cluster, "show", "no-such-job")
    assert missing.returncode == 1 and "unknown" in missing.stderr and "NOT_FOUND" in missing.stderr
