"""The checkpoint group's leader killed (kill -9) in the middle of commits leaves each
job's latest pointer at the old or the new step, whole, never a mix; and every manifest,
pin, retention policy and garbage record survives a kill -9 of the whole cluster."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.client import AccordClient, ClientError
from accord.client.checkpoint_writer import CheckpointCoordinator
from accord.node.members import DEBUG_GROUPS_METHOD
from accord.services.checkpoints.replicated import CHECKPOINT_GROUP
from tests.checkpoints.test_cluster import TTL, expected, save, shard
from tests.integration.cluster import ProcCluster, ProcNode

RANKS = 4


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path, 3) as c:
        yield c


def live(c: ProcCluster) -> list[ProcNode]:
    return [n for n in c.nodes if n.proc is not None and n.proc.poll() is None]


def group_leader(c: ProcCluster, timeout: float = 20.0) -> ProcNode:
    """The member every live member agrees leads the checkpoint group."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen, ids = set(), {}
        for n in live(c):
            try:
                report = json.loads(n.channel().unary_unary(DEBUG_GROUPS_METHOD)(b"", timeout=2))
            except Exception:
                continue
            ids[report["member_id"]] = n
            seen.add(report["groups"][str(CHECKPOINT_GROUP)]["leader"])
        if len(seen) == 1 and (lid := seen.pop()) in ids:
            return ids[lid]
        time.sleep(0.05)
    raise AssertionError("the checkpoint group has no agreed leader")


async def picture(c: ProcCluster, jobs: list[str]) -> list[object]:
    """Every live member's view (linearizable reads, one client per member): jobs, steps,
    manifests of the latest, and the garbage a dry-run GC reports."""
    views = []
    for n in live(c):
        async with AccordClient([n.endpoint], retry_budget_s=30) as one:
            ck = one.checkpoints
            view: list[object] = [sorted((j.job, j.latest, j.committed, tuple(j.pinned),
                                          j.retention.keep_last) for j in await ck.jobs())]
            for job in jobs:
                m = await ck.manifest(job)
                view.append((m.step, m.state, [(s.shard_id, s.checksum.digest, s.uri)
                                               for s in m.shards]))
                view.append([(s.step, s.state) for s in (await ck.steps(job)).steps])
            gc = await ck.gc([], dry_run=True)
            view.append(sorted(g.uri for g in gc.deletable))
            views.append(view)
    return views


async def test_leader_killed_mid_commit_leaves_old_or_new_latest_and_all_survives_restart(
        own_cluster: ProcCluster) -> None:
    c = own_cluster
    async with AccordClient(c.endpoints, call_timeout_s=3, retry_budget_s=60) as client, \
            CheckpointCoordinator(client, "failover-job", ttl=TTL) as coord:
        await save(coord, 1, RANKS)
        for round_, delay in enumerate((0.0, 0.003, 0.02)):
            step = 2 + round_
            await coord.begin(step, layout={"world_size": RANKS}, expected=expected(RANKS))
            await coord.ckpt.register_shards("failover-job", step, coord.token,
                                             [shard("failover-job", step, r, coord.token)
                                              for r in range(RANKS)])
            leader = group_leader(c)
            commit = asyncio.create_task(coord.ckpt.commit("failover-job", step, coord.token))
            await asyncio.sleep(delay)
            c.kill(leader)
            try:
                answer = await commit
                committed = answer.latest == step
            except ClientError as e:  # the retry found it committed by the first attempt
                committed = "committed once" in e.message
            views = await picture(c, ["failover-job"])
            assert all(v == views[0] for v in views), views
            m = await coord.ckpt.manifest("failover-job")
            assert m.step in (step - 1, step), m.step
            assert m.step == step if committed else True
            assert m.state == 2 and len(m.shards) == RANKS  # whole: every shard, committed
            assert {s.uri for s in m.shards} == {shard("failover-job", m.step, r, coord.token)[
                "uri"] for r in range(RANKS)}
            if m.step != step:  # the kill came first: the step is still pending, commit it now
                await coord.commit(step)
            c.start(leader)
            c.wait_serving(leader)
        await coord.ckpt.pin("failover-job", 2)
        await coord.ckpt.set_retention("failover-job", keep_last=1)
        await coord.ckpt.gc(["failover-job"])  # deletes 1 and 3 (2 is pinned, 4 the latest)
        await coord.begin(5, layout={"world_size": RANKS}, expected=expected(RANKS))
        await coord.ckpt.register_shards("failover-job", 5, coord.token,
                                         [shard("failover-job", 5, 0, coord.token)])
        before = await picture(c, ["failover-job"])
        assert before[0][2] == [(1, 4), (2, 2), (3, 4), (4, 2), (5, 1)]

    # The whole cluster dies at once and comes back.
    for n in c.nodes:
        c.kill(n)
    c.start_all()
    after = await picture(c, ["failover-job"])
    assert after == before
    async with AccordClient(c.endpoints, retry_budget_s=60) as client, \
            CheckpointCoordinator(client, "failover-job", ttl=TTL) as coord:
        # The pending step of the incarnation before the restart is superseded.
        assert await coord.begin(6, layout={"world_size": RANKS},
                                 expected=expected(RANKS)) == [5]
