"""Calls handed between a node's worker processes over a local Unix socket.

A node of several workers (``docs/workers.md``) serves a client call in the worker the
kernel gave the connection to; when another worker owns the key's shard, the call is
forwarded to that worker over its forwarding socket, served there exactly as if it had
arrived there (proposed or ReadIndex-read by the owner's replica), and the answer is
sent back. The hop is before Raft, so it changes nothing of the Raft protocol.

The wire is the peer links' framing (``raft/transport/framing.py``: a 4-byte length and
a payload) with msgpack payloads:

* request: ``[FORWARD_VERSION, call_id, method, body, timeout_s]`` -- ``method`` names
  the call (a gRPC method path), ``body`` is its serialized request, ``timeout_s`` what
  is left of the caller's deadline;
* answer: ``[call_id, code, payload]`` -- ``code`` 0 with the serialized response, or a
  gRPC status code's number with the error message.

Calls on one connection are pipelined: the server serves each in a task of its own and
answers in completion order, the client matches answers to callers by ``call_id``. A
caller whose deadline passes gets DEADLINE_EXCEEDED and the owner cancels the call; a
connection that ends fails every call on it with UNAVAILABLE (the call may or may not
have been applied, as with any lost connection), and the next call dials again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import msgpack

from accord.raft.transport.framing import (
    FrameError,
    FrameReceiver,
    close_writer,
    frame,
    take_buffered,
    within,
)

log = logging.getLogger(__name__)

FORWARD_VERSION = 1
"""Version of the request layout; a server refuses any other with FAILED_PRECONDITION."""

MAX_FRAME = 4 << 20
"""Largest frame either side accepts: a request's limit (1.5 MiB) and a range's answer
fit; a bigger one is a bug, and closes the connection."""

IDLE_S = 3600.0
"""A connection without a byte for this long is closed (a live pair reconnects at once)."""

DIAL_S = 2.0
"""Deadline for connecting to a worker's socket."""

Handler = Callable[[bytes], Awaitable[bytes]]
"""Serves one forwarded call: the serialized request in, the serialized response out;
raises ``ForwardedError`` for an error to carry back."""

_CODES: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


