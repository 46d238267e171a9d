"""The metrics listener: ``/metrics``, ``/health``, ``/livez``, ``/readyz`` over HTTP.

One aiohttp server on the node's event loop, bound to every ``--listen-metrics-urls``
address (default: the first client URL's host at its port + 1000, see ``config.py``).
Serving on the loop means a scrape reads the node's state with no locking and no
thread: the collectors run between two loop iterations like any request would.

``GET /metrics`` answers in the format the scraper asks for (Prometheus text, or
OpenMetrics when its ``Accept`` says so; gzip when allowed); the health paths follow
``health.py``. Any other method gets 405 with ``Allow: GET``, as etcd answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from accord.node.health import HealthChecks
from accord.node.metrics import NodeMetrics, exposition

log = logging.getLogger("accord.node.httpserve")

TEXT = "text/plain; charset=utf-8"


class MetricsServer:
    """``/metrics`` and the health endpoints of one node (see the module docstring)."""

    def __init__(self, metrics: NodeMetrics, checks: HealthChecks) -> None:
        self._metrics = metrics
        self._checks = checks
        self._runner: web.AppRunner | None = None
        self.ports: list[int] = []
        """The ports bound, in the order of the addresses given to ``start``."""

    def app(self) -> web.Application:
        """The routes (also used by tests without a socket)."""
        app = web.Application()
        app.router.add_route("*", "/metrics", self._scrape)
        app.router.add_route("*", "/health", self._health)
        for kind in ("livez", "readyz"):
            app.router.add_route("*", f"/{kind}", self._probe)
            app.router.add_route("*", f"/{kind}/{{check}}", self._probe)
        return app

    async def start(self, addresses: Sequence[tuple[str, int, ssl.SSLContext | None]]) -> None:
        """Listen on every ``(host, port, TLS context or None)``; ``OSError`` naming the
        address that failed."""
        self._runner, self.ports = await listen(self.app(), addresses)

    async def start_unix(self, path: Path) -> None:
        """Listen on the Unix socket ``path`` instead (a worker of a node of several,
        scraped by its supervisor: ``workermetrics.py``); a stale socket file is replaced."""
        self._runner, _ports = await listen(self.app(), (), unix=path)

    async def stop(self) -> None:
        """Close the listeners and any request in flight."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ handlers
    async def _scrape(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_allowed()
        await self._metrics.refresh()
        return scrape_response(self._metrics.registry, request)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_allowed()
        exclude = request.query.getall("exclude", [])
        serializable = request.query.get("serializable") == "true"
        ok, reason = await self._checks.health(serializable=serializable, exclude=exclude)
        self._metrics.health_checked(ok)
        body = json.dumps({"health": "true" if ok else "false", "reason": reason},
                          separators=(",", ":"))
        if not ok:
            log.warning("/health: unhealthy: %s", reason)
            return web.Response(status=503, text=body + "\n", headers={"Content-Type": TEXT})
        return web.Response(status=200, text=body, headers={"Content-Type": TEXT})

    async def _probe(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return not_allowed()
        kind = request.path.strip("/").split("/")[0]
        names = self._checks.names(kind)
        check = request.match_info.get("check")
        if check is not None:
            if check not in names:
                return web.Response(status=404, text="404 page not found\n",
                                    headers={"Content-Type": TEXT})
            chosen: Sequence[str] = (check,)
        else:
            excluded = set(request.query.getall("exclude", []))
            chosen = [n for n in names if n not in excluded]
        verdict = await self._checks.run(chosen)
        verbose = "verbose" in request.query
        if not verdict.ok:
            log.warning("/%s: %s", kind, "; ".join(verdict.lines))
        return web.Response(status=200 if verdict.ok else 503, text=verdict.body(verbose),
                            headers={"Content-Type": TEXT, "X-Content-Type-Options": "nosniff"})


async def listen(app: web.Application, addresses: Sequence[tuple[str, int, ssl.SSLContext | None]],
                 *, unix: Path | None = None) -> tuple[web.AppRunner, list[int]]:
    """Serve ``app`` on every ``(host, port, TLS context or None)`` (and on the Unix
    socket ``unix``, a stale file there replaced): its runner and the ports bound, in
    order; ``OSError`` naming the address that failed (then nothing is left listening)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        if unix is not None:
            await asyncio.to_thread(unix.unlink, missing_ok=True)
            await web.UnixSite(runner, str(unix)).start()
        for host, port, context in addresses:
            site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=context)
            try:
                await site.start()
            except OSError as e:
                scheme = "https" if context is not None else "http"
                raise OSError(f"cannot serve metrics on {scheme}://{host}:{port}: "
                              f"{e.strerror or e}") from e
        return runner, [int(a[1]) for a in runner.addresses if isinstance(a, tuple)]
    except BaseException:
        await runner.cleanup()
        raise


def scrape_response(registry: CollectorRegistry, request: web.Request) -> web.Response:
    """``registry`` in the format the scraper asks for, compressed when it allows."""
    body, content_type = exposition(registry, request.headers.get("Accept", ""))
    resp = web.Response(body=body, headers={"Content-Type": content_type})
    resp.enable_compression()
    return resp


def following(current: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """A server context that hands every handshake to ``current()`` (the node's reloading
    client TLS), so a rotated certificate is served from the next connection on."""
    base = current()

    def pick(sock: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        sock.context = current()

    base.sni_callback = pick
    return base


def not_allowed() -> web.Response:
    """etcd's answer to a method other than GET on these paths."""
    return web.Response(status=405, text="Method Not Allowed\n",
                        headers={"Allow": "GET", "Content-Type": TEXT})
