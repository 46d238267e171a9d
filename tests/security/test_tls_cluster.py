"""Real `accord serve` daemons under mutual TLS, driven by real `etcdctl`, the accord CLI
and the Python client; refusals compared with a real etcd started with the same flags."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.client import AccordClient, TLSOptions, Unavailable
from accord.node.certs import CertFiles, make_cluster_pki
from tests.compat.etcdctl import etcdctl
from tests.compat.servers import EtcdTLS, Server, etcd_server
from tests.integration.cluster import ClusterTLS, ProcCluster, ProcNode
from tests.security.probe import served_cn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    root = tmp_path_factory.mktemp("mtls")
    with ProcCluster(root, 3, tls=ClusterTLS.make(root / "certs", ["n1", "n2", "n3"])) as c:
        c.leader()
        yield c


@pytest.fixture(scope="module")
def etcd_mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, CertFiles]]:
    """A real etcd with --cert-file --key-file --trusted-ca-file --client-cert-auth."""
    root = tmp_path_factory.mktemp("etcd-mtls")
    _, files = make_cluster_pki(root / "certs", ["etcd"])
    with etcd_server(root / "data", EtcdTLS(files["etcd"], files["client"])) as server:
        yield server, files["client"]


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A client certificate from another CA (its CA file is that other CA)."""
    return make_cluster_pki(tmp_path_factory.mktemp("stranger"), [])[1]["client"]


def _flags(c: CertFiles, *, cert: bool = True, cacert: Path | None = None) -> list[str]:
    out = [f"--cacert={cacert or c.ca}"]
    return out + ([f"--cert={c.cert}", f"--key={c.key}"] if cert else [])


def _tls(c: ProcCluster) -> ClusterTLS:
    assert c.tls is not None
    return c.tls


def test_etcdctl_over_mutual_tls_and_writes_replicate(tls_cluster: ProcCluster) -> None:
    flags = _tls(tls_cluster).etcdctl_flags()
    assert etcdctl(tls_cluster.endpoints, *flags, "put", "/tls/hello", "world").strip() == "OK"
    for node in tls_cluster.nodes:  # each member's own copy, read locally: replicated over mTLS
        out = ""
        for _ in range(300):
            out = etcdctl(node.client_url, *flags, "get", "/tls/hello", "--consistency=s")
            if out:
                break
            time.sleep(0.05)
        assert out.split() == ["/tls/hello", "world"], node.name
    status = etcdctl(tls_cluster.endpoints, *flags, "endpoint", "status", "-w", "table")
    assert status.count("https://127.0.0.1:") == 3


def test_a_member_with_plain_http_peer_urls_is_refused_on_a_tls_cluster(
        tls_cluster: ProcCluster) -> None:
    """The peers of this cluster talk TLS: a member added (or moved) with http:// peer
    URLs could never reach them, so MemberAdd and MemberUpdate refuse the URL with
    INVALID_ARGUMENT naming the scheme to use, and the member table is unchanged."""
    flags = _tls(tls_cluster).etcdctl_flags()
    before = etcdctl(tls_cluster.endpoints, *flags, "member", "list")
    out = etcdctl(tls_cluster.endpoints, *flags, "member", "add", "n4",
                  "--peer-urls=http://127.0.0.1:2", check=False)
    assert "is http:// but this cluster's peers use https://" in out, out
    member_id = before.split(",")[0].strip()
    out = etcdctl(tls_cluster.endpoints, *flags, "member", "update", member_id,
                  "--peer-urls=http://127.0.0.1:2", check=False)
    assert "give the member https:// peer URLs" in out, out
    assert etcdctl(tls_cluster.endpoints, *flags, "member", "list") == before


def _refused(endpoint: str, flags: list[str]) -> str:
    out = etcdctl(endpoint, *flags, "--dial-timeout=1s", "--command-timeout=2s", "put", "/x", "y",
                  check=False)
    assert "OK" not in out.split(), out
    return out


