"""The Watch servicer's stream protocol in process: progress ordering during a history
replay, periodic progress notifications, half-close, and server shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.kv.limits import Limits
from accord.services.kv.local import LocalBackend
from accord.services.kv.watchstream import WatchStream
from tests.api.conftest import Running, start, stop


def _create(key: bytes, **kw: object) -> rpc_pb2.WatchRequest:
    return rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key, **kw))


async def test_progress_waits_for_history_replay() -> None:
    """A progress response (watch_id -1) promises every later event has a higher revision,
    so it must come after the replay of everything up to its revision."""
    backend = await LocalBackend.open(limits=Limits(watch_buffer_events=1))
    r = await start(backend)
    try:
        first = backend.revision + 1
        for i in range(600):
            await backend.put(rpc_pb2.PutRequest(key=b"h/%03d" % i, value=b"v"))
        last = backend.revision
        done = asyncio.Event()

        async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
            yield _create(b"h/", range_end=b"h0", start_revision=first)
            yield rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())
            await done.wait()

        call = rpc_pb2_grpc.WatchStub(r.channel).Watch(requests(), timeout=20)
        revisions: list[int] = []
        progress_rev = None
        async for resp in call:
            if resp.watch_id == -1:
                progress_rev = resp.header.revision
                break
            revisions.extend(e.kv.mod_revision for e in resp.events)
        assert progress_rev == last
        assert revisions == list(range(first, last + 1))
        done.set()
        call.cancel()
    finally:
        await stop(r)


async def test_periodic_progress_notify_and_half_close() -> None:
    backend = await LocalBackend.open(progress_notify_interval_s=0.1)
    r = await start(backend)
    try:

        async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
            yield _create(b"pn", progress_notify=True)
            # the client half-closes here: the stream must keep serving

        call = rpc_pb2_grpc.WatchStub(r.channel).Watch(requests(), timeout=10)
        assert (await call.read()).created
        notify = await asyncio.wait_for(call.read(), 5)
        assert (notify.watch_id, len(notify.events)) == (0, 0)
        assert notify.header.revision == backend.revision
        await backend.put(rpc_pb2.PutRequest(key=b"pn", value=b"v"))
        while True:
            resp = await asyncio.wait_for(call.read(), 5)
            if resp.events:
                break
        assert resp.events[0].kv.key == b"pn"
        call.cancel()
    finally:
        await stop(r)


async def test_server_stop_ends_watch_streams(running: Running) -> None:
    never = asyncio.Event()

    async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
        yield _create(b"s")
        await never.wait()

    call = rpc_pb2_grpc.WatchStub(running.channel).Watch(requests(), timeout=10)
    assert (await call.read()).created
    assert running.server.watch.open_streams == 1
    await running.server.stop(0.5)
    try:
        end = await asyncio.wait_for(call.read(), 5)
        assert end is grpc.aio.EOF
    except grpc.aio.AioRpcError as e:
        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert running.server.watch.open_streams == 0
    never.set()


async def test_internal_failure_ends_stream_with_internal(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: WatchStream, *args: object) -> list[rpc_pb2.WatchResponse]:
        raise RuntimeError("boom")

    monkeypatch.setattr(WatchStream, "_split", broken)
    never = asyncio.Event()

    async def requests() -> AsyncIterator[rpc_pb2.WatchRequest]:
        yield _create(b"boom")
        await never.wait()

    call = rpc_pb2_grpc.WatchStub(running.channel).Watch(requests(), timeout=10)
    assert (await call.read()).created
    await running.backend.put(rpc_pb2.PutRequest(key=b"boom", value=b"v"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), 5)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError('boom')" in (info.value.details() or "")
    never.set()
