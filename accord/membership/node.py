"""The asyncio driver: a ``Membership`` runs the SWIM protocol over real UDP and TCP.

UDP (``loop.create_datagram_endpoint``) carries probes and gossip; TCP
(``asyncio.start_server``, same port number) carries push-pull state exchanges in
4-byte length-prefixed frames. The protocol itself is ``protocol.SwimProtocol``; this
module only moves bytes, keeps its one timer armed at the protocol's next deadline,
and fans membership events out to subscribers.

    m = Membership(SwimConfig.lan(), bind=("10.0.0.5", 7946), seeds=[("10.0.0.1", 7946)],
                   meta={"role": "raft"})
    await m.start()
    async for event in m.subscribe():   # joined / updated / suspect / dead / left / alive
        print(event.kind, event.member.name)
    await m.leave(); await m.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from .config import SwimConfig
from .protocol import SwimProtocol
from .state import Address, Member, MemberEvent
from .stats import ProtocolStats

__all__ = ["Membership", "Subscription"]

log = logging.getLogger(__name__)
_FRAME = struct.Struct(">I")
MAX_FRAME = 64 << 20
_MAX_SYNCS = 4
_EPHEMERAL_ATTEMPTS = 8


class Subscription:
    """A bounded stream of membership events; iterate it with ``async for``.

    If the consumer falls more than ``maxsize`` events behind, the oldest are dropped
    and counted in ``dropped`` (the membership itself never waits for consumers).
    """

    def __init__(self, owner: Membership, maxsize: int) -> None:
        self._owner = owner
        self._queue: asyncio.Queue[MemberEvent | None] = asyncio.Queue(maxsize)
        self.dropped = 0

    def _offer(self, event: MemberEvent | None) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(event)

    async def get(self) -> MemberEvent | None:
        """The next event; None once the membership has stopped."""
        return await self._queue.get()

    def close(self) -> None:
        """Stop receiving events."""
        self._owner._subscribers.discard(self)
        self._offer(None)

    def __aiter__(self) -> AsyncIterator[MemberEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[MemberEvent]:
        while True:
            event = await self._queue.get()
            if event is None:
                return
            yield event


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, owner: Membership) -> None:
        self._owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self._owner._on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        log.debug("membership UDP error: %s", exc)


class Membership:
    """One member of the group, over asyncio UDP + TCP."""

    def __init__(
        self,
        config: SwimConfig | None = None,
        *,
        bind: Address,
        name: str | None = None,
        advertise: Address | None = None,
        seeds: Sequence[Address] = (),
        meta: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or SwimConfig.lan()
        self._bind = bind
        self._name = name
        self._advertise = advertise
        self._seeds = list(seeds)
        self._meta = dict(meta or {})
        self._rng = rng
        self._proto: SwimProtocol | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._server: asyncio.Server | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._subscribers: set[Subscription] = set()
        self._stopped = False
        self.syncs_failed = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind UDP and TCP, announce ourselves, and contact the seeds."""
        if self._proto is not None:
            raise RuntimeError("membership already started")
        loop = asyncio.get_running_loop()
        # With port 0 the kernel picks a free UDP port, whose TCP twin may be taken:
        # then try another one.
        attempts = _EPHEMERAL_ATTEMPTS if self._bind[1] == 0 else 1
        for attempt in range(attempts):
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Udp(self), local_addr=self._bind
            )
            host, port = transport.get_extra_info("sockname")[:2]
            try:
                self._server = await asyncio.start_server(self._serve_tcp, host, port)
            except OSError:
                transport.close()
                if attempt + 1 == attempts:
                    raise
                continue
            self._udp = transport
            break
        addr = self._advertise or (host, port)
        name = self._name or f"{addr[0]}:{addr[1]}"
        self._proto = SwimProtocol(
            self.config, name, addr, self._meta, seeds=self._seeds, rng=self._rng
        )
        self._proto.start(loop.time())
        self._pump()

    async def leave(self, timeout: float | None = None) -> None:
        """Announce a graceful leave and let gossip carry it: until the leave has ridden
        as many packets as gossip gives an update (``Protocol.leave_gossiped``), at most
        ``timeout`` (no wait when no other member is alive or suspect: nobody is there
        to tell)."""
        proto = self._require()
        alone = proto.live_count <= 1
        loop = asyncio.get_running_loop()
        proto.leave(loop.time())
        self._pump()
        if alone:
            return
        wait = timeout if timeout is not None else 3 * max(self.config.gossip_interval, self.config.probe_interval / 2)
        deadline = loop.time() + wait
        step = max(0.005, self.config.gossip_interval / 4)
        while not proto.leave_gossiped and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(step, left))

    async def stop(self) -> None:
        """Stop everything (no leave message: call ``leave`` first for that)."""
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._udp is not None:
            self._udp.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for sub in list(self._subscribers):
            sub.close()

    # ------------------------------------------------------------------ queries
    @property
    def local_member(self) -> Member:
        """This member's own record."""
        return self._require().local_member

    @property
    def address(self) -> Address:
        """The address other members use to reach us."""
        return self._require().addr

    @property
    def stats(self) -> ProtocolStats:
        """Protocol counters (packets, bytes, auth failures, suspicions...)."""
        return self._require().stats

    @property
    def health_score(self) -> int:
        """Lifeguard local health score (0 = healthy)."""
        return self._require().health_score

    def members(self, *, include_dead: bool = False) -> list[Member]:
        """Known members: alive and suspect ones (plus dead and left ones if asked)."""
        members = self._require().members()
        return members if include_dead else [m for m in members if m.is_live]

    def update_metadata(self, meta: Mapping[str, str] | None = None, **fields: str) -> None:
        """Replace our metadata (role, addresses, GPU digest, version...) and disseminate it."""
        merged = dict(meta or {})
        merged.update(fields)
        proto = self._require()
        proto.update_meta(merged, asyncio.get_running_loop().time())
        self._pump()

    def subscribe(self, maxsize: int = 1024) -> Subscription:
        """A new stream of membership events, from now on."""
        sub = Subscription(self, maxsize)
        self._subscribers.add(sub)
        return sub

    # ------------------------------------------------------------------ plumbing
    def _require(self) -> SwimProtocol:
        if self._proto is None:
            raise RuntimeError("membership not started")
        return self._proto

    def _on_datagram(self, data: bytes, addr: Address) -> None:
        if self._proto is None or self._stopped:
            return
        self._proto.handle_packet(addr, data, asyncio.get_running_loop().time())
        self._pump()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._proto is None or self._stopped:
            return
        self._proto.tick(asyncio.get_running_loop().time())
        self._pump()

    def _pump(self) -> None:
        """Send what the protocol produced, publish events, re-arm the timer."""
        proto = self._proto
        if proto is None or self._stopped:
            return
        out = proto.take_output()
        udp = self._udp
        if udp is not None:
            for addr, data in out.packets:
                udp.sendto(data, addr)
        for addr, join in out.syncs:
            if len(self._tasks) < _MAX_SYNCS:
                task = asyncio.get_running_loop().create_task(self._sync(addr, join))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        for event in out.events:
            for sub in list(self._subscribers):
                sub._offer(event)
        deadline = proto.next_deadline()
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)

    async def _sync(self, addr: Address, join: bool) -> None:
        """Push-pull with ``addr`` over TCP."""
        proto = self._require()
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.config.tcp_timeout):
                reader, writer = await asyncio.open_connection(addr[0], addr[1])
                await _write_frame(writer, proto.push_pull_payload(join))
                reply = await _read_frame(reader)
            proto.merge_push_pull(reply, asyncio.get_running_loop().time())
            self._pump()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            self.syncs_failed += 1
            log.debug("push-pull with %s:%s failed: %s", addr[0], addr[1], exc)
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer a peer's push-pull: send our state, merge theirs."""
        proto = self._proto
        try:
            if proto is None or self._stopped:
                return
            async with asyncio.timeout(self.config.tcp_timeout):
                data = await _read_frame(reader)
                await _write_frame(writer, proto.push_pull_payload(False))
            proto.merge_push_pull(data, asyncio.get_running_loop().time())
            self._pump()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            log.debug("push-pull from a peer failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _write_frame(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(_FRAME.pack(len(data)) + data)
    await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    if size > MAX_FRAME:
        raise ValueError(f"push-pull frame of {size} bytes exceeds the {MAX_FRAME}-byte limit")
    return await reader.readexactly(size)
