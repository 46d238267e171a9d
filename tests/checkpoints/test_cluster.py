"""Checkpoint manifests on a real 3-node cluster (``accord serve`` subprocesses).

A zombie incarnation is refused once its lock passed on; a commit with missing shards is
refused and names them; 1,024 ranks register concurrently and exactly one of several
concurrent commits succeeds; bad input gets its status code and changes nothing; a
restarting job's watch sees the latest pointer move.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from accord.client import AccordClient, ClientError
from accord.client.checkpoint_writer import CheckpointCoordinator
from accord.services.checkpoints.checksum import of_bytes
from tests.integration.cluster import ProcCluster

TTL = 30
"""Coordinator sessions: long, so a loaded machine does not lapse them mid-test."""


def shard(job: str, step: int, rank: int, token: int = 0) -> dict[str, object]:
    body = f"{job}/{step}/{rank}".encode()
    return {"shard_id": f"rank-{rank}", "rank": rank, "size": len(body),
            "checksum": list(of_bytes(body).to_wire()),
            "uri": f"file:///ckpt/{job}/{step}/rank-{rank}.t{token}",
            "tensors": [["w", [8 * 4096], [8 * rank], [8], "float32"]]}


def expected(ranks: int) -> list[tuple[str, int]]:
    return [(f"rank-{r}", r) for r in range(ranks)]


async def save(coord: CheckpointCoordinator, step: int, ranks: int = 4) -> None:
    await coord.begin(step, layout={"world_size": ranks}, expected=expected(ranks))
    await coord.ckpt.register_shards(coord.job, step, coord.token,
                                     [shard(coord.job, step, r, coord.token)
                                      for r in range(ranks)])
    await coord.commit(step)


async def test_a_zombie_incarnation_is_refused_naming_the_current_one(cluster: ProcCluster
                                                                      ) -> None:
    async with AccordClient(cluster.endpoints) as client:
        ckpt = client.checkpoints
        old = CheckpointCoordinator(client, "zombie-job", ttl=TTL)
        await old.__aenter__()
        await save(old, 100)
        await old.begin(200, layout={"world_size": 4}, expected=expected(4))
        # The job is restarted: the old coordinator's session is gone (as when its lease
        # expires after a crash) and the new incarnation takes the lock.
        assert old.lock.session is not None
        await client.lease_revoke(old.lock.session.id)
        with pytest.raises(ClientError) as nobody:
            await ckpt.commit("zombie-job", 200, old.token)
        assert nobody.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"fencing token {old.token} is stale: nobody holds lock" in nobody.value.message
        async with CheckpointCoordinator(client, "zombie-job", ttl=TTL) as new:
            assert new.token > old.token
            before = await ckpt.manifest("zombie-job", 200)
            for call in (ckpt.commit("zombie-job", 200, old.token),
                         ckpt.begin("zombie-job", 300, old.token, layout={"world_size": 4},
                                    expected=expected(4)),
                         ckpt.abort("zombie-job", 200, old.token)):
                with pytest.raises(ClientError) as stale:
                    await call
                assert stale.value.code == grpc.StatusCode.FAILED_PRECONDITION
                assert f"token {old.token} is stale" in stale.value.message
                assert f"token {new.token}" in stale.value.message
            assert await ckpt.manifest("zombie-job", 200) == before
            # The new incarnation re-begins step 200: the zombie's pending attempt is
            # superseded, and from then on the state machine refuses the old token too.
            assert await new.begin(200, layout={"world_size": 4}, expected=expected(4)) == [200]
            with pytest.raises(ClientError) as reg:
                await ckpt.register_shards("zombie-job", 200, old.token,
                                           [shard("zombie-job", 200, 0)])
            assert f"token {new.token}" in reg.value.message
            await ckpt.register_shards("zombie-job", 200, new.token,
                                       [shard("zombie-job", 200, r, new.token) for r in range(4)])
            assert await new.commit(200) == 200
        assert await ckpt.latest("zombie-job") == 200


async def test_a_commit_with_missing_shards_is_refused_and_names_them(cluster: ProcCluster
                                                                      ) -> None:
    async with AccordClient(cluster.endpoints) as client, \
            CheckpointCoordinator(client, "missing-job", ttl=TTL) as coord:
        await save(coord, 1)
        await coord.begin(2, layout={"world_size": 8}, expected=expected(8))
        await coord.ckpt.register_shards("missing-job", 2, coord.token,
                                         [shard("missing-job", 2, r) for r in (0, 1, 2, 4, 5, 7)])
        with pytest.raises(ClientError) as e:
            await coord.commit(2)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "2 of 8 expected shards are not registered: rank-3 (rank 3), rank-6 (rank 6)" \
            in e.value.message
        assert await coord.ckpt.latest("missing-job") == 1
        m = await coord.ckpt.manifest("missing-job", 2)
        assert len(m.shards) == 6 and m.state == 1  # still pending


async def test_1024_ranks_register_concurrently_and_the_commit_succeeds_once(
        cluster: ProcCluster) -> None:
    ranks = 1024
    async with AccordClient(cluster.endpoints, call_timeout_s=20) as client, \
            CheckpointCoordinator(client, "big-job", ttl=TTL) as coord:
        await coord.begin(10, layout={"world_size": ranks, "dp": 128, "tp": 8},
                          expected=expected(ranks))
        # Every rank its own client (its own channel, spread over the members).
        eps = cluster.endpoints.split(",")
        clients = [AccordClient(eps[r % 3:] + eps[:r % 3]) for r in range(32)]
        try:
            answers = await asyncio.gather(*(
                clients[r % 32].checkpoints.register_shards("big-job", 10, coord.token,
                                                            [shard("big-job", 10, r)])
                for r in range(ranks)))
            assert sum(a.registered for a in answers) == ranks
            assert min(a.remaining for a in answers) == 0
            results = await asyncio.gather(*(c.checkpoints.commit("big-job", 10, coord.token)
                                             for c in clients[:5]), return_exceptions=True)
        finally:
            for c in clients:
                await c.close()
        ok = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ClientError)]
        assert len(ok) == 1 and ok[0].latest == 10 and ok[0].latest_changed
        assert len(refused) == 4
        assert all(r.code == grpc.StatusCode.ALREADY_EXISTS and "committed once" in r.message
                   for r in refused)
        m = await client.checkpoints.manifest("big-job")
        assert m.step == 10 and len(m.shards) == ranks and m.latest
        assert [s.rank for s in m.shards] == list(range(ranks))


async def test_bad_input_gets_a_clear_code_and_changes_nothing(cluster: ProcCluster) -> None:
    async with AccordClient(cluster.endpoints) as client, \
            CheckpointCoordinator(client, "bad-job", ttl=TTL) as coord:
        ckpt = client.checkpoints
        await save(coord, 5)
        before = await ckpt.steps("bad-job")
        layout = {"world_size": 4}
        big = [(f"s{i}", 0) for i in range(70_000)]
        cases = [
            (ckpt.begin("bad-job", -1, coord.token, layout=layout, expected=expected(4)),
             grpc.StatusCode.INVALID_ARGUMENT, "step -1 is negative"),
            (ckpt.manifest("no-such-job"), grpc.StatusCode.NOT_FOUND, "unknown"),
            (ckpt.begin("bad-job", 5, coord.token, layout=layout, expected=expected(4)),
             grpc.StatusCode.ALREADY_EXISTS, "already exists"),
            (ckpt.begin("bad-job", 6, coord.token, layout=layout, expected=big),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "at most 65536"),
            (ckpt.register_shards("bad-job", 5, coord.token,
                                  [{**shard("bad-job", 5, 1), "uri": "not a url"}]),
             grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
            (ckpt.commit("bad-job", 5, coord.token - 1), grpc.StatusCode.FAILED_PRECONDITION,
             f"held by the incarnation with token {coord.token}"),
        ]
        for call, code, text in cases:
            with pytest.raises(ClientError) as e:
                await call
            assert e.value.code == code and text in e.value.message, e.value
        await coord.begin(6, layout=layout, expected=expected(4))
        with pytest.raises(ClientError) as outside:
            await ckpt.register_shards("bad-job", 6, coord.token, [shard("bad-job", 6, 9)])
        assert outside.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "not in the expected shard set" in outside.value.message
        after = await ckpt.steps("bad-job")
        assert [s for s in after.steps if s.step != 6] == list(before.steps)


async def test_a_restarting_job_waits_on_the_latest_pointer(cluster: ProcCluster) -> None:
    async with AccordClient(cluster.endpoints) as client, \
            CheckpointCoordinator(client, "watch-job", ttl=TTL) as coord:
        seen: list[int | None] = []

        async def watch() -> None:
            async for step in client.checkpoints.watch_latest("watch-job", timeout=30):
                seen.append(step)
                if step == 2:
                    return

        waiter = asyncio.create_task(watch())
        try:
            await save(coord, 1)
            await save(coord, 2)
            await asyncio.wait_for(waiter, 30)
        finally:
            waiter.cancel()
        assert seen[-1] == 2 and all(a is None or a in (1, 2) for a in seen)
        assert seen == sorted(seen, key=lambda x: -1 if x is None else x)



async def test_a_job_that_dies_mid_save_leaves_a_step_the_service_expires(cluster: ProcCluster
                                                                         ) -> None:
    async with AccordClient(cluster.endpoints) as client, \
            CheckpointCoordinator(client, "dying-job", ttl=TTL) as coord:
        await save(coord, 1)
        await coord.begin(2, layout={"world_size": 4}, expected=expected(4), lease_s=1.0)
        await coord.ckpt.register_shards("dying-job", 2, coord.token,
                                         [shard("dying-job", 2, 0, coord.token)])
        # Nobody registers or commits any more: the group leader aborts the step.
        for _ in range(300):  # bounded: 30 s
            m = await coord.ckpt.manifest("dying-job", 2)
            if m.state != 1:
                break
            await asyncio.sleep(0.1)
        assert m.state == 3 and "lease expired" in m.reason  # ABORTED
        gc = await coord.ckpt.gc(["dying-job"], dry_run=True)
        assert [g.uri for g in gc.deletable] == [shard("dying-job", 2, 0, coord.token)["uri"]]
        assert await coord.ckpt.latest("dying-job") == 1


async def test_the_sync_twin_waits_for_a_first_checkpoint(cluster: ProcCluster) -> None:
    from accord.client.sync import SyncClient

    def restarting_job() -> tuple[int | None, int | None]:
        with SyncClient(cluster.endpoints) as sync:
            before = sync.checkpoints.latest("sync-job") if any(
                j.job == "sync-job" for j in sync.checkpoints.jobs()) else None
            return before, sync.checkpoints.wait_latest("sync-job", after=None, timeout=30)

    waiter = asyncio.create_task(asyncio.to_thread(restarting_job))
    await asyncio.sleep(1.0)  # the waiter is watching a job that has no checkpoint yet
    async with AccordClient(cluster.endpoints) as client, \
            CheckpointCoordinator(client, "sync-job", ttl=TTL) as coord:
        await save(coord, 7)
    assert await asyncio.wait_for(waiter, 40) == (None, 7)
