"""The asyncio driver over real UDP/TCP on 127.0.0.1: join, events, metadata, leave, keys."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from accord.membership.config import SwimConfig
from accord.membership.node import Membership
from accord.membership.state import EventKind, MemberEvent


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


async def start_group(count: int, config: SwimConfig) -> list[Membership]:
    first = Membership(config, bind=("127.0.0.1", 0), name="m0")
    await first.start()
    group = [first]
    for i in range(1, count):
        m = Membership(config, bind=("127.0.0.1", 0), name=f"m{i}", seeds=[first.address])
        await m.start()
        group.append(m)
    return group


async def test_group_joins_shares_metadata_and_sees_a_leave() -> None:
    group = await start_group(3, SwimConfig.local())
    try:
        await wait_for(lambda: all(len(m.members()) == 3 for m in group))
        sub = group[0].subscribe()
        group[2].update_metadata(role="gpu-agent", gpus="sha256:0f00")
        await wait_for(lambda: group[0]._require().member("m2").meta.get("role") == "gpu-agent")  # type: ignore[union-attr]
        await wait_for(lambda: group[1]._require().member("m2").meta.get("gpus") == "sha256:0f00")  # type: ignore[union-attr]
        await group[1].leave(timeout=0.5)
        await group[1].stop()
        seen: list[MemberEvent] = []
        async with asyncio.timeout(10.0):
            async for event in sub:
                seen.append(event)
                if event.kind is EventKind.LEFT and event.member.name == "m1":
                    break
        assert any(e.kind is EventKind.UPDATED and e.member.name == "m2" for e in seen)
        assert [m.name for m in group[0].members()] == ["m0", "m2"]
        assert group[0].stats.packets_received > 0
    finally:
        for m in group:
            await m.stop()


async def test_member_with_a_wrong_key_is_kept_out_and_counted() -> None:
    good = replace(SwimConfig.local(), secret_keys=(b"a" * 16,))
    group = await start_group(2, good)
    bad_cfg = replace(SwimConfig.local(), secret_keys=(b"b" * 16,))
    intruder = Membership(bad_cfg, bind=("127.0.0.1", 0), name="intruder", seeds=[group[0].address])
    await intruder.start()
    try:
        await wait_for(lambda: all(len(m.members()) == 2 for m in group))
        await wait_for(lambda: group[0].stats.auth_failures > 0)
        await asyncio.sleep(0.5)
        assert all(m._require().member("intruder") is None for m in group)
        assert [m.name for m in intruder.members()] == ["intruder"]
    finally:
        for m in [*group, intruder]:
            await m.stop()


async def test_bad_use_is_refused_clearly() -> None:
    m = Membership(SwimConfig.local(), bind=("127.0.0.1", 0))
    with pytest.raises(RuntimeError, match="not started"):
        m.members()
    await m.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            await m.start()
        with pytest.raises(ValueError, match="limit"):
            m.update_metadata(blob="x" * 1000)
        assert m.local_member.meta == {}
    finally:
        await m.stop()


async def test_a_leave_waits_for_gossip_only_when_someone_is_there_to_hear_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The last member (or one whose peers are all gone) has nobody to tell: its leave
    does not wait for gossip rounds, so a cluster's last daemon stops at once. With a
    peer alive, the leave waits until gossip has given the leave all its
    retransmissions (memberlist's rule), not for its whole timeout, and the peer sees
    LEFT."""
    import accord.membership.node as node_module

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, *args: object) -> None:
        waits.append(delay)
        await real_sleep(0)

    alone = Membership(SwimConfig.local(), bind=("127.0.0.1", 0), name="solo")
    await alone.start()
    try:
        monkeypatch.setattr(node_module.asyncio, "sleep", recording_sleep)
        await alone.leave(timeout=5.0)
        assert 5.0 not in waits
    finally:
        monkeypatch.undo()
        await alone.stop()
    group = await start_group(2, SwimConfig.local())
    try:
        await wait_for(lambda: all(len(m.members()) == 2 for m in group))
        sub = group[0].subscribe()
        proto = group[1]._require()
        assert not proto.leave_gossiped
        async with asyncio.timeout(30):  # far below the timeout given: gossip's rounds only
            await group[1].leave(timeout=600.0)
        assert proto.leave_gossiped
        async with asyncio.timeout(10.0):
            async for event in sub:
                if event.kind is EventKind.LEFT and event.member.name == "m1":
                    break
    finally:
        for m in group:
            await m.stop()