def test_client_without_a_certificate_is_refused_like_etcd(
        tls_cluster: ProcCluster, etcd_mtls: tuple[Server, CertFiles]) -> None:
    client = _tls(tls_cluster).client
    ours = _refused(tls_cluster.nodes[0].client_url, _flags(client, cert=False))
    etcd, etcd_client = etcd_mtls
    theirs = _refused(etcd.url, _flags(etcd_client, cert=False))
    for out in (ours, theirs):  # etcdctl reports both the same way
        assert "context deadline exceeded" in out or "certificate" in out, out
    # the same etcdctl with the certificate works against both
    assert etcdctl(etcd.url, *_flags(etcd_client), "put", "/x", "y").strip() == "OK"


def test_client_with_a_certificate_of_another_ca_is_refused_like_etcd(
        tls_cluster: ProcCluster, etcd_mtls: tuple[Server, CertFiles], stranger: CertFiles) -> None:
    cluster_ca = _tls(tls_cluster).client.ca
    _refused(tls_cluster.nodes[0].client_url, _flags(stranger, cacert=cluster_ca))
    etcd, etcd_client = etcd_mtls
    _refused(etcd.url, _flags(stranger, cacert=etcd_client.ca))


def test_python_client_over_mutual_tls(tls_cluster: ProcCluster, stranger: CertFiles) -> None:
    c = _tls(tls_cluster).client
    urls = tls_cluster.endpoints.split(",")

    async def main() -> None:
        async with AccordClient(urls, cacert=str(c.ca), cert=str(c.cert), key=str(c.key)) as cl:
            await cl.put("/tls/py", "v1")
            kv = await cl.get("/tls/py")
            assert kv is not None and kv.value == b"v1"
            async with cl.lock("/tls/job/lock", ttl=5) as lock:
                await lock.guarded_put(b"/tls/job/state", b"held")
        async with AccordClient(urls, cacert=str(c.ca), call_timeout_s=1.0,
                                retry_budget_s=2.0) as anonymous:
            with pytest.raises(Unavailable):
                await anonymous.get("/tls/py")

    asyncio.run(main())


def _accord(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accord", *args], capture_output=True, text=True,
                          timeout=60)


def test_accord_cli_over_mutual_tls(tls_cluster: ProcCluster, tmp_path: Path) -> None:
    c = _tls(tls_cluster).client
    flags = ["--endpoints", tls_cluster.endpoints, "--cacert", str(c.ca), "--cert", str(c.cert),
             "--key", str(c.key)]
    put = _accord("kv", "put", "/tls/cli", "v", *flags)
    assert put.returncode == 0 and put.stdout.startswith("OK"), put.stderr
    got = _accord("kv", "get", "/tls/cli", *flags)
    assert got.returncode == 0 and "v" in got.stdout.split(), got
    status = _accord("status", *flags)  # dials every member at its published https:// URL
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("https://127.0.0.1:") == 3 and status.stdout.count("*") == 1
    nodes = _accord("nodes", *flags)
    assert nodes.returncode == 0 and "3 member(s)" in nodes.stdout, nodes
    missing = _accord("kv", "get", "/tls/cli", *flags[:2], "--cacert", str(tmp_path / "nope.pem"))
    assert missing.returncode == 2
    assert f"--cacert {tmp_path / 'nope.pem'}: no such file" in missing.stderr
    no_cert = _accord("kv", "get", "/tls/cli", *flags[:4], "--command-timeout", "2s")
    assert no_cert.returncode == 1 and "UNAVAILABLE" in no_cert.stderr


def _log_has(c: ProcCluster, node: ProcNode, pattern: str, limit: float = 30.0) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        log = node.log_path.read_text(errors="replace")
        m = re.search(pattern, log)
        if m:
            return m.group(0)
        time.sleep(0.1)
    raise AssertionError(f"{node.name}'s log has no {pattern!r}:\n{c.log(node)}")


