"""``NodeMembership`` (the daemon's SWIM member) and its gRPC service, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import grpc
import pytest

from accord.membership.background import BackgroundMembership
from accord.membership.config import SwimConfig
from accord.membership.service import (
    ROLE_ACCORD,
    MembershipDisabled,
    NodeMembership,
    daemon_meta,
)
from accord.membership.servicer import add_membership_service
from accord.membership.state import MemberState
from accord.node.config import Config, ConfigError, load_config
from accord.node.gossip import node_membership
from accord.proto import membership_pb2 as pb
from accord.proto import membership_pb2_grpc

_grpc: Any = membership_pb2_grpc  # the generated stubs carry no annotations

# Short dead-member memory in SWIM, so a test can see the view outlive SWIM's reaping.
FAST = replace(SwimConfig.local(), gossip_to_dead_time=1.0)


async def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


def daemon(name: str, seeds: list[tuple[str, int]] | None = None,
           config: SwimConfig = FAST) -> NodeMembership:
    return NodeMembership(config, name=name, bind=("127.0.0.1", 0), seeds=seeds or [],
                          meta=daemon_meta(name, 0xAB, [f"http://127.0.0.1:{2379 + len(name)}"]))


def state_of(nm: NodeMembership, name: str) -> MemberState | None:
    m = nm.view.get(name)
    return m.state if m is not None else None


async def test_daemons_see_each_other_and_keep_the_dead_after_swim_reaps_them() -> None:
    a = daemon("a")
    await a.start()
    b = daemon("b", [a.address])
    await b.start()
    try:
        await wait_for(lambda: state_of(a, "b") == state_of(b, "a") == MemberState.ALIVE)
        (rec,) = a.members(role=ROLE_ACCORD)[1:]
        assert rec.name == "b" and rec.meta["role"] == "accord" and rec.meta["id"] == "ab"
        assert rec.meta["client"].startswith("http://127.0.0.1:")
        assert [m.name for m in a.members()] == ["a", "b"]
        await b.stop(leave=False)  # a crash: no goodbye
        await wait_for(lambda: state_of(a, "b") == MemberState.DEAD)
        assert a.event_counts["dead"] >= 1
        # SWIM forgets b after gossip_to_dead_time; the view still shows it dead.
        await wait_for(lambda: "b" not in {m.name for m in a.swim_members()})
        assert state_of(a, "b") == MemberState.DEAD
        assert a.state_age(a.view["b"]) > 0
    finally:
        await b.stop()
        await a.stop()


async def test_graceful_stop_is_seen_as_left() -> None:
    a = daemon("a")
    await a.start()
    b = daemon("b", [a.address])
    await b.start()
    try:
        await wait_for(lambda: state_of(a, "b") == MemberState.ALIVE)
        await b.stop()
        assert not b.running
        await wait_for(lambda: state_of(a, "b") == MemberState.LEFT)
    finally:
        await b.stop()
        await a.stop()


async def test_disabled_membership_answers_with_a_clear_error() -> None:
    cfg = load_config(["--name", "n1", "--gossip-listen", "off"], {})
    nm = node_membership(cfg, cfg.member_id)
    assert not nm.enabled
    await nm.start()  # starts nothing
    assert not nm.running
    with pytest.raises(MembershipDisabled, match="--gossip-listen off"):
        nm.members()
    await nm.stop()


def test_from_config_derives_addresses_seeds_and_metadata() -> None:
    cfg = load_config(["--name", "n2", "--listen-peer-urls", "http://127.0.0.1:2382",
                       "--listen-client-urls", "http://127.0.0.1:2381",
                       "--initial-cluster",
                       "n1=http://127.0.0.1:2380,n2=http://127.0.0.1:2382,n3=http://127.0.0.1:2384",
                       "--gossip-profile", "local", "--gossip-key", "00" * 16], {})
    nm = node_membership(cfg, cfg.member_id)
    assert nm.bind == ("127.0.0.1", 3382) and nm.advertise == ("127.0.0.1", 3382)
    assert nm.seeds == [("127.0.0.1", 3380), ("127.0.0.1", 3384)]
    assert nm.config is not None and nm.config.probe_interval == SwimConfig.local().probe_interval
    assert nm.config.secret_keys == (bytes(16),)
    assert nm.meta == {"role": "accord", "name": "n2", "id": f"{cfg.member_id:x}",
                       "client": "http://127.0.0.1:2381", "version": nm.meta["version"]}


def test_explicit_gossip_settings_and_wildcard_advertise() -> None:
    cfg = load_config(["--name", "n1", "--listen-peer-urls", "http://0.0.0.0:2380",
                       "--initial-advertise-peer-urls", "http://10.0.0.5:2380",
                       "--gossip-listen", "0.0.0.0:7946", "--gossip-seeds", "10.0.0.6:7946"], {})
    assert cfg.gossip_listen_address() == ("0.0.0.0", 7946)
    assert cfg.gossip_advertise_address() == ("10.0.0.5", 7946)
    assert cfg.gossip_seed_addresses() == [("10.0.0.6", 7946)]


@pytest.mark.parametrize("argv, message", [
    (["--gossip-listen", "nowhere"], "gossip-listen: 'nowhere' is not host:port"),
    (["--gossip-listen", "h:99999"], "out of range"),
    (["--gossip-seeds", "h:x"], "gossip-seeds: the port of 'h:x' is not a number"),
    (["--gossip-profile", "moon"], "gossip-profile 'moon'"),
    (["--gossip-key", "zz"], "gossip-key: keys must be hex"),
    (["--gossip-key", "00" * 10], "a key of 10 bytes"),
    (["--listen-peer-urls", "http://127.0.0.1:65000"], "beyond 65535"),
])
def test_bad_gossip_settings_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(["--name", "n1", *argv], {})


def test_metadata_fits_by_dropping_extra_client_urls() -> None:
    urls = [f"http://very-long-host-name-number-{i}.example.internal:2379" for i in range(20)]
    meta = daemon_meta("n1", 1, urls)
    assert meta["client"] == ",".join(urls[: meta["client"].count(",") + 1])
    assert 1 <= meta["client"].count(",") + 1 < 20
    assert Config().gossip_enabled


@pytest.fixture
async def served() -> AsyncIterator[tuple[NodeMembership, Any]]:
    a = daemon("a")
    await a.start()
    server = grpc.aio.server()
    add_membership_service(server, a)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield a, _grpc.MembershipStub(channel)
    finally:
        await channel.close()
        await server.stop(0)
        await a.stop()


async def test_members_and_watch_over_grpc(
        served: tuple[NodeMembership, Any]) -> None:
    a, stub = served
    watch = stub.Watch(pb.WatchRequest())
    first = await watch.read()
    assert first.kind == "snapshot" and [m.name for m in first.snapshot] == ["a"]
    b = NodeMembership(FAST, name="gpu-1", bind=("127.0.0.1", 0), seeds=[a.address],
                       meta={"role": "gpu-agent", "node": "gpu-1"})
    await b.start()
    try:
        async with asyncio.timeout(15):
            event = await watch.read()
        assert event.kind == "joined" and event.member.name == "gpu-1"
        assert event.member.metadata["role"] == "gpu-agent" and event.member.state == "alive"
        resp = await stub.Members(pb.MembersRequest())
        assert resp.self == "a" and [m.name for m in resp.members] == ["a", "gpu-1"]
        only = await stub.Members(pb.MembersRequest(role="gpu-agent"))
        assert [m.name for m in only.members] == ["gpu-1"]
        assert only.members[0].address == f"{b.address[0]}:{b.address[1]}"
    finally:
        watch.cancel()
        await b.stop()


async def test_service_on_a_node_without_membership_fails_clearly() -> None:
    cfg = load_config(["--name", "n1", "--gossip-listen", "off"], {})
    server = grpc.aio.server()
    add_membership_service(server, node_membership(cfg, cfg.member_id))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = _grpc.MembershipStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Members(pb.MembersRequest())
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "off" in (err.value.details() or "")
    finally:
        await server.stop(0)


async def test_background_membership_joins_from_a_thread() -> None:
    a = daemon("a")
    await a.start()
    bg = BackgroundMembership(FAST, bind=("127.0.0.1", 0), name="agent", seeds=[a.address],
                              meta={"role": "gpu-agent"})
    try:
        addr = await asyncio.to_thread(bg.start)
        assert addr[0] == "127.0.0.1" and addr[1] > 0
        await wait_for(lambda: state_of(a, "agent") == MemberState.ALIVE)
        # The agent's own view fills in as the join's state exchange lands.
        names: set[str] = set()
        async with asyncio.timeout(15):
            while names != {"a", "agent"}:
                names = {m.name for m in await asyncio.to_thread(bg.members)}
                await asyncio.sleep(0.05)
        await asyncio.to_thread(bg.stop)
        await wait_for(lambda: state_of(a, "agent") == MemberState.LEFT)
    finally:
        await asyncio.to_thread(bg.stop)
        await a.stop()


async def test_bind_failure_names_the_gossip_address() -> None:
    a = daemon("a")
    await a.start()
    try:
        clash = NodeMembership(FAST, name="b", bind=a.address)
        with pytest.raises(OSError, match=f"gossip-listen 127.0.0.1:{a.address[1]}"):
            await clash.start()
        assert not clash.running
    finally:
        await a.stop()


async def test_nodes_command_lists_and_watches_members(capsys: pytest.CaptureFixture[str]) -> None:
    from accord import cli

    a = daemon("a")
    await a.start()
    server = grpc.aio.server()
    add_membership_service(server, a)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ep = f"127.0.0.1:{port}"
    agent = NodeMembership(FAST, name="gpu-1", bind=("127.0.0.1", 0), seeds=[a.address],
                           meta={"role": "gpu-agent", "node": "gpu-1", "gpus": "8",
                                 "models": "nvidia/H100", "inventory": "0123456789abcdef"})
    try:
        watch = asyncio.create_task(asyncio.to_thread(
            cli.main, ["nodes", "watch", "--count", "1", "--endpoints", ep]))
        # The agent joins only once the watch is subscribed (the view's follower is the first).
        await wait_for(lambda: len(a._require()._subscribers) == 2)
        await agent.start()
        assert await watch == 0
        out = capsys.readouterr().out
        assert out.splitlines()[1].split()[:3] == ["a", "accord", "alive"]
        assert "-- events --" in out and "joined   gpu-1" in out
        code = await asyncio.to_thread(cli.main, ["nodes", "--json", "--role", "gpu-agent",
                                                  "--endpoints", ep])
        rows = json.loads(capsys.readouterr().out)
        assert code == 0 and [(r["name"], r["state"]) for r in rows] == [("gpu-1", "alive")]
        assert rows[0]["metadata"]["inventory"] == "0123456789abcdef"
        code = await asyncio.to_thread(cli.main, ["nodes", "--endpoints", ep])
        out = capsys.readouterr().out
        assert code == 0 and "node gpu-1: 8 GPU(s) nvidia/H100 inventory 0123456789abcdef" in out
        assert "(2 member(s), 2 live, as seen by a)" in out
    finally:
        await agent.stop()
        await server.stop(0)
        await a.stop()
