"""Real accord clusters for your own tests: ``accord.testing.cluster`` and a pytest fixture.

::

    import accord.testing

    async def test_my_service() -> None:
        async with accord.testing.cluster(nodes=3) as c:
            client = c.client()
            await client.put("/cfg/x", "1")
            await c.kill(1)          # node 1 crashes (no leadership handover)
            await client.put("/cfg/x", "2")
            await c.restart(1)       # back on its data directory; it catches up

The pytest plugin (:mod:`accord.testing.pytest_plugin`, registered as a ``pytest11``
entry point) gives tests an ``accord_cluster`` fixture.

``cluster(nodes=3)`` starts ``nodes`` :class:`~accord.node.server.Node` objects (the same
class ``accord serve`` runs: WAL, Raft groups, gRPC server) in the running event loop,
each with its own data directory and free 127.0.0.1 ports, waits until the KV group has
a leader, and yields a :class:`TestCluster`. On exit every client it handed out is
closed, every node stopped and the temporary data directories deleted.

In-process rather than subprocesses: a node starts in well under a second with no
interpreter to boot, and a test needs no ``accord`` on ``PATH``. What a test gives up is
process isolation: ``kill`` stops a node abruptly (no leadership handover, no graceful
SWIM leave, its gRPC server gone at once, its WAL closed as a crash leaves it: whatever
was fsynced), but the process lives on. For tests that must SIGKILL or SIGSTOP a real
process, accord's own suite uses subprocess daemons (``tests/integration/cluster.py``).

Timing defaults are test-friendly: 50 ms heartbeats and a 500 ms election timeout, so a
killed leader is replaced within about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accord.client import AccordClient
from accord.node.backend import KV_GROUP
from accord.node.config import Config, load_config
from accord.node.server import Node

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FALLBACK_RANGE = (20000, 32768)


def _listen_range() -> tuple[int, int]:
    """Ports ``[lo, hi)`` to listen on that no outgoing connection is given as its own
    port: below the kernel's ephemeral range. A port chosen there stays free until the
    daemon binds it, where one bound at 0 and closed (an ephemeral port) may meanwhile
    become the local port of some connection (a node dialing its peers) and the daemon
    then fails with "address already in use". Under pytest-xdist each worker process
    takes its own slice of the range: two workers starting daemons at once never pick
    the same port between choosing it and the daemon binding it."""
    try:
        lo = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo, hi = _FALLBACK_RANGE
    else:
        lo, hi = (10000, lo) if lo > 12000 else _FALLBACK_RANGE
    return _slice_for_this_worker(lo, hi)


def _slice_for_this_worker(lo: int, hi: int) -> tuple[int, int]:
    """``[lo, hi)``, or this pytest-xdist worker's share of it (``gwK`` of ``N``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker.removeprefix("gw"))
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    except ValueError:
        return lo, hi
    if not worker.startswith("gw") or not 0 <= index < count:
        return lo, hi
    step = (hi - lo) // count
    return lo + index * step, lo + (index + 1) * step