def test_rotated_certificates_are_picked_up_without_a_restart(tls_cluster: ProcCluster) -> None:
    # Runs last in this module: it changes n3's certificate.
    tls = _tls(tls_cluster)
    n1, n3 = tls_cluster.nodes[0], tls_cluster.nodes[2]
    assert served_cn(n3.client_port, tls.client) == "n3"
    pid = n3.proc.pid if n3.proc else 0
    tls.ca.issue("n3-rotated").write(tls.folder, "n3")  # both files renamed over
    # the client port: the next TLS connection gets the new certificate
    assert served_cn(n3.client_port, tls.client) == "n3-rotated"
    # the peer links: restart n1, so n3 dials it anew and n1 dials n3 anew
    tls_cluster.stop(n1)
    tls_cluster.start(n1)
    tls_cluster.wait_serving(n1)
    _log_has(tls_cluster, n1, r"TLS peer connection from \S+ \S+ \(certificate CN=n3-rotated\)")
    _log_has(tls_cluster, n1, r"link to node \d+ \(127\.0\.0\.1:\d+\) up \(TLS, peer certificate "
                              r"CN=n3-rotated\)")
    _log_has(tls_cluster, n3, r"re-read TLS files .* now presenting CN=n3-rotated")
    tls_cluster.put(b"/tls/after-rotation", b"yes", via=[n1])
    for _ in range(200):
        with contextlib.suppress(Exception):
            if tls_cluster.get(n3, b"/tls/after-rotation", serializable=True) == b"yes":
                break
        time.sleep(0.05)
    else:
        raise AssertionError("a write through n1 did not reach n3 after the rotation")
    assert n3.proc is not None and n3.proc.pid == pid and n3.proc.poll() is None  # not restarted


def test_a_node_with_another_cas_certificate_cannot_join(tmp_path: Path) -> None:
    tls = ClusterTLS.make(tmp_path / "certs", ["n1", "n2", "n3"])
    foreign = make_cluster_pki(tmp_path / "foreign", ["n3"])[1]["n3"]  # its own CA, trusted
    tls.certs["n3"] = foreign
    c = ProcCluster(tmp_path, 3, tls=tls)
    n1, n2, n3 = c.nodes
    try:
        for node in c.nodes:
            c.start(node)
        for node in c.nodes:
            c.wait_serving(node)
        leader = c.leader(among=[n1, n2])
        assert leader in (n1, n2)
        c.put(b"/tls/no-intruder", b"v", via=[n1, n2])
        for node in (n1, n2):
            # the intruder's dials are refused, and so is its certificate when dialed
            _log_has(c, node, r"refused a peer connection from \S+ \S+ TLS handshake failed")
            _log_has(c, node, rf"link to node \d+ \(127\.0\.0\.1:{n3.peer_port}\): TLS handshake "
                               r"failed: certificate verify failed")
        time.sleep(1.0)
        # the intruder's own view: no link ever came up, no leader, no data
        log3 = n3.log_path.read_text(errors="replace")
        assert " up (TLS" not in log3 and "TLS peer connection from" not in log3, log3[-3000:]
        n3_client = ProcNode("n3", n3.client_port, n3.peer_port, n3.data_dir, n3.log_path,
                             tls=foreign_client(tmp_path))
        try:
            assert c.status(n3_client).leader == 0
            assert c.get(n3_client, b"/tls/no-intruder", serializable=True) is None
        finally:
            n3_client.close_channel()
        for node in (n1, n2):
            log = node.log_path.read_text(errors="replace")
            assert "certificate CN=n3)" not in log, "a link from the intruder was accepted"
    finally:
        c.stop_all()


def foreign_client(tmp_path: Path) -> TLSOptions:
    """Client options trusted by the intruder (its CA made a client certificate too)."""
    f = tmp_path / "foreign"
    return TLSOptions(cacert=str(f / "ca.crt"), cert=str(f / "client.crt"), key=str(f / "client.key"))
