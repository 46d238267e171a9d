"""gRPC server credentials from ``ReloadingTLS``: mutual TLS enforced, and a rotated
certificate served to the next connection without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from accord.node.certs import CertFiles, CertificateAuthority, make_cluster_pki
from accord.node.tls import ReloadingTLS, TLSFiles
from tests.security.probe import served_cn

Pki = tuple[CertificateAuthority, dict[str, CertFiles]]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_cluster_pki(tmp_path, ["n1"])


@pytest.fixture
async def mtls_port(pki: Pki) -> AsyncIterator[int]:
    f = pki[1]["n1"]
    tls = ReloadingTLS(TLSFiles(str(f.cert), str(f.key), str(f.ca), client_cert_auth=True))
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    await server.start()
    yield port
    await server.stop(0)


async def _check(port: int, creds: grpc.ChannelCredentials) -> grpc.StatusCode:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        try:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


async def test_mutual_tls_is_required(pki: Pki, mtls_port: int, tmp_path: Path) -> None:
    c = pki[1]["client"]
    ca = c.ca.read_bytes()
    ok = grpc.ssl_channel_credentials(ca, c.key.read_bytes(), c.cert.read_bytes())
    assert await _check(mtls_port, ok) == grpc.StatusCode.OK
    assert await _check(mtls_port, grpc.ssl_channel_credentials(ca)) == grpc.StatusCode.UNAVAILABLE
    stranger = CertificateAuthority.create("another CA").issue("mallory", hosts=())
    wrong = grpc.ssl_channel_credentials(ca, stranger.key_pem, stranger.cert_pem)
    assert await _check(mtls_port, wrong) == grpc.StatusCode.UNAVAILABLE


async def test_a_rotated_certificate_is_served_to_new_connections(pki: Pki, mtls_port: int,
                                                                  tmp_path: Path) -> None:
    ca, files = pki
    assert await asyncio.to_thread(served_cn, mtls_port, files["client"]) == "n1"
    ca.issue("n1-rotated").write(tmp_path, "n1")
    assert await asyncio.to_thread(served_cn, mtls_port, files["client"]) == "n1-rotated"
    c = files["client"]
    ok = grpc.ssl_channel_credentials(c.ca.read_bytes(), c.key.read_bytes(), c.cert.read_bytes())
    assert await _check(mtls_port, ok) == grpc.StatusCode.OK
