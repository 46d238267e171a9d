"""A TCP proxy on every peer link, so tests can cut the network between real daemons.

Node ids come from member names, not URLs, so each node can be given its own
``--initial-cluster`` in which every *other* member's peer URL is a proxy
listening on 127.0.0.1 and forwarding to that member. A link ``(a, b)`` carries
what ``a`` sends to ``b`` on the connections ``a`` opened to ``b``'s proxy, and the
link ``(b, a)`` what comes back on them; blocking a link black-holes its bytes (as a
partition does: the sender's writes succeed, nothing arrives), and unblocking lets
new bytes flow again. Blocking only ``(b, a)`` drops the answers while the requests
still arrive (a client whose replies are lost after the server acted on them).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable

HOST = "127.0.0.1"


class LinkProxies:
    """One proxy per ordered pair of nodes, run on an event loop in a thread."""

    def __init__(self) -> None:
        self.blocked: set[tuple[str, str]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread.start()

    def add(self, src: str, dst: str, target_port: int) -> int:
        """Start the proxy for link ``src -> dst``; returns the port ``src`` should dial."""
        fut = asyncio.run_coroutine_threadsafe(self._start(src, dst, target_port), self._loop)
        return fut.result(10)

    async def _start(self, src: str, dst: str, target_port: int) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_r, up_w = await asyncio.open_connection(HOST, target_port)
            except OSError:
                writer.close()
                return
            self._writers.update((writer, up_w))
            await asyncio.gather(
                self._pipe(reader, up_w, (src, dst)),
                self._pipe(up_r, writer, (dst, src)),
                return_exceptions=True,
            )
            for w in (writer, up_w):
                self._writers.discard(w)
                w.close()

        server = await asyncio.start_server(handle, HOST, 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    link: tuple[str, str]) -> None:
        while True:
            data = await r.read(65536)
            if not data:
                break
            if link in self.blocked:
                continue  # black hole
            w.write(data)
            await w.drain()
        with contextlib.suppress(Exception):
            w.close()

    def partition(self, isolated: Iterable[str], others: Iterable[str]) -> None:
        """Cut every link between the two sides, both ways."""
        iso, rest = list(isolated), list(others)
        for a in iso:
            for b in rest:
                self.blocked.update({(a, b), (b, a)})

    def heal(self) -> None:
        """Let every link carry bytes again."""
        self.blocked.clear()

    def close(self) -> None:
        async def _close() -> None:
            for s in self._servers:
                s.close()
            for w in list(self._writers):
                w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
