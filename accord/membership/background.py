"""A SWIM member for synchronous programs: ``BackgroundMembership`` runs one in a thread.

The GPU agent (``accord nodes agent``) is a plain blocking loop of gRPC calls; rather
than rewrite it around asyncio, it starts a ``Membership`` on a private event loop in
a daemon thread and talks to it through thread-safe calls. The thread is owned: it
is started by ``start()`` and ended (gracefully leaving the group) by ``stop()``.

    bg = BackgroundMembership(SwimConfig.lan(), bind=("10.0.0.7", 0), name="gpu-a",
                              seeds=[("10.0.0.1", 3380)], meta={"role": "gpu-agent"})
    addr = bg.start()
    alive = [m.name for m in bg.members()]
    bg.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from .config import SwimConfig
from .node import Membership
from .state import Address, Member

__all__ = ["BackgroundMembership", "local_address_toward"]

T = TypeVar("T")


def local_address_toward(addr: Address) -> str:
    """This host's address on the route to ``addr`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class BackgroundMembership:
    """One ``Membership`` on its own event loop in a daemon thread."""

    def __init__(self, config: SwimConfig, *, bind: Address, name: str | None = None,
                 seeds: Sequence[Address] = (), meta: Mapping[str, str] | None = None) -> None:
        self._membership = Membership(config, bind=bind, name=name, seeds=seeds, meta=meta)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self, timeout: float = 10.0) -> Address:
        """Start the thread and the member; returns its address (raises what start raised)."""
        if self._thread is not None:
            raise RuntimeError("background membership already started")
        self._thread = threading.Thread(target=self._loop.run_forever, name="swim", daemon=True)
        self._thread.start()
        try:
            self._call(self._membership.start(), timeout)
        except BaseException:
            self._halt()
            raise
        return self._membership.address

    def members(self, timeout: float = 5.0) -> list[Member]:
        """Every member this one knows (dead ones until reaped)."""
        return self._call(self._members(), timeout)

    async def _members(self) -> list[Member]:
        return self._membership.members(include_dead=True)

    def stop(self, *, leave: bool = True, timeout: float = 10.0) -> None:
        """Leave the group (unless ``leave`` is False), stop the member and end the thread."""
        if self._thread is None or self._stopped:
            return
        self._stopped = True
        try:
            if leave:
                with contextlib.suppress(Exception):
                    self._call(self._membership.leave(), timeout)
            self._call(self._membership.stop(), timeout)
        finally:
            self._halt()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def _halt(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5.0)
        if not self._thread or not self._thread.is_alive():
            self._loop.close()
