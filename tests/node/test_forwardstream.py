"""Server streams pulled from another worker (``accord/node/forwardstream.py``) over a
real forwarding socket: responses in order, the owner's status ending the call, the
owner's call ended when the client goes away, and bad polls refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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


async def linked(tmp_path: Path) -> tuple[Owner, StreamOwner, ForwardServer, ForwardClient]:
    owner = Owner()
    table = {m: grpc.unary_stream_rpc_method_handler(f)
             for m, f in ((COUNT, owner.count), (FAIL, owner.fail), (FOREVER, owner.forever))}
    streams = StreamOwner(table)
    server = ForwardServer(tmp_path / "w0.sock", streams.handlers())
    await server.start()
    return owner, streams, server, ForwardClient(tmp_path / "w0.sock")


async def test_a_pulled_stream_delivers_every_response_in_order_then_ends(tmp_path: Path) -> None:
    _owner, streams, server, client = await linked(tmp_path)
    try:
        puller = StreamPuller(1)
        got = [x async for x in puller.pull(client, COUNT, b"300", ForwardedContext([]))]
        assert got == [b"%d" % i for i in range(300)]  # several polls' worth, in order
        assert len(streams) == 0
    finally:
        await client.close()
        await server.stop()


async def test_the_owners_status_ends_the_pulled_call(tmp_path: Path) -> None:
    _owner, streams, server, client = await linked(tmp_path)
    try:
        got = []
        with pytest.raises(ForwardedError) as e:
            async for x in StreamPuller(1).pull(client, FAIL, b"", ForwardedContext([])):
                got.append(x)
        assert got == [b"first"]
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert e.value.message == "the owner says no"
        assert len(streams) == 0
    finally:
        await client.close()
        await server.stop()


async def test_a_client_going_away_ends_the_owners_call(tmp_path: Path) -> None:
    owner, streams, server, client = await linked(tmp_path)
    try:
        stream = StreamPuller(1).pull(client, FOREVER, b"", ForwardedContext([]))
        assert [await anext(stream) for _ in range(5)] == [b"%d" % i for i in range(5)]
        assert len(streams) == 1
        await stream.aclose()  # what gRPC does when the client cancels
        async with asyncio.timeout(5):
            await owner.closed.wait()
        assert len(streams) == 0
    finally:
        await client.close()
        await server.stop()


async def test_bad_polls_are_refused_and_start_nothing(tmp_path: Path) -> None:
    _owner, streams, server, client = await linked(tmp_path)
    try:
        for body, code in (
                (["s.1", None, 8], grpc.StatusCode.NOT_FOUND),  # no such stream, no opening
                (["s.2", ["/test.Stream/Nope", b"", []], 8], grpc.StatusCode.UNIMPLEMENTED),
                (["s.3", ["x"], 8], grpc.StatusCode.INVALID_ARGUMENT),
                ([1, 2], grpc.StatusCode.INVALID_ARGUMENT)):
            with pytest.raises(ForwardedError) as e:
                await client.call(STREAM_POLL, msgpack.packb(body), 5.0)
            assert e.value.code == code, body
        assert len(streams) == 0
    finally:
        await client.close()
        await server.stop()