def _bind_free(taken: set[int], size: int = 1) -> tuple[int, list[socket.socket]]:
    """A base port ``b`` with ``b .. b + size - 1`` bindable now and not in ``taken``,
    below the ephemeral range; the sockets holding them (the caller closes them)."""
    lo, hi = _listen_range()
    rng = random.Random()
    for _ in range(1000):
        base = rng.randrange(lo, hi - size)
        block = range(base, base + size)
        if taken.intersection(block):
            continue
        held: list[socket.socket] = []
        try:
            for p in block:
                t = socket.socket()
                held.append(t)
                t.bind((HOST, p))
        except OSError:
            for t in held:
                t.close()
            continue
        return base, held
    raise OSError(f"no free block of {size} ports in {lo}..{hi - 1}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct 127.0.0.1 ports that were free a moment ago (below the ephemeral
    range: :func:`_listen_range`)."""
    return free_port_blocks(n, 1)


def free_port_blocks(count: int, size: int, avoid: Sequence[int] = ()) -> list[int]:
    """``count`` base ports ``b``, each with ``b .. b + size - 1`` free a moment ago, the
    blocks apart from each other and from ``avoid`` (the peer ports of nodes of ``size``
    workers: worker ``k`` listens on ``b + k``), below the ephemeral range."""
    taken = set(avoid)
    held: list[socket.socket] = []
    bases: list[int] = []
    try:
        while len(bases) < count:
            base, socks = _bind_free(taken, size)
            held.extend(socks)
            taken.update(range(base, base + size))
            bases.append(base)
        return bases
    finally:
        for s in held:
            s.close()


@dataclass
class TestNode:
    """One member: its name, where clients reach it, and the running node (None: down)."""

    __test__ = False  # not a pytest test class

    name: str
    config: Config
    node: Node | None = None

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.config.listen_client_urls[0].rsplit(':', 1)[1]}"

    @property
    def running(self) -> bool:
        return self.node is not None


@dataclass
class TestCluster:
    """A running cluster (see the module docstring); nodes are indexed from 0."""

    __test__ = False

    nodes: list[TestNode]
    _clients: list[AccordClient] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint (``host:port``), running or not."""
        return [n.endpoint for n in self.nodes]

    def client(self, *, call_timeout_s: float = 5.0, retry_budget_s: float = 30.0) -> AccordClient:
        """A client of every endpoint (it fails over as members go down); closed with
        the cluster."""
        c = AccordClient(self.endpoints, call_timeout_s=call_timeout_s,
                         retry_budget_s=retry_budget_s)
        self._clients.append(c)
        return c

    async def kill(self, i: int) -> None:
        """Stop node ``i`` as a crash would (no leadership handover)."""
        tn = self.nodes[i]
        if tn.node is None:
            raise ValueError(f"node {i} ({tn.name}) is not running")
        node, tn.node = tn.node, None
        await node.stop(graceful=False)

    async def stop(self, i: int) -> None:
        """Stop node ``i`` gracefully (leaderships handed over first)."""
        tn = self.nodes[i]
        if tn.node is None:
            raise ValueError(f"node {i} ({tn.name}) is not running")
        node, tn.node = tn.node, None
        await node.stop()

    async def restart(self, i: int) -> None:
        """Start node ``i`` again on its data directory (it catches up from its peers)."""
        tn = self.nodes[i]
        if tn.node is not None:
            raise ValueError(f"node {i} ({tn.name}) is running; kill or stop it first")
        node = Node(tn.config)
        await node.start()
        tn.node = node

    def leader(self) -> int | None:
        """Index of the node the running members agree leads the KV group, or None."""
        seen = {tn.node.host.group(KV_GROUP).core.leader_id
                for tn in self.nodes if tn.node is not None}
        if len(seen) != 1 or 0 in seen:
            return None
        (lid,) = seen
        for i, tn in enumerate(self.nodes):
            if tn.node is not None and tn.node.member_id == lid:
                return i
        return None

    async def wait_leader(self, timeout: float = START_TIMEOUT_S) -> int:
        """Wait until the running members agree on a leader; its index."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            i = self.leader()
            if i is not None:
                return i
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no agreed leader among the running nodes within {timeout}s")

    async def close(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                await c.close()
        self._clients.clear()
        for tn in self.nodes:
            if tn.node is not None:
                node, tn.node = tn.node, None
                await node.stop(graceful=False)


def _configs(n: int, root: Path, shards: int, heartbeat_ms: int, election_ms: int,
             extra: Sequence[str]) -> list[Config]:
    ports = free_ports(3 * n)  # client, peer, then the metrics listeners (not client + 1000:
    # a port picked at random plus 1000 may belong to anyone)
    names = [f"n{i + 1}" for i in range(n)]
    initial = ",".join(f"{name}=http://{HOST}:{ports[2 * i + 1]}" for i, name in enumerate(names))
    return [load_config([
        "--name", name, "--data-dir", str(root / name),
        "--listen-client-urls", f"http://{HOST}:{ports[2 * i]}",
        "--listen-peer-urls", f"http://{HOST}:{ports[2 * i + 1]}",
        "--initial-cluster", initial,
        "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms),
        "--shards", str(shards), "--gossip-listen", "off",
        "--listen-metrics-urls", f"http://{HOST}:{ports[2 * n + i]}", *extra,
    ], environ={}) for i, name in enumerate(names)]


@contextlib.asynccontextmanager
async def cluster(nodes: int = 3, *, data_dir: str | Path | None = None, shards: int = 1,
                  heartbeat_ms: int = 50, election_ms: int = 500,
                  extra: Sequence[str] = ()) -> AsyncIterator[TestCluster]:
    """Start a cluster of ``nodes`` in this event loop; stopped (and, without
    ``data_dir``, its data deleted) on exit. ``extra``: more ``accord serve`` flags."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    root = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="accord-test-"))
    c = TestCluster([TestNode(cfg.name, cfg) for cfg in
                     _configs(nodes, root, shards, heartbeat_ms, election_ms, extra)])
    try:
        for i in range(nodes):
            await c.restart(i)
        await c.wait_leader()
        yield c
    finally:
        await c.close()
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