class ForwardedError(Exception):
    """A call's error as a gRPC status: raised by handlers, re-raised at the caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _status_of(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, ForwardedError):
        return exc.code.value[0], exc.message
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "deadline exceeded in the owning worker"
    return grpc.StatusCode.INTERNAL.value[0], f"{type(exc).__name__}: {exc}"


class ForwardServer:
    """Serves forwarded calls on a Unix socket with ``handlers`` (method -> handler)."""

    def __init__(self, path: Path, handlers: Mapping[str, Handler]) -> None:
        self.path = path
        self._handlers = dict(handlers)
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.broken_drop_early_calls = False
        """A deliberately broken variant for tests: bytes a client wrote before the
        connection's receiver was attached are left in the stream's buffer (the first
        call of a connection is lost). Never set outside tests."""

    async def start(self) -> None:
        """Listen (a stale socket file of a dead worker is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._accepted, path=str(self.path),
                                                       limit=MAX_FRAME)

    async def stop(self) -> None:
        """Stop listening, end every connection and the calls in flight on them."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # ``stop`` ends the connection: return normally, since asyncio's stream callback
            # asks this task for its exception and logs a cancelled one as an error.
            pass
        finally:
            self._conns.discard(task)
            close_writer(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        calls: set[asyncio.Task[None]] = set()

        def answer(call_id: int, code: int, payload: Any) -> None:
            if not writer.is_closing():
                writer.write(frame(msgpack.packb([call_id, code, payload])))

        async def run(call_id: int, handler: Handler, body: bytes, timeout_s: float) -> None:
            try:
                result = await within(handler(body), timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                answer(call_id, *_status_of(exc))
            else:
                answer(call_id, 0, result)

        def on_frame(payload: bytes) -> None:
            try:
                req = msgpack.unpackb(payload)
                version, call_id, method, body, timeout_s = req
            except Exception as exc:
                raise FrameError(f"undecodable forwarded request: {exc}") from None
            if type(call_id) is not int:
                raise FrameError(f"forwarded request with call id {call_id!r:.20}")
            if version != FORWARD_VERSION:
                answer(call_id, grpc.StatusCode.FAILED_PRECONDITION.value[0],
                       f"forwarding protocol version {version!r:.20} (this worker speaks "
                       f"{FORWARD_VERSION}): the node's workers run different versions")
                return
            handler = self._handlers.get(method) if isinstance(method, str) else None
            if handler is None:
                answer(call_id, grpc.StatusCode.UNIMPLEMENTED.value[0],
                       f"method {method!r:.80} is not forwarded between workers")
                return
            if type(body) is not bytes or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
                answer(call_id, grpc.StatusCode.INVALID_ARGUMENT.value[0],
                       "a forwarded request needs a bytes body and a positive timeout")
                return
            task = asyncio.ensure_future(run(call_id, handler, body, float(timeout_s)))
            calls.add(task)
            task.add_done_callback(calls.discard)

        receiver = FrameReceiver(on_frame, MAX_FRAME, IDLE_S)
        # A client writes its first call as soon as it is connected: bytes that arrived
        # before this task ran sit in the stream's buffer and must go to the receiver
        # (left there, the first call of every connection was lost and timed out).
        if self.broken_drop_early_calls:
            receiver.attach(writer.transport)
        else:
            receiver.attach(writer.transport, take_buffered(reader), eof=reader.at_eof())
        try:
            await receiver.closed()
        except (EOFError, OSError, TimeoutError):
            pass
        except FrameError as exc:
            log.warning("forwarding connection on %s closed: %s", self.path, exc)
        finally:
            for task in list(calls):
                task.cancel()
            for task in list(calls):
                with contextlib.suppress(asyncio.CancelledError):
                    await task


class ForwardClient:
    """Forwards calls to the worker listening on ``path`` over one pipelined connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._dialing: asyncio.Lock = asyncio.Lock()

    async def call(self, method: str, body: bytes, timeout_s: float) -> bytes:
        """The owner's response to ``method(body)``; raises ``ForwardedError`` with the
        owner's status, UNAVAILABLE when the connection fails, DEADLINE_EXCEEDED when
        ``timeout_s`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                writer = await self._connected()
                call_id = next(self._ids)
                fut: asyncio.Future[bytes] = loop.create_future()
                self._pending[call_id] = fut
                try:
                    left = max(deadline - loop.time(), 0.001)
                    writer.write(frame(msgpack.packb([FORWARD_VERSION, call_id, method, body, left])))
                    return await fut
                finally:
                    self._pending.pop(call_id, None)
        except TimeoutError:
            raise ForwardedError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"forwarded {method} got no answer within {timeout_s:.3g}s") from None

    async def close(self) -> None:
        """Close the connection; calls in flight fail with UNAVAILABLE."""
        close_writer(self._writer)
        task, self._reader_task = self._reader_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all("the forwarding client closed")

    async def _connected(self) -> asyncio.StreamWriter:
        async with self._dialing:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                _reader, writer = await within(asyncio.open_unix_connection(str(self.path)), DIAL_S)
            except (OSError, TimeoutError) as exc:
                raise ForwardedError(grpc.StatusCode.UNAVAILABLE,
                                     f"the owning worker's socket {self.path.name} is not "
                                     f"answering: {exc or type(exc).__name__}") from None
            receiver = FrameReceiver(self._on_answer, MAX_FRAME, IDLE_S)
            receiver.attach(writer.transport)
            self._writer = writer
            self._reader_task = asyncio.ensure_future(self._watch(receiver, writer))
            return writer

    async def _watch(self, receiver: FrameReceiver, writer: asyncio.StreamWriter) -> None:
        why = "the owning worker closed the forwarding connection"
        try:
            await receiver.closed()
        except (EOFError, OSError, TimeoutError, FrameError) as exc:
            if not isinstance(exc, EOFError):
                why = f"the forwarding connection failed: {exc}"
        finally:
            close_writer(writer)
            if self._writer is writer:
                self._writer = None
                self._fail_all(why)

    def _fail_all(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ForwardedError(grpc.StatusCode.UNAVAILABLE, why))

    def _on_answer(self, payload: bytes) -> None:
        try:
            call_id, code, result = msgpack.unpackb(payload)
        except Exception as exc:
            raise FrameError(f"undecodable forwarded answer: {exc}") from None
        self._settle(self._pending.pop(call_id, None), code, result)

    @staticmethod
    def _settle(fut: asyncio.Future[bytes] | None, code: Any, result: Any) -> None:
        if fut is None or fut.done():
            return  # the caller gave up (deadline) before the answer came
        if code == 0 and type(result) is bytes:
            fut.set_result(result)
        else:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN) if type(code) is int else grpc.StatusCode.UNKNOWN
            fut.set_exception(ForwardedError(status, str(result)))
