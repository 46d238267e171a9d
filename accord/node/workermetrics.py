"""A node of several workers' ``/metrics`` and health endpoints, served by its supervisor.

Each worker serves its own ``/metrics``, ``/health``, ``/livez`` and ``/readyz``
(``httpserve.py``) on a Unix socket of the node's data directory
(``WorkerPlan.metrics_socket``); the supervisor listens on ``--listen-metrics-urls``
(default: the first client URL's port + 1000, as a node of one process) and answers
every request from all of its workers (``docs/workers.md``):

* ``GET /metrics``: every worker's series with a ``worker`` label added (a worker counts
  its own calls, groups and log, so a node's figure is the sum or the minimum over its
  workers: ``sum without (worker)``), each family once, and ``accord_worker_up{worker}``:
  1 for a worker that answered, 0 for one that did not within ``SCRAPE_TIMEOUT_S``
  (restarting, or stopped), whose series are then missing from this scrape;
* the health paths: the same request (path and query) to every worker; 200 only when
  every worker answers 200, else the first other answer, its body prefixed by the
  worker's name (a worker that does not answer is a 503 naming it).

An ``https://`` metrics URL is served with the client certificate, as a node of one
process serves it (the workers' sockets are local and plain).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from accord.node.httpserve import TEXT, listen, not_allowed, scrape_response

log = logging.getLogger("accord.node.workermetrics")

SCRAPE_TIMEOUT_S = 2.0
"""How long the supervisor waits for one worker's answer before counting it down."""
WORKER_LABEL = "worker"


def merge(texts: Mapping[int, str | None]) -> list[Metric]:
    """The families of every worker's Prometheus text (``None``: the worker did not
    answer), each sample labelled with its worker, one family per name in first-seen
    order, and ``accord_worker_up``. Raises ``ValueError`` on text that does not parse."""
    families: dict[str, Metric] = {}
    up = GaugeMetricFamily("accord_worker_up",
                           "Whether the worker answered this scrape (1) or not (0).",
                           labels=[WORKER_LABEL])
    for worker in sorted(texts):
        text = texts[worker]
        up.add_metric([str(worker)], 0.0 if text is None else 1.0)
        if text is None:
            continue
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type,
                                                     fam.unit)
            for sample in fam.samples:
                labels = dict(sample.labels)
                if WORKER_LABEL in labels:
                    raise ValueError(f"worker {worker}: {sample.name} already has a "
                                     f"{WORKER_LABEL!r} label")
                labels[WORKER_LABEL] = str(worker)
                merged.add_sample(sample.name, labels, sample.value, sample.timestamp,
                                  sample.exemplar)
    return [*families.values(), up]


class _Families(Collector):
    """A registry's one collector: the families of one merged scrape."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class WorkersMetricsServer:
    """The supervisor's metrics listener (see the module docstring)."""

    def __init__(self, sockets: Sequence[Path]) -> None:
        self.sockets = list(sockets)
        """Worker ``k``'s metrics socket at index ``k``."""
        self._sessions: list[aiohttp.ClientSession] = []
        self._runner: web.AppRunner | None = None
        self.ports: list[int] = []

    def app(self) -> web.Application:
        """The routes (also used by tests without a socket)."""
        app = web.Application()
        app.router.add_route("*", "/metrics", self._scrape)
        for path in ("/health", "/livez", "/readyz", "/livez/{check}", "/readyz/{check}"):
            app.router.add_route("*", path, self._health)
        return app

    async def start(self, addresses: Sequence[tuple[str, int, ssl.SSLContext | None]]) -> None:
        """Listen on every ``(host, port, TLS context or None)``; ``OSError`` naming the
        address that failed."""
        self._sessions = [
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(p)),
                                  timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
            for p in self.sockets]
        try:
            self._runner, self.ports = await listen(self.app(), addresses)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the listeners and the connections to the workers."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for session in self._sessions:
            await session.close()
        self._sessions = []

    async def _ask(self, worker: int, path_qs: str) -> tuple[int, str] | None:
        """Worker ``worker``'s answer to ``GET path_qs`` (status, body), or None when it
        does not answer in time."""
        try:
            async with self._sessions[worker].get(f"http://worker{path_qs}") as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            log.debug("worker %d did not answer %s: %s", worker, path_qs, e)
            return None

    async def _ask_all(self, path_qs: str) -> list[tuple[int, str] | None]:
        return list(await asyncio.gather(*(self._ask(k, path_qs)
                                           for k in range(len(self.sockets)))))

    async def _scrape(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_allowed()
        answers = await self._ask_all("/metrics")
        texts = {k: (a[1] if a is not None and a[0] == 200 else None)
                 for k, a in enumerate(answers)}
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(merge(texts)))
        return scrape_response(registry, request)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_allowed()
        answers = await self._ask_all(request.path_qs)
        for k, answer in enumerate(answers):
            if answer is None:
                return web.Response(status=503, text=f"worker {k}: no answer\n",
                                    headers={"Content-Type": TEXT})
            status, body = answer
            if status != 200:
                return web.Response(status=status, text=f"worker {k}: {body}",
                                    headers={"Content-Type": TEXT})
        first = answers[0]
        assert first is not None
        return web.Response(status=200, text=first[1], headers={"Content-Type": TEXT})

