"""Network partitions between real daemons, through a proxy on every peer link."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tests.integration.cluster import HOST, ProcCluster
from tests.integration.proxy import LinkProxies


@contextlib.contextmanager
def proxied_cluster(tmp_path: Path, extra: tuple[str, ...] = ()) -> Iterator[
        tuple[ProcCluster, LinkProxies]]:
    """Three daemons whose every peer link goes through a proxy that can cut it."""
    # One process per node: the proxies stand for each member's one peer port (a node
    # of several workers listens on a port per worker, which these proxies do not carry).
    c = ProcCluster(tmp_path, 3, extra=extra, workers=1)
    proxies = LinkProxies()
    try:
        for a in c.nodes:
            parts = []
            for b in c.nodes:
                port = a.peer_port if b is a else proxies.add(a.name, b.name, b.peer_port)
                parts.append(f"{b.name}=http://{HOST}:{port}")
            c.initial_for[a.name] = ",".join(parts)
        c.start_all()
        yield c, proxies
    finally:
        c.stop_all()
        proxies.close()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[ProcCluster, LinkProxies]]:
    with proxied_cluster(tmp_path) as cp:
        yield cp


def test_minority_leader_steps_down_majority_goes_on_and_all_converge(
    proxied: tuple[ProcCluster, LinkProxies],
) -> None:
    c, proxies = proxied
    c.put(b"p", b"0")
    old = c.leader()
    old_id = c.status(old).header.member_id
    rest = [n for n in c.nodes if n is not old]
    proxies.partition([old.name], [n.name for n in rest])

    new = c.leader(rest)
    assert new is not old
    for i in range(1, 11):
        c.put(b"p", b"%d" % i, via=rest)

    # CheckQuorum: cut off from both followers, the old leader steps down by itself.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and c.status(old).leader == old_id:
        time.sleep(0.05)
    assert c.status(old).leader != old_id
    assert c.get(old, b"p", serializable=True) == b"0"  # it saw none of the majority's writes

    proxies.heal()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and c.get(old, b"p", serializable=True) != b"10":
        time.sleep(0.1)
    assert c.get(old, b"p") == b"10"
    assert c.leader() is not None


def test_a_resumed_lease_holder_never_answers_from_its_expired_lease(tmp_path: Path) -> None:
    """With lease reads, a leader paused past its lease (SIGSTOP: a long GC pause, a
    stalled VM) and cut off meanwhile must not serve a read from that lease when it
    resumes: the others elected a new leader and took a write. The read is sent
    while it is stopped, so it is the first thing the resumed process sees. It may
    be refused, never answered with the old value."""
    extra = ("--shards", "1", "--lease-read", "--leader-balance-interval", "0")
    with proxied_cluster(tmp_path, extra) as (c, proxies):
        c.put(b"x", b"old")
        old = c.leader()
        assert c.get(old, b"x") == b"old"  # served from its lease; the channel is up
        c.signal(old, signal.SIGSTOP)
        rest = [n for n in c.nodes if n is not old]
        proxies.partition([old.name], [n.name for n in rest])
        c.leader(rest)
        c.put(b"x", b"new", via=rest)
        with ThreadPoolExecutor(1) as pool:
            read = pool.submit(c.get, old, b"x", timeout=3.0)
            time.sleep(0.3)  # the request waits in the stopped process's socket
            c.signal(old, signal.SIGCONT)
            try:
                value = read.result()
            except grpc.RpcError:
                value = None  # refused (no quorum behind it): allowed
        assert value != b"old"
        proxies.heal()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and c.get(old, b"x", serializable=True) != b"new":
            time.sleep(0.1)
        assert c.get(old, b"x") == b"new"


def test_garbage_on_the_peer_port_never_crashes_a_node(tmp_path: Path) -> None:
    with ProcCluster(tmp_path, 3) as c:
        c.put(b"before", b"1")
        victim = c.nodes[0]
        payloads = [
            b"\x00\x00\x00\x05hello",            # a frame that is not a handshake
            b"\xff\xff\xff\xff" + b"x" * 64,     # a length far over the limit
            b"\x00\x00\x01\x00" + b"\x93" * 10,  # a frame cut short
            bytes(range(256)) * 4,               # noise
        ]
        for payload in payloads:
            with socket.create_connection((HOST, victim.peer_port), 2) as s:
                s.sendall(payload)
                s.settimeout(0.5)
                try:
                    while s.recv(4096):
                        pass
                except (TimeoutError, ConnectionResetError):
                    pass
        assert victim.proc is not None and victim.proc.poll() is None
        c.put(b"after", b"2")
        assert c.get(victim, b"after") == b"2"
