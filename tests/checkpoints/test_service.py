"""The service layer without Raft: the lock-holder fence, dry-run GC agreeing with GC, and
the latest-pointer watch on one replica."""

from __future__ import annotations

import asyncio

import pytest

from accord.services.checkpoints.model import CheckpointError
from accord.services.checkpoints.replicated import local_group
from tests.checkpoints.helpers import shard


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _expected(n: int) -> list[list[object]]:
    return [[f"rank-{r}", r] for r in range(n)]


async def test_begin_commit_abort_need_the_lock_holders_token() -> None:
    holder: dict[str, int | None] = {"j": 9}

    async def current(job: str) -> int | None:
        return holder[job]

    svc = local_group(holder=current).service
    layout = {"world_size": 2}
    await svc.begin("j", 1, 9, layout, _expected(2))
    for token, text in ((7, "is held by the incarnation with token 9"),
                        (11, "is not a token of lock '/ckpt/j/coordinator'")):
        with pytest.raises(CheckpointError) as e:
            await svc.begin("j", 2, token, layout, _expected(2))
        assert e.value.kind == "stale" and e.value.current == 9 and text in str(e.value)
    await svc.register("j", 1, 9, [shard(0), shard(1)])
    holder["j"] = None  # the incarnation's lease ran out; nobody has the lock yet
    with pytest.raises(CheckpointError) as lost:
        await svc.commit("j", 1, 9)
    assert "nobody holds lock '/ckpt/j/coordinator'" in str(lost.value)
    assert svc.state.jobs["j"].steps[1].state == "pending"
    holder["j"] = 9
    assert (await svc.commit("j", 1, 9))["latest"] == 1


async def test_a_dry_run_reports_what_gc_then_does() -> None:
    clock = Clock()
    svc = local_group(clock=clock).service
    for step in range(1, 7):
        await svc.begin("j", step, 1, {"world_size": 2}, _expected(2), lease_s=50)
        await svc.register("j", step, 1, [shard(0, step=step), shard(1, step=step)])
        if step != 5:
            await svc.commit("j", step, 1)
        clock.now += 20
    await svc.set_retention("j", {"keep_last": 2})
    assert await svc.pin("j", 2)
    clock.now += 20  # step 5 (begun at 1080, lease 50 s) is now past its lease
    plan = await svc.gc([], dry_run=True)
    assert svc.state.jobs["j"].steps[1].state == "committed"  # nothing changed
    done = await svc.gc([])
    assert plan.deleted == done.deleted == [("j", 1), ("j", 3)]
    assert plan.expired == done.expired == [("j", 5)]
    assert {g.uri for g in plan.deletable} == {g.uri for g in done.deletable}
    assert plan.deletable_total == done.deletable_total == 6
    # the replica's counts the node exports (accord_checkpoint_*_total): a dry run applies nothing
    stats = svc.state.stats
    assert (stats["commits"], stats["gc_runs"], stats["gc_deleted_steps"], stats["expired"]) == (
        5, 1, 2, 1)
    assert await svc.confirm_deleted([done.deletable[0].uri]) == 1
    assert stats["deletions_confirmed"] == 1


async def test_watchers_see_the_latest_pointer_move() -> None:
    group = local_group()
    svc = group.service
    seen: list[int | None] = []

    async def watch() -> None:
        async for latest, _ in group.watchers.watch("j", lambda: group.latest("j")):
            seen.append(latest)
            if latest == 2:
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0)
    for step in (1, 2):
        await svc.begin("j", step, 1, {"world_size": 1}, _expected(1))
        await svc.register("j", step, 1, [shard(0, step=step)])
        await svc.commit("j", step, 1)
        await asyncio.sleep(0)
    await asyncio.wait_for(task, 5)
    assert seen[0] is None and seen[-1] == 2
    await group.stop()
