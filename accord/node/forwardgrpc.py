"""gRPC unary calls carried over the forwarding socket between workers (``forward.py``).

The two ends of a forwarded etcd call in a node of several workers (``docs/workers.md``):

* the worker a client's connection landed on calls ``forward_unary`` instead of its own
  servicer when another worker owns the key's shard: the request is serialized with
  the call's metadata (the auth token travels, so the owner checks it as if the call
  had arrived there) and what is left of its deadline, and the owner's status comes
  back as this call's status (``context.abort`` with the owner's code and message);
* the owning worker serves them with ``owner_handlers``: the servicer's own generated
  method handlers (``grpc.unary_unary_rpc_method_handler``), called with a
  ``ForwardedContext`` whose ``abort`` raises the status to carry back.

The envelope inside ``forward.py``'s body is msgpack ``[request, metadata]`` where
``metadata`` is the call's invocation metadata as ``[key, value]`` pairs. Unary calls
are forwarded here; a server stream of worker 0's services is pulled from it
(``forwardstream.py``), and the etcd streams (Watch, LeaseKeepAlive) are a fan-out of
their own (``workerwatch.py``, ``workers.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

import grpc
import msgpack

from accord.node.forward import ForwardClient, ForwardedError, Handler
from accord.services.kv.errors import EtcdError

DEFAULT_TIMEOUT_S = 30.0
"""Deadline for a forwarded call whose caller set none (an etcd client without one)."""


class ForwardedContext:
    """The part of ``grpc.aio.ServicerContext`` a unary servicer uses, for a forwarded call."""

    def __init__(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._metadata = tuple(metadata)
        self._code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The caller's metadata, as the worker it arrived at received it."""
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        """No transport identity: the socket is local; the caller's worker checked TLS."""
        return {}

    def peer(self) -> str:
        """Where the call came from: another worker of this node."""
        return "unix:forwarded"

    def time_remaining(self) -> float | None:
        """No deadline of its own: ``forward.py`` bounds the call."""
        return None

    def code(self) -> grpc.StatusCode | None:
        """The status set with ``set_code``, if any."""
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        """Record a status to send with the response."""
        self._code = code

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with ``code``: raised to ``forward.py``, which carries it back."""
        raise ForwardedError(code, details)


def owner_handlers(handlers: Mapping[str, grpc.RpcMethodHandler]) -> dict[str, Handler]:
    """``forward.py`` handlers for the unary-unary ones of ``handlers`` (method path ->
    generated method handler); the others are not forwarded (they answer UNIMPLEMENTED)."""
    out: dict[str, Handler] = {}
    for method, h in handlers.items():
        if h.unary_unary is None or h.request_streaming or h.response_streaming:
            continue
        out[method] = _serve_with(h.unary_unary, h.request_deserializer, h.response_serializer)
    return out


def _serve_with(fn: Callable[[Any, Any], Any], deserialize: Callable[[bytes], Any] | None,
                serialize: Callable[[Any], bytes] | None) -> Handler:
    async def handle(body: bytes) -> bytes:
        try:
            raw, metadata = msgpack.unpackb(body)
            pairs = [(str(k), v) for k, v in metadata]
        except Exception as exc:
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"undecodable forwarded envelope: {exc}") from None
        request = deserialize(raw) if deserialize is not None else raw
        response = await fn(request, ForwardedContext(pairs))
        return serialize(response) if serialize is not None else bytes(response)
    return handle


async def forward_unary(client: ForwardClient, method: str, request: Any,
                        context: grpc.aio.ServicerContext,
                        deserialize: Callable[[bytes], Any]) -> Any:
    """Serve ``method(request)`` in the worker behind ``client``; the owner's error becomes
    this call's status."""
    metadata = [[k, v] for k, v in (context.invocation_metadata() or ())]
    body = msgpack.packb([request.SerializeToString(), metadata])
    left = context.time_remaining()
    timeout = DEFAULT_TIMEOUT_S if left is None else max(left, 0.001)
    try:
        answer = await client.call(method, body, timeout)
    except ForwardedError as e:
        await context.abort(e.code, e.message)
    return deserialize(answer)


def decode_fields(body: bytes, n: int) -> list[Any]:
    """The body of an internal call between workers: a msgpack list of ``n`` fields
    (anything else is refused with INVALID_ARGUMENT)."""
    try:
        fields = msgpack.unpackb(body)
        if not isinstance(fields, list) or len(fields) != n:
            raise ValueError(body[:40])
        return fields
    except Exception:
        raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"an internal call between workers expected {n} fields") from None


async def carried(call: Awaitable[Any]) -> Any:
    """Await ``call``; an etcd error travels back over the socket as its status."""
    try:
        return await call
    except EtcdError as e:
        raise ForwardedError(e.code, e.message) from None
