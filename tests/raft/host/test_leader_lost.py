"""A dead peer's closed links: the transport reports them, the host fails over early.

Transport: a link that closes and cannot be redialed is reported once to the
peer-lost listeners; a link that closes but redials at once (a blip) is not.
Host: when a node's transport stops (its links close, as when its process is
killed), the other nodes' groups it led, quiesced ones included, are told and
elect new leaders, and writes go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from accord.raft.core.types import Role
from accord.raft.host.multiraft import HostConfig
from accord.raft.transport import codec
from accord.raft.transport.codec import Hello
from accord.raft.transport.framing import close_writer
from accord.raft.transport.links import PeerTransport
from tests.raft.host.test_host import GROUPS, Cluster
from tests.raft.transport.test_transport import CLUSTER, Inbox, make, until


async def _blinking_peer(node_id: int) -> tuple[asyncio.Server, list[int]]:
    """A fake peer that completes each handshake, then hangs up at once (a blip)."""
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = int.from_bytes(await reader.readexactly(4), "big")
        hello = codec.decode_hello(await reader.readexactly(n))
        reply = codec.encode_hello(Hello(codec.PROTOCOL_VERSION, node_id, CLUSTER, "raft",
                                         hello.node_id))
        writer.write(len(reply).to_bytes(4, "big") + reply)
        await writer.drain()
        accepted.append(hello.node_id)
        await asyncio.sleep(0.05)
        close_writer(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, accepted


async def test_a_closed_link_that_cannot_be_redialed_is_reported_once() -> None:
    lost: list[int] = []
    a, b = make(1, Inbox()), make(2, Inbox())
    a.add_peer_lost_listener(lost.append)
    await a.start()
    await b.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.connected(2), "link up")
        assert lost == [] and a.stats.peers_lost == 0
        await b.stop()  # its process "dies": links close, the port refuses connections
        await until(lambda: lost == [2], "peer reported lost")
        await asyncio.sleep(0.3)  # further failed redials are not new losses
        assert lost == [2] and a.stats.peers_lost == 1
    finally:
        await a.stop()
        await b.stop()


async def test_a_link_that_redials_at_once_is_not_reported() -> None:
    lost: list[int] = []
    a = make(1, Inbox())
    a.add_peer_lost_listener(lost.append)
    server, accepted = await _blinking_peer(2)
    await a.start()
    try:
        a.set_peer(2, "127.0.0.1", server.sockets[0].getsockname()[1])
        await until(lambda: len(accepted) >= 3, "several blips, each redialed")
        assert lost == [] and a.stats.peers_lost == 0
    finally:
        await a.stop()
        server.close()
        await server.wait_closed()


async def test_the_peers_own_link_closing_triggers_a_redial_and_a_report() -> None:
    # Node 1's link to node 2 is down and in a long backoff (nothing listens there);
    # node 2's link to node 1 is up. When it closes, node 1 redials at once, fails,
    # and reports node 2 lost without waiting out its backoff.
    lost: list[int] = []
    a = make(1, Inbox(), backoff_min=10.0, backoff_max=20.0)
    a.add_peer_lost_listener(lost.append)
    await a.start()
    nothing = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = nothing.sockets[0].getsockname()[1]
    nothing.close()
    await nothing.wait_closed()
    writer: asyncio.StreamWriter | None = None
    try:
        a.set_peer(2, "127.0.0.1", port)
        reader, writer = await asyncio.open_connection("127.0.0.1", a.listen_port)
        hello = codec.encode_hello(Hello(codec.PROTOCOL_VERSION, 2, CLUSTER, "raft", 1))
        writer.write(len(hello).to_bytes(4, "big") + hello)
        n = int.from_bytes(await reader.readexactly(4), "big")
        assert codec.decode_hello(await reader.readexactly(n)).node_id == 1
        await until(lambda: a.stats.accepts == 1, "inbound link accepted")
        assert not a.connected(2) and lost == []
        close_writer(writer)
        await until(lambda: lost == [2], "peer reported lost", limit=3.0)
    finally:
        close_writer(writer)
        await a.stop()


async def test_a_failing_listener_does_not_break_the_link_task() -> None:
    lost: list[int] = []

    def broken(node: int) -> None:
        raise RuntimeError("listener bug")

    a, b = make(1, Inbox()), make(2, Inbox())
    a.add_peer_lost_listener(broken)
    a.add_peer_lost_listener(lost.append)
    await a.start()
    await b.start()
    port = b.listen_port
    b2: PeerTransport | None = None
    try:
        a.set_peer(2, "127.0.0.1", port)
        await until(lambda: a.connected(2), "link up")
        await b.stop()
        await until(lambda: lost == [2], "the second listener still hears of it")
        b2 = make(2, Inbox(), port=port)
        await b2.start()
        await until(lambda: a.connected(2), "link back", limit=8.0)
    finally:
        await a.stop()
        if b2 is not None:
            await b2.stop()


async def _wait(pred: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while not pred():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_host_fails_over_groups_of_a_dead_node_quiesced_or_not(tmp_path: Path) -> None:
    # A long election timeout (2 s) with fast ticks: the groups quiesce quickly, and
    # the new leaders are elected through the transport's report, not a timeout.
    config = HostConfig(tick_interval=0.02, election_ticks=100, request_timeout=5.0,
                        quiesce_after_ticks=2)
    c = Cluster(tmp_path, config)
    try:
        for nid in (1, 2, 3):
            await c.start_node(nid)
        await c.connect_and_run()
        await _wait(lambda: all(n.transport.connected(m) for n in c.nodes.values()
                                for m in (1, 2, 3) if m != n.id), "links up")
        for gid in GROUPS:
            c.nodes[1].host.campaign(gid)  # node 1 should lead every group
        for gid in GROUPS:
            lead = await c.leader(gid)
            if lead != 1:
                c.nodes[lead].host.transfer_leader(gid, 1)
        await _wait(lambda: all(c.nodes[1].host.group(g).core.role == Role.LEADER
                                for g in GROUPS), "node 1 leads every group")
        for gid in GROUPS:
            await c.put(1, gid, "before", "1")
        await _wait(lambda: all(c.nodes[n].host.active_groups == 0 for n in (1, 2, 3)),
                    "every group quiesced")
        await c.stop_node(1)  # transport stopped: every link of node 1 closes
        survivors = [c.nodes[2].host, c.nodes[3].host]
        await _wait(lambda: sum(h.fast_elections for h in survivors) >= len(GROUPS),
                    "the survivors told of the dead leader")
        for gid in GROUPS:
            lead = await c.leader(gid)
            assert lead in (2, 3)
            await c.put(lead, gid, "after", "2")
        for h in survivors:
            for gid in GROUPS:
                assert h.group(gid).core.term >= 2
    finally:
        await c.stop()
