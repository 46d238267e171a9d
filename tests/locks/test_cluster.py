"""Fenced locks on a real 3-node cluster: paused holders, killed nodes, leader changes.

One cluster (``accord serve`` subprocesses, 50 ms heartbeats, 500 ms elections) serves
every test of this module; each test leaves all three nodes running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from accord.client import AccordClient, FencedWriteRejected, LockError
from accord.client.errors import ClientError
from accord.locks import recipe
from accord.locks.errors import SessionExpired
from accord.proto import rpc_pb2
from tests.integration.cluster import ProcCluster, ProcNode
from tests.locks.checker import Write, check

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    c = ProcCluster(tmp_path_factory.mktemp("lockcluster"), 3)
    try:
        c.start_all()
        c.leader()
        yield c
    finally:
        for n in c.nodes:
            if n.paused and n.proc is not None and n.proc.poll() is None:
                os.kill(n.proc.pid, signal.SIGCONT)
            c.kill(n)


def endpoints(cluster: ProcCluster, first: ProcNode | None = None) -> list[str]:
    nodes = sorted(cluster.nodes, key=lambda n: n is not first)
    return [n.endpoint for n in nodes]


@pytest.fixture
async def client(cluster: ProcCluster) -> AsyncIterator[AccordClient]:
    async with AccordClient(endpoints(cluster), call_timeout_s=1.0, recheck_s=0.5) as c:
        yield c


class Holder:
    """A lock holder in its own process (tests/locks/holder.py), driven line by line."""

    def __init__(self, eps: list[str], name: str, ttl: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.locks.holder", ",".join(eps), name, str(ttl)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )

    async def read(self, timeout: float = 20.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        assert line, f"holder exited with {self.proc.poll()}"
        doc: dict[str, Any] = json.loads(line)
        return doc

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return await self.read()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@contextlib.contextmanager
def holder(eps: list[str], name: str, ttl: int) -> Iterator[Holder]:
    h = Holder(eps, name, ttl)
    try:
        yield h
    finally:
        h.end()


async def restart(cluster: ProcCluster, node: ProcNode) -> None:
    await asyncio.to_thread(cluster.start, node)
    await asyncio.to_thread(cluster.wait_serving, node)


async def test_paused_holder_past_its_ttl_has_its_guarded_write_refused(
    cluster: ProcCluster, client: AccordClient,
) -> None:
    with holder(endpoints(cluster), "fence/a", 2) as h:
        first = await h.read()
        assert first["event"] == "granted"
        os.kill(h.proc.pid, signal.SIGSTOP)
        try:
            lock = await asyncio.wait_for(client.lock("fence/a", ttl=2).acquire(), 20)
            assert lock.token > first["token"]
            await lock.guarded_put("fence/a-data", "second")
        finally:
            os.kill(h.proc.pid, signal.SIGCONT)
        answer = await h.ask("write fence/a-data first-resumed")
        assert answer["ok"] is False and answer["current"] == lock.token
        assert answer["lost"] is True  # the holder's own signal: its session ran out
        assert f"fencing token {first['token']} is stale" in answer["error"]
        assert (await client.get("fence/a-data")).value == b"second"  # type: ignore[union-attr]
        await lock.release()


async def test_holder_keeps_the_lock_when_its_node_is_killed(
    cluster: ProcCluster, client: AccordClient,
) -> None:
    victim = await asyncio.to_thread(cluster.leader)
    with holder(endpoints(cluster, first=victim), "fence/b", 5) as h:
        granted = await h.read()
        waiter = asyncio.create_task(client.lock("fence/b", ttl=5).acquire())
        await asyncio.to_thread(cluster.kill, victim)
        try:
            await asyncio.sleep(2.0)
            answer = await h.ask("write fence/b-data holder-after-kill")
            assert answer["ok"] is True and answer["lost"] is False
            assert not waiter.done()
            assert (await h.ask("release"))["ok"] is True
            lock = await asyncio.wait_for(waiter, 20)
            assert lock.token > granted["token"]
            await lock.release()
        finally:
            await restart(cluster, victim)


async def test_waiter_survives_three_leader_changes_in_a_row(
    cluster: ProcCluster, client: AccordClient,
) -> None:
    first = await client.lock("fence/c", ttl=5).acquire()
    waiter = asyncio.create_task(client.lock("fence/c", ttl=5).acquire())
    terms = []
    for _ in range(3):
        leader = await asyncio.to_thread(cluster.leader)
        terms.append((await asyncio.to_thread(cluster.status, leader)).header.raft_term)
        await asyncio.to_thread(cluster.kill, leader)
        rest = [n for n in cluster.nodes if n is not leader]
        await asyncio.to_thread(cluster.leader, rest)
        await restart(cluster, leader)
        assert not waiter.done()
    assert terms == sorted(set(terms))
    await first.guarded_put("fence/c-data", "first")
    await first.release()
    second = await asyncio.wait_for(waiter, 20)
    assert second.token > first.token
    await second.guarded_put("fence/c-data", "second")
    with pytest.raises(FencedWriteRejected):
        await first.guarded_put("fence/c-data", "first-again")
    await second.release()


async def test_lease_expiring_while_its_owner_waits(
    cluster: ProcCluster, client: AccordClient,
) -> None:
    holder_lock = await client.lock("fence/d", ttl=5).acquire()
    doomed = (await client.lease_grant(2)).id  # never renewed
    with pytest.raises(SessionExpired):
        await asyncio.wait_for(recipe.acquire(client.lock_store, "fence/d", doomed, recheck_s=0.5), 20)
    await holder_lock.release()
    assert await client.get_prefix("fence/d/") == []


async def _history(client: AccordClient, key: bytes) -> list[Write]:
    """Every committed version of ``key`` (never deleted), from the store's own history:
    walked back from the latest, each version's predecessor read at its mod_revision - 1.
    Revisions are points in one order, not a dense count (with several shards they are
    clock-sized), so the walk visits versions, not every revision number."""
    out: list[Write] = []
    resp = await client.range_raw(rpc_pb2.RangeRequest(key=key))
    while resp.kvs:
        kv = resp.kvs[0]
        out.append(Write(int(kv.mod_revision), int(kv.value.split(b":")[0]), bytes(kv.value)))
        if kv.mod_revision == kv.create_revision:
            break
        resp = await client.range_raw(rpc_pb2.RangeRequest(key=key, revision=kv.mod_revision - 1))
    out.reverse()
    return out


async def test_mutual_exclusion_under_leader_kills_and_pauses(cluster: ProcCluster) -> None:
    rng = random.Random(7)
    grants: list[tuple[int, int]] = []
    refused: list[bytes] = []
    stop = asyncio.Event()
    doing: dict[int, str] = {}
    """Worker -> what it is doing now (said when the workers overrun)."""

    async def worker(wid: int) -> None:
        # A call gives up after 5 s of failed attempts (not the default 30), so a worker
        # notices the stop within the bound below even while the cluster recovers.
        async with AccordClient(endpoints(cluster), call_timeout_s=1.0, recheck_s=0.5,
                                retry_budget_s=5.0) as c:
            seq = 0
            while not stop.is_set():
                doing[wid] = "acquiring"
                try:
                    lock = await asyncio.wait_for(c.lock("mx/lock", ttl=2).acquire(), 15)
                except (TimeoutError, LockError, ClientError):
                    continue
                doing[wid] = f"holding token {lock.token}"
                assert lock.holding is not None
                grants.append((lock.token, lock.holding.grant_revision))
                pause = rng.random() < 0.25
                if pause and lock.session is not None:
                    # a "GC pause": the holder stops renewing and stalls past its TTL
                    await lock.session.stop_keepalive()
                    await asyncio.sleep(3.0)
                for _ in range(3):
                    seq += 1
                    value = f"{lock.token}:{wid}:{seq}".encode()
                    try:
                        await lock.guarded_txn([rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(
                            key=b"mx/log", value=value))])
                    except FencedWriteRejected:
                        refused.append(value)
                    except ClientError:
                        pass  # unknown outcome: the store's history decides
                doing[wid] = f"releasing token {lock.token}"
                with contextlib.suppress(LockError, ClientError):
                    await lock.release()
            doing[wid] = "closing its client"
        doing[wid] = "done"

    async def nemesis() -> None:
        for i in range(4):
            await asyncio.sleep(2.0)
            leader = await asyncio.to_thread(cluster.leader)
            if i % 2 == 0:
                await asyncio.to_thread(cluster.kill, leader)
                await asyncio.sleep(1.0)
                await restart(cluster, leader)
            else:
                await asyncio.to_thread(cluster.signal, leader, signal.SIGSTOP)
                await asyncio.sleep(1.5)
                await asyncio.to_thread(cluster.signal, leader, signal.SIGCONT)
        await asyncio.sleep(1.0)
        stop.set()

    workers = [asyncio.create_task(worker(i)) for i in range(4)]
    try:
        await asyncio.wait_for(nemesis(), 60)
        try:
            await asyncio.wait_for(asyncio.gather(*workers), 40)
        except TimeoutError:
            tails = {n.name: cluster.log(n)[-1500:] for n in cluster.nodes}
            raise AssertionError(f"workers still busy 40 s after the stop: {doing}; "
                                 f"logs: {tails}") from None
    finally:
        for w in workers:
            w.cancel()
    async with AccordClient(endpoints(cluster), call_timeout_s=2.0) as c:
        committed = await _history(c, b"mx/log")
    print(f"grants={len(grants)} committed={len(committed)} refused={len(refused)}")
    assert len(grants) >= 3 and len(committed) >= 3
    assert check(grants, committed, refused) == []
