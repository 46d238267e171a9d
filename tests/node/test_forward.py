"""The forwarding socket between a node's workers (accord/node/forward.py), on real Unix sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest

from accord.node import forward
from accord.node.forward import ForwardClient, ForwardedError, ForwardServer
from accord.raft.transport.framing import frame


class Owner:
    """Handlers of a pretend owning worker: echo, slow echo, errors, a call that hangs."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancelled = 0

    async def echo(self, body: bytes) -> bytes:
        return b"echo:" + body

    async def slow(self, body: bytes) -> bytes:
        # Answers later for larger numbers: calls complete out of order.
        await asyncio.sleep(int(body) * 0.01)
        return body

    async def refuse(self, body: bytes) -> bytes:
        raise ForwardedError(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: " + body.decode())

    async def crash(self, body: bytes) -> bytes:
        raise KeyError(body)

    async def hang(self, body: bytes) -> bytes:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return body

    def handlers(self) -> dict[str, forward.Handler]:
        return {"/t/echo": self.echo, "/t/slow": self.slow, "/t/refuse": self.refuse,
                "/t/crash": self.crash, "/t/hang": self.hang}


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "worker-1.sock"


@pytest.fixture
async def owner(sock: Path) -> AsyncIterator[tuple[Owner, ForwardServer]]:
    o = Owner()
    server = ForwardServer(sock, o.handlers())
    await server.start()
    yield o, server
    await server.stop()


async def test_answers_come_back_to_their_callers_out_of_order(owner: Any, sock: Path) -> None:
    client = ForwardClient(sock)
    try:
        assert await client.call("/t/echo", b"k", 5) == b"echo:k"
        bodies = [str(n).encode() for n in (9, 1, 7, 3, 5, 0, 8, 2, 6, 4)]
        got = await asyncio.gather(*(client.call("/t/slow", b, 5) for b in bodies))
        assert got == bodies
    finally:
        await client.close()


class FifoClient(ForwardClient):
    """Broken variant: hands each answer to the oldest waiting caller, ignoring call ids
    (right only while the owner answers in request order)."""

    def _on_answer(self, payload: bytes) -> None:
        _, code, result = msgpack.unpackb(payload)
        oldest = min(self._pending) if self._pending else None
        self._settle(self._pending.pop(oldest) if oldest is not None else None, code, result)


async def test_broken_variant_matching_by_order_is_caught(owner: Any, sock: Path) -> None:
    client = FifoClient(sock)
    try:
        bodies = [str(n).encode() for n in (9, 1, 7, 3, 5, 0, 8, 2, 6, 4)]
        got = await asyncio.gather(*(client.call("/t/slow", b, 5) for b in bodies))
        assert got != bodies
    finally:
        await client.close()


async def test_owner_errors_carry_their_status(owner: Any, sock: Path) -> None:
    client = ForwardClient(sock)
    try:
        with pytest.raises(ForwardedError) as exc:
            await client.call("/t/refuse", b"requested lease not found", 5)
        assert exc.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert exc.value.message == "etcdserver: requested lease not found"
        with pytest.raises(ForwardedError) as exc:
            await client.call("/t/crash", b"x", 5)
        assert exc.value.code == grpc.StatusCode.INTERNAL and "KeyError" in exc.value.message
        with pytest.raises(ForwardedError) as exc:
            await client.call("/t/nope", b"x", 5)
        assert exc.value.code == grpc.StatusCode.UNIMPLEMENTED and "/t/nope" in exc.value.message
        assert await client.call("/t/echo", b"still", 5) == b"echo:still"
    finally:
        await client.close()


async def test_deadline_ends_the_call_on_both_sides(owner: Any, sock: Path) -> None:
    o, _ = owner
    client = ForwardClient(sock)
    try:
        with pytest.raises(ForwardedError) as exc:
            await client.call("/t/hang", b"x", 0.2)
        assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(200):
            if o.cancelled:
                break
            await asyncio.sleep(0.01)
        assert o.cancelled == 1
        assert await client.call("/t/echo", b"after", 5) == b"echo:after"
    finally:
        await client.close()


async def test_owner_gone_fails_calls_in_flight_and_redials(tmp_path: Path, sock: Path) -> None:
    o = Owner()
    server = ForwardServer(sock, o.handlers())
    await server.start()
    client = ForwardClient(sock)
    try:
        pending = asyncio.ensure_future(client.call("/t/hang", b"x", 30))
        await asyncio.sleep(0.05)
        await server.stop()
        with pytest.raises(ForwardedError) as exc:
            await pending
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(ForwardedError) as exc:
            await client.call("/t/echo", b"x", 1)
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE and sock.name in exc.value.message
        # The owner comes back (a restarted worker): the next call dials again.
        server = ForwardServer(sock, o.handlers())
        await server.start()
        assert await client.call("/t/echo", b"back", 5) == b"echo:back"
    finally:
        await client.close()
        await server.stop()


async def test_bad_requests_are_refused_and_garbage_closes_only_its_connection(
        owner: Any, sock: Path) -> None:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        writer.write(frame(msgpack.packb([99, 1, "/t/echo", b"x", 1.0])))
        writer.write(frame(msgpack.packb([forward.FORWARD_VERSION, 2, "/t/echo", "str", 1.0])))
        answers = []
        for _ in range(2):
            n = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 5), "big")
            answers.append(msgpack.unpackb(await reader.readexactly(n)))
        codes = {a[0]: a[1] for a in answers}
        assert codes == {1: grpc.StatusCode.FAILED_PRECONDITION.value[0],
                         2: grpc.StatusCode.INVALID_ARGUMENT.value[0]}
        writer.write(frame(b"\xc1 not msgpack"))
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    client = ForwardClient(sock)
    try:
        assert await client.call("/t/echo", b"ok", 5) == b"echo:ok"
    finally:
        await client.close()


async def _first_call_written_before_the_accept_runs(sock: Path, broken: bool) -> bytes | None:
    """A client connects and writes its first call before the owner's connection task
    has attached its receiver (on a busy loop, or uvloop's order of callbacks, the bytes
    are then already in the stream's buffer): its answer, or None if none came."""
    o = Owner()
    server = ForwardServer(sock, o.handlers())
    server.broken_drop_early_calls = broken
    arrived = asyncio.Event()

    async def late_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await arrived.wait()
        while not getattr(reader, "_buffer", b""):  # the call is read into the stream first
            await asyncio.sleep(0.001)
        await server._serve(reader, writer)

    listener = await asyncio.start_unix_server(late_accept, path=str(sock))
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        writer.write(frame(msgpack.packb([forward.FORWARD_VERSION, 1, "/t/echo", b"a", 5.0])))
        await writer.drain()
        arrived.set()
        try:
            head = await asyncio.wait_for(reader.readexactly(4), 2)
        except TimeoutError:
            return None
        answer = msgpack.unpackb(await reader.readexactly(int.from_bytes(head, "big")))
        return bytes(answer[2])
    finally:
        writer.close()
        listener.close()
        await listener.wait_closed()


async def test_a_call_written_before_the_connection_is_accepted_is_answered(sock: Path) -> None:
    # Found on daemons: a worker > 0 asks worker 0 for the meta state the moment it has
    # connected, and that first call went unanswered for its whole timeout (15 s).
    assert await _first_call_written_before_the_accept_runs(sock, broken=False) == b"echo:a"


async def test_the_broken_variant_that_loses_early_calls_is_caught(sock: Path) -> None:
    assert await _first_call_written_before_the_accept_runs(sock, broken=True) is None
