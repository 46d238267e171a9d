"""Server streams pulled from another worker (``accord/node/forwardstream.py``) over a
real forwarding socket: responses in order, the owner's status ending the call, the
owner's call ended when the client goes away, and bad polls refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest

from accord.node.forward import ForwardClient, ForwardedError, ForwardServer
from accord.node.forwardgrpc import ForwardedContext
from accord.node.forwardstream import STREAM_POLL, StreamOwner, StreamPuller

COUNT = "/test.Stream/Count"
FAIL = "/test.Stream/Fail"
FOREVER = "/test.Stream/Forever"


class Owner:
    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def count(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield b"%d" % i

    async def fail(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"first"
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the owner says no")

    async def forever(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            i = 0
            while True:
                yield b"%d" % i
                i += 1
                await asyncio.sleep(0.01)
        finally:
            self.closed.set()


@dataclass
class Linked:
    owner: Owner
    streams: StreamOwner
    client: ForwardClient


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[Linked]:
    """The owner's streams served on a real forwarding socket, and a client of it."""
    owner = Owner()
    table = {m: grpc.unary_stream_rpc_method_handler(f)
             for m, f in ((COUNT, owner.count), (FAIL, owner.fail), (FOREVER, owner.forever))}
    streams = StreamOwner(table)
    server = ForwardServer(tmp_path / "w0.sock", streams.handlers())
    await server.start()
    client = ForwardClient(tmp_path / "w0.sock")
    try:
        yield Linked(owner, streams, client)
    finally:
        await client.close()
        await server.stop()


async def test_a_pulled_stream_delivers_every_response_in_order_then_ends(
        linked: Linked) -> None:
    puller = StreamPuller(1)
    got = [x async for x in puller.pull(linked.client, COUNT, b"300", ForwardedContext([]))]
    assert got == [b"%d" % i for i in range(300)]  # several polls' worth, in order
    assert len(linked.streams) == 0


async def test_the_owners_status_ends_the_pulled_call(linked: Linked) -> None:
    got = []
    with pytest.raises(ForwardedError) as e:
        async for x in StreamPuller(1).pull(linked.client, FAIL, b"", ForwardedContext([])):
            got.append(x)
    assert got == [b"first"]
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.message == "the owner says no"
    assert len(linked.streams) == 0


async def test_a_client_going_away_ends_the_owners_call(linked: Linked) -> None:
    stream = StreamPuller(1).pull(linked.client, FOREVER, b"", ForwardedContext([]))
    assert [await anext(stream) for _ in range(5)] == [b"%d" % i for i in range(5)]
    assert len(linked.streams) == 1
    await stream.aclose()  # what gRPC does when the client cancels
    async with asyncio.timeout(5):
        await linked.owner.closed.wait()
    assert len(linked.streams) == 0


async def test_bad_polls_are_refused_and_start_nothing(linked: Linked) -> None:
    for body, code in (
            (["s.1", None, 8], grpc.StatusCode.NOT_FOUND),  # no such stream, no opening
            (["s.2", ["/test.Stream/Nope", b"", []], 8], grpc.StatusCode.UNIMPLEMENTED),
            (["s.3", ["x"], 8], grpc.StatusCode.INVALID_ARGUMENT),
            ([1, 2], grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(ForwardedError) as e:
            await linked.client.call(STREAM_POLL, msgpack.packb(body), 5.0)
        assert e.value.code == code, body
    assert len(linked.streams) == 0
