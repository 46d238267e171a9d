"""`etcdctl lock` / `etcdctl elect` (etcd's client-side recipe) share queues with accord clients."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import AsyncIterator

import pytest

from accord.client import AccordClient
from accord.services.kv.local import LocalBackend
from tests.locks.inproc import serve_local

ETCDCTL = shutil.which("etcdctl")
"""The real etcdctl; scripts/test installs it, and its absence fails the tests that need it."""


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, LocalBackend]]:
    async with serve_local() as served:
        yield served


async def _etcdctl(endpoint: str, *args: str) -> asyncio.subprocess.Process:
    assert ETCDCTL is not None, (
        "etcdctl is not installed: install Debian's etcd-client (scripts/test does it as root)"
    )
    return await asyncio.create_subprocess_exec(
        ETCDCTL, f"--endpoints={endpoint}", "--dial-timeout=3s", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ETCDCTL_API": "3"},
    )


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_etcdctl_lock_waits_for_an_accord_holder(server: tuple[str, LocalBackend]) -> None:
    endpoint, _ = server
    async with AccordClient([endpoint]) as c:
        lock = await c.lock("shared", ttl=5).acquire()
        proc = await _etcdctl(endpoint, "lock", "shared", "echo", "got-it")
        try:
            await asyncio.sleep(1.0)
            assert proc.returncode is None  # queued behind the accord holder
            await lock.release()
            out, err = await asyncio.wait_for(proc.communicate(), 10)
            assert proc.returncode == 0, err
            assert out.decode().split()[-1] == "got-it"
        finally:
            await _end(proc)


async def test_accord_waits_for_an_etcdctl_holder(server: tuple[str, LocalBackend]) -> None:
    endpoint, _ = server
    async with AccordClient([endpoint], recheck_s=0.5) as c:
        proc = await _etcdctl(endpoint, "lock", "shared")
        try:
            assert proc.stdout is not None
            key = (await asyncio.wait_for(proc.stdout.readline(), 10)).strip()
            assert key.startswith(b"shared/")
            holder = await c.get(key)
            assert holder is not None
            waiter = asyncio.create_task(c.lock("shared", ttl=5).acquire())
            await asyncio.sleep(0.5)
            assert not waiter.done()
            proc.send_signal(signal.SIGINT)  # etcdctl releases on interrupt
            lock = await asyncio.wait_for(waiter, 10)
            assert lock.token > holder.create_revision
            await lock.release()
        finally:
            await _end(proc)


async def test_etcdctl_elect_and_accord_elections_agree(server: tuple[str, LocalBackend]) -> None:
    endpoint, _ = server
    async with AccordClient([endpoint], recheck_s=0.5) as c:
        proc = await _etcdctl(endpoint, "elect", "svc", "from-etcdctl")
        observer = await _etcdctl(endpoint, "elect", "-l", "svc")
        try:
            assert proc.stdout is not None and observer.stdout is not None
            await asyncio.wait_for(proc.stdout.readline(), 10)  # the leader key: elected
            mine = c.election("svc", ttl=5)
            leader = await mine.leader()
            assert leader is not None and leader.value == b"from-etcdctl"
            campaign = asyncio.create_task(mine.campaign("from-accord"))
            await asyncio.sleep(0.5)
            assert not campaign.done()
            proc.send_signal(signal.SIGINT)
            await asyncio.wait_for(campaign, 10)
            lines: list[bytes] = []
            while b"from-accord" not in lines:
                lines.append((await asyncio.wait_for(observer.stdout.readline(), 10)).strip())
            assert b"from-etcdctl" in lines
            await mine.resign()
        finally:
            await _end(proc)
            await _end(observer)
