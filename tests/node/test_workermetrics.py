"""The supervisor's metrics and health endpoints of a node of several workers
(``accord/node/workermetrics.py``), against workers served on real Unix sockets."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from accord.node import workermetrics
from accord.node.certs import make_cluster_pki
from accord.node.httpserve import following
from accord.node.tls import ReloadingTLS, TLSFiles
from accord.node.workermetrics import WorkersMetricsServer, merge


def worker_text(worker: int, leader: float) -> str:
    r = CollectorRegistry()
    Counter("etcd_server_proposals_committed", "Committed proposals.",
            registry=r).inc(10 + worker)
    Gauge("etcd_server_has_leader", "Whether a leader exists.", registry=r).set(leader)
    h = Histogram("grpc_server_handling_seconds", "Latency.", ["grpc_method"], registry=r)
    h.labels("Put").observe(0.01 * (worker + 1))
    return generate_latest(r).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_merge_labels_every_sample_with_its_worker_and_keeps_each_family_once() -> None:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(workermetrics._Families(merge({0: worker_text(0, 1), 1: worker_text(1, 0)})))
    text = generate_latest(reg).decode()
    assert text.count("# TYPE etcd_server_has_leader gauge") == 1
    assert text.count("# TYPE grpc_server_handling_seconds histogram") == 1
    got = samples(text)
    assert got[("etcd_server_has_leader", (("worker", "0"),))] == 1.0
    assert got[("etcd_server_has_leader", (("worker", "1"),))] == 0.0
    assert got[("etcd_server_proposals_committed_total", (("worker", "1"),))] == 11.0
    assert got[("grpc_server_handling_seconds_count",
                (("grpc_method", "Put"), ("worker", "0")))] == 1.0
    assert got[("accord_worker_up", (("worker", "0"),))] == 1.0
    assert got[("accord_worker_up", (("worker", "1"),))] == 1.0


def test_merge_counts_a_silent_worker_down_and_refuses_a_clashing_label() -> None:
    families = {f.name: f for f in merge({0: worker_text(0, 1), 1: None})}
    assert {(s.labels["worker"], s.value) for s in families["accord_worker_up"].samples} == {
        ("0", 1.0), ("1", 0.0)}
    assert {s.labels["worker"] for s in families["etcd_server_has_leader"].samples} == {"0"}
    with pytest.raises(ValueError, match="already has a 'worker' label"):
        merge({0: 'x{worker="9"} 1\n'})


async def serve_worker(path: Path, metrics: str, health: int = 200,
                       hang: asyncio.Event | None = None) -> web.AppRunner:
    """A stand-in worker on the Unix socket ``path``: fixed metrics and health answers,
    or (``hang``) one that accepts and never answers until the event is set."""

    async def scrape(request: web.Request) -> web.StreamResponse:
        if hang is not None:
            await hang.wait()
        return web.Response(text=metrics)

    async def probe(request: web.Request) -> web.StreamResponse:
        if hang is not None:
            await hang.wait()
        body = '{"health":"true","reason":""}' if health == 200 else "[-]leader failed\n"
        return web.Response(status=health, text=body)

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    for p in ("/health", "/livez", "/readyz", "/readyz/{check}"):
        app.router.add_get(p, probe)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    return runner


@pytest.fixture
async def sockets(tmp_path: Path) -> AsyncIterator[list[Path]]:
    yield [tmp_path / "worker-0.metrics.sock", tmp_path / "worker-1.metrics.sock"]


async def get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def test_the_supervisor_serves_every_workers_metrics_and_health(
        sockets: list[Path]) -> None:
    workers = [await serve_worker(sockets[0], worker_text(0, 1)),
               await serve_worker(sockets[1], worker_text(1, 1))]
    server = WorkersMetricsServer(sockets)
    await server.start([("127.0.0.1", 0, None)])
    try:
        status, text = await get(server.ports[0], "/metrics")
        assert status == 200
        got = samples(text)
        assert {w for (n, labels), _v in got.items() if n == "etcd_server_has_leader"
                for k, w in labels if k == "worker"} == {"0", "1"}
        assert await get(server.ports[0], "/health") == (200, '{"health":"true","reason":""}')
        assert (await get(server.ports[0], "/readyz/leader"))[0] == 200
        async with aiohttp.ClientSession() as s, \
                s.post(f"http://127.0.0.1:{server.ports[0]}/metrics") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET"
    finally:
        await server.stop()
        for w in workers:
            await w.cleanup()


async def test_a_worker_unhealthy_or_silent_makes_the_node_unhealthy(
        sockets: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workermetrics, "SCRAPE_TIMEOUT_S", 0.5)
    hang = asyncio.Event()
    workers = [await serve_worker(sockets[0], worker_text(0, 1), health=503),
               await serve_worker(sockets[1], worker_text(1, 1), hang=hang)]
    server = WorkersMetricsServer(sockets)
    await server.start([("127.0.0.1", 0, None)])
    try:
        assert await get(server.ports[0], "/health") == (503, "worker 0: [-]leader failed\n")
        await workers[0].cleanup()
        workers[0] = await serve_worker(sockets[0], worker_text(0, 1))
        assert await get(server.ports[0], "/livez") == (503, "worker 1: no answer\n")
        status, text = await get(server.ports[0], "/metrics")
        got = samples(text)
        assert status == 200
        assert got[("accord_worker_up", (("worker", "0"),))] == 1.0
        assert got[("accord_worker_up", (("worker", "1"),))] == 0.0
        assert ("etcd_server_has_leader", (("worker", "0"),)) in got
        assert ("etcd_server_has_leader", (("worker", "1"),)) not in got
    finally:
        hang.set()
        await server.stop()
        for w in workers:
            await w.cleanup()


async def test_an_https_metrics_url_is_served_with_the_client_certificate(
        sockets: list[Path], tmp_path: Path) -> None:
    """As a node of one process serves it: the supervisor presents the node's client
    certificate and, with a trusted CA, asks for the scraper's."""
    _ca, files = make_cluster_pki(tmp_path / "certs", ["n1"])
    node, client = files["n1"], files["client"]
    tls = ReloadingTLS(TLSFiles(str(node.cert), str(node.key), str(node.ca)))
    workers = [await serve_worker(sockets[0], worker_text(0, 1)),
               await serve_worker(sockets[1], worker_text(1, 1))]
    server = WorkersMetricsServer(sockets)
    await server.start([("127.0.0.1", 0, following(tls.server_context))])
    try:
        trusting = ssl.create_default_context(cafile=str(client.ca))
        trusting.load_cert_chain(str(client.cert), str(client.key))
        url = f"https://127.0.0.1:{server.ports[0]}/metrics"
        async with aiohttp.ClientSession() as s, s.get(url, ssl=trusting) as r:
            assert r.status == 200
            assert samples(await r.text())[("accord_worker_up", (("worker", "1"),))] == 1.0
        anonymous = ssl.create_default_context(cafile=str(client.ca))
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as s, s.get(url, ssl=anonymous) as r:
                await r.text()
    finally:
        await server.stop()
        for w in workers:
            await w.cleanup()
