"""Server-streaming gRPC calls carried to another worker of the node (``docs/workers.md``).

``forward.py`` carries unary calls. A server-streaming call of a service that only one
worker hosts (the scheduler's ``WatchPlacements``, the checkpoints' ``WatchLatest``, the
membership ``Watch``: their groups and SWIM live in worker 0) is carried as a *pull*:

* the worker the client's connection landed on (``forward_server_stream``) polls the
  owner with ``StreamPoll [stream, open, max_items]``; the first poll carries ``open``
  (the method, the serialized request, the call's metadata) and starts the call on the
  owner, whose handler's responses are queued there (at most :data:`QUEUED` ahead of the
  client: the handler waits when the client reads slowly, as a gRPC stream's flow
  control makes it wait);
* each poll waits up to :data:`POLL_WAIT_S` for a response or the end, and answers
  ``[responses, ended, code, details]``: the responses in order, and once the call ended
  its status (``code`` None: OK), which the client's call then ends with;
* ``StreamClose [stream]`` ends the owner's call when the client goes away; a stream
  nobody polled for :data:`ABANDONED_S` (its worker died) is ended at the next open.

Stream names are chosen by the polling worker (a random per-process token and a
counter), so a poll opens its stream with no round of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgpack

from accord.node.forward import ForwardClient, ForwardedError, Handler
from accord.node.forwardgrpc import (
    DEFAULT_TIMEOUT_S,
    ForwardedContext,
    decode_fields,
    forwarded_metadata,
    intercepted,
)
from accord.node.polled import PolledTable

STREAM_POLL = "/accord.worker/StreamPoll"
STREAM_CLOSE = "/accord.worker/StreamClose"
POLL_WAIT_S = 1.0
ABANDONED_S = 30.0
QUEUED = 256
MAX_ITEMS = 64
_END = object()


@dataclass
class _Call:
    task: asyncio.Task[None] | None = None
    queue: asyncio.Queue[Any] = field(default_factory=lambda: asyncio.Queue(QUEUED))
    status: tuple[int | None, str] | None = None


def _end_call(call: _Call) -> None:
    if call.task is not None:
        call.task.cancel()


class StreamOwner:
    """The server-streaming calls this worker serves for the others (see the module
    docstring): ``handlers`` is the method table whose streaming handlers it runs."""

    def __init__(self, handlers: Mapping[str, grpc.RpcMethodHandler],
                 interceptor: Any = None) -> None:
        self._handlers = handlers
        self._interceptor = interceptor
        """The node's ``AuthInterceptor``: a pulled call is checked again here."""
        self._calls: PolledTable[_Call] = PolledTable("forwarded stream", ABANDONED_S,
                                                      _end_call)

    def __len__(self) -> int:
        return len(self._calls)

    def handlers(self) -> dict[str, Handler]:
        """The internal methods this worker's forwarding socket serves for streams."""
        return {STREAM_POLL: self._serve_poll, STREAM_CLOSE: self._serve_close}

    def _open(self, spec: Any) -> _Call:
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str)
                and isinstance(spec[1], bytes) and isinstance(spec[2], list)):
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "a forwarded stream opens with [method, request, metadata]")
        method, raw, metadata = spec
        h = self._handlers.get(method)
        if h is None or h.unary_stream is None:
            raise ForwardedError(grpc.StatusCode.UNIMPLEMENTED,
                                 f"{method} is not a streaming method this worker serves")
        request = h.request_deserializer(raw) if h.request_deserializer else raw
        context = ForwardedContext([(str(k), v) for k, v in metadata])
        call = _Call()
        serialize = h.response_serializer
        interceptor = self._interceptor

        async def pump() -> None:
            try:
                served = await intercepted(interceptor, method, h, context)
                async for response in served.unary_stream(request, context):
                    await call.queue.put(serialize(response) if serialize else response)
                call.status = (None, "")
            except ForwardedError as e:
                call.status = (int(e.code.value[0]), e.message)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the handler failed: the client's call ends UNKNOWN
                call.status = (int(grpc.StatusCode.UNKNOWN.value[0]), str(e))
            await call.queue.put(_END)

        call.task = asyncio.get_running_loop().create_task(pump(), name=f"stream-{method}")
        return call

    async def _serve_poll(self, body: bytes) -> bytes:
        name, spec, max_items = decode_fields(body, 3)
        if not isinstance(name, str) or type(max_items) is not int:
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT, "malformed stream poll")
        call = self._calls.polled(name, spec, self._open)
        items: list[bytes] = []
        ended = False
        with contextlib.suppress(TimeoutError):
            first = await asyncio.wait_for(call.queue.get(), POLL_WAIT_S)
            ended = first is _END
            if not ended:
                items.append(first)
            while not ended and len(items) < max(1, max_items) and not call.queue.empty():
                nxt = call.queue.get_nowait()
                ended = nxt is _END
                if not ended:
                    items.append(nxt)
        self._calls.touch(name)
        code, details = call.status if ended and call.status else (None, "")
        if ended:
            self._calls.forget(name)
        return bytes(msgpack.packb([items, ended, code, details]))

    async def _serve_close(self, body: bytes) -> bytes:
        (name,) = decode_fields(body, 1)
        if isinstance(name, str):
            self._calls.close(name)
        return b""


class StreamPuller:
    """This worker's side: server-streaming calls served by another worker."""

    def __init__(self, index: int) -> None:
        self._token = f"{index}.{secrets.token_hex(6)}"
        self._next = 0

    async def pull(self, client: ForwardClient, method: str, raw: bytes,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """The serialized responses of ``method(raw)`` served by ``client``'s worker; the
        call ends with the owner's status."""
        self._next += 1
        name = f"{self._token}.{self._next}"
        opening: list[Any] | None = [method, raw, forwarded_metadata(context)]
        ended = False
        try:
            while True:
                try:
                    answer = await client.call(
                        STREAM_POLL, msgpack.packb([name, opening, MAX_ITEMS]),
                        POLL_WAIT_S + DEFAULT_TIMEOUT_S)
                except ForwardedError as e:
                    ended = True
                    await context.abort(e.code, e.message)
                opening = None
                items, ended, code, details = msgpack.unpackb(answer)
                for item in items:
                    yield bytes(item)
                if ended:
                    if code is not None:
                        await context.abort(status_code(int(code)), str(details))
                    return
        finally:
            if not ended:  # the client went away: end the owner's call too
                with contextlib.suppress(ForwardedError, OSError):
                    await client.call(STREAM_CLOSE, msgpack.packb([name]), DEFAULT_TIMEOUT_S)


def status_code(value: int) -> grpc.StatusCode:
    """The ``grpc.StatusCode`` whose number is ``value`` (UNKNOWN for none)."""
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN
