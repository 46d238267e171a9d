"""The peer transport over mutual TLS: Raft messages and snapshots cross, a peer without a
certificate or with one from another CA is refused and logged and never delivers a
message, and a rotated certificate is used by the next connection.

Each scenario runs on asyncio's own loop and on uvloop (what ``accord serve`` runs on),
whose TLS implementations differ."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from accord.node.certs import CertFiles, CertificateAuthority, make_cluster_pki
from accord.node.tls import ReloadingTLS, TLSFiles
from accord.raft.core.types import ConfState, Entry, Message, MessageType, SnapshotMeta
from accord.raft.transport.links import BytesSnapshotSource, PeerTLS, PeerTransport
from tests.raft.transport.test_transport import until

CLUSTER = 0x7151
LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def _run(loop: str, scenario: Coroutine[Any, Any, None]) -> None:
    LOOPS[loop](scenario)


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[int, int, Message]] = []
        self.pieces: list[int] = []

    def on_messages(self, frm: int, batch: list[tuple[int, Message]]) -> None:
        self.messages.extend((frm, g, m) for g, m in batch)

    async def on_chunk(self, frm: int, piece: Any) -> int:
        self.pieces.append(len(piece.data))
        return piece.offset + len(piece.data)


def _tls(f: CertFiles) -> tuple[ReloadingTLS, PeerTLS]:
    r = ReloadingTLS(TLSFiles(str(f.cert), str(f.key), str(f.ca), True, "peer-"))
    return r, PeerTLS(r.server_context, r.client_context, handshake_timeout=3.0)


def _make(node_id: int, inbox: Inbox, tls: PeerTLS | None) -> PeerTransport:
    return PeerTransport(node_id, "127.0.0.1", 0, cluster_id=CLUSTER, tls=tls,
                         on_messages=inbox.on_messages, on_snapshot_chunk=inbox.on_chunk,
                         backoff_min=0.02, backoff_max=0.2, io_timeout=3.0)


def _app(to: int, frm: int, i: int) -> Message:
    return Message(MessageType.APP, to=to, frm=frm, term=2, log_term=1, index=i, commit=i,
                   entries=[Entry(2, i + 1, data=b"secret" * 10)])


async def _pair(a_tls: PeerTLS | None, b_tls: PeerTLS | None,
                body: Callable[[PeerTransport, PeerTransport, Inbox, Inbox], Awaitable[None]]) -> None:
    ia, ib = Inbox(), Inbox()
    a, b = _make(1, ia, a_tls), _make(2, ib, b_tls)
    await a.start()
    await b.start()
    try:
        a.set_peer(2, "127.0.0.1", b.listen_port)
        b.set_peer(1, "127.0.0.1", a.listen_port)
        await body(a, b, ia, ib)
    finally:
        await a.stop()
        await b.stop()


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, dict[str, CertFiles]]:
    return make_cluster_pki(tmp_path, ["n1", "n2"])


@pytest.mark.parametrize("loop", LOOPS)
def test_messages_and_snapshots_cross_over_mutual_tls(
        loop: str, pki: tuple[CertificateAuthority, dict[str, CertFiles]]) -> None:
    files = pki[1]

    async def body(a: PeerTransport, b: PeerTransport, ia: Inbox, ib: Inbox) -> None:
        await until(lambda: a.connected(2) and b.connected(1), "links up", limit=15.0)
        for i in range(1, 51):
            a.send(2, 7, _app(2, 1, i))
        a.flush()
        await until(lambda: len(ib.messages) == 50, "50 messages", limit=15.0)
        assert [m.index for _, _, m in ib.messages] == list(range(1, 51))
        meta = SnapshotMeta(index=9, term=2, conf_state=ConfState(voters=[1, 2]))
        await a.send_snapshot(2, 7, meta, BytesSnapshotSource(b"s" * 300_000), chunk_size=65536)
        assert sum(ib.pieces) == 300_000
        assert a.stats.tls_refused == b.stats.tls_refused == 0

    _run(loop, _pair(_tls(files["n1"])[1], _tls(files["n2"])[1], body))


def _refused(loop: str, intruder: PeerTLS | None, good: PeerTLS,
             caplog: pytest.LogCaptureFixture, expect: str) -> None:
    async def body(a: PeerTransport, b: PeerTransport, ia: Inbox, ib: Inbox) -> None:
        await until(lambda: b.stats.tls_refused >= 2, "two refused handshakes", limit=15.0)
        for i in range(1, 6):
            a.send(2, 7, _app(2, 1, i))
            a.flush()
            await asyncio.sleep(0.05)
        assert ib.messages == [] and b.stats.accepts == 0
        assert not b.connected(1) and not a.connected(2)

    with caplog.at_level(logging.INFO, logger="accord.raft.transport"):
        _run(loop, _pair(intruder, good, body))
    refusals = [r.getMessage() for r in caplog.records
                if "refused a peer connection" in r.getMessage()]
    assert refusals, [r.getMessage() for r in caplog.records]
    assert any(expect in m for m in refusals), refusals


@pytest.mark.parametrize("loop", LOOPS)
def test_a_peer_without_a_certificate_is_refused_and_logged(
        loop: str, pki: tuple[CertificateAuthority, dict[str, CertFiles]],
        caplog: pytest.LogCaptureFixture) -> None:
    files = pki[1]
    bare = ssl.create_default_context(cafile=str(files["n1"].ca))  # trusts the CA, shows nothing
    no_cert = PeerTLS(lambda: bare, lambda: bare, handshake_timeout=3.0)
    _refused(loop, no_cert, _tls(files["n2"])[1], caplog, "TLS handshake failed")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_peer_with_a_certificate_of_another_ca_is_refused_and_logged(
        loop: str, pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # The intruder trusts the cluster's CA (its certificate is no secret) but presents a
    # certificate signed by another CA: the acceptor's own verification must refuse it.
    other = make_cluster_pki(tmp_path / "other", ["n1"])[1]["n1"]
    intruder = CertFiles(other.cert, other.key, pki[1]["n2"].ca)
    _refused(loop, _tls(intruder)[1], _tls(pki[1]["n2"])[1], caplog, "certificate verify failed")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_plaintext_peer_is_refused(loop: str,
                                     pki: tuple[CertificateAuthority, dict[str, CertFiles]],
                                     caplog: pytest.LogCaptureFixture) -> None:
    _refused(loop, None, _tls(pki[1]["n2"])[1], caplog, "TLS handshake failed")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_rotated_certificate_is_used_by_the_next_connection(
        loop: str, pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    ca, files = pki
    reloading, b_tls = _tls(files["n2"])

    async def body(a: PeerTransport, b: PeerTransport, ia: Inbox, ib: Inbox) -> None:
        await until(lambda: a.connected(2), "link up", limit=15.0)
        ca.issue("n2-rotated").write(tmp_path, "n2")  # replaces n2.crt and n2.key
        a.remove_peer(2)  # a new connection, as after a restart or a lost link
        a.set_peer(2, "127.0.0.1", b.listen_port)
        await until(lambda: a.stats.connects >= 2, "second link", limit=15.0)
        a.send(2, 7, _app(2, 1, 1))
        a.flush()
        await until(lambda: len(ib.messages) == 1, "a message on the new link", limit=15.0)
        assert reloading.generation == 2

    with caplog.at_level(logging.INFO, logger="accord.raft.transport"):
        _run(loop, _pair(_tls(files["n1"])[1], b_tls, body))
    ups = [r.getMessage() for r in caplog.records if "link to node 2" in r.getMessage()
           and " up" in r.getMessage()]
    assert len(ups) >= 2, ups
    assert ups[0].endswith("CN=n2)") and ups[-1].endswith("CN=n2-rotated)"), ups
