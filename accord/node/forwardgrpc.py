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
from accord.services.auth.guard import FORWARDED_USER, IDENTITY
from accord.services.auth.tokens import AuthInfo
from accord.services.kv.errors import EtcdError

DEFAULT_TIMEOUT_S = 30.0
"""Deadline for a forwarded call whose caller set none (an etcd client without one)."""


FORWARDED_USER_KEY = "accord-forwarded-user"
"""Metadata of a forwarded call naming the user the receiving worker identified (its
token, its certificate's name, or the call a server-side recipe runs for): the owner
takes it as the caller (``ForwardedContext.auth_context``). Removed from a client's own
metadata before forwarding, so a client cannot claim a user this way."""


FORWARDED_INTERNAL_KEY = "accord-forwarded-internal"
"""Metadata of a call a server-side recipe makes for a call already admitted (the v3lock
and v3election recipes' Txns and Ranges, ``workers.RoutedLockStore``): served without
checking the caller again, as the recipe's steps are in a node of one process. Removed
from a client's own metadata before forwarding, as :data:`FORWARDED_USER_KEY` is."""
_RESERVED = (FORWARDED_USER_KEY, FORWARDED_INTERNAL_KEY)


def forwarded_metadata(context: Any) -> list[list[Any]]:
    """The metadata a call forwarded from ``context`` carries: the client's (its token
    travels), less the reserved keys, plus :data:`FORWARDED_USER_KEY` naming the caller
    this worker's auth identified for the call (``auth.guard.IDENTITY``), if any, and
    :data:`FORWARDED_INTERNAL_KEY` for a recipe's own step (``context.internal``)."""
    out = [[k, v] for k, v in (context.invocation_metadata() or ()) if k not in _RESERVED]
    who = IDENTITY.get()
    if isinstance(who, AuthInfo):
        out.append([FORWARDED_USER_KEY, who.user])
    if getattr(context, "internal", False):
        out.append([FORWARDED_INTERNAL_KEY, "1"])
    return out


class ForwardedContext:
    """The part of ``grpc.aio.ServicerContext`` a unary servicer uses, for a forwarded call
    (``internal``: a recipe's own step, see :data:`FORWARDED_INTERNAL_KEY`)."""

    def __init__(self, metadata: Sequence[tuple[str, str | bytes]],
                 internal: bool = False) -> None:
        self._metadata = tuple((k, v) for k, v in metadata if k not in _RESERVED)
        self._user = next((v for k, v in metadata if k == FORWARDED_USER_KEY), None)
        self.internal = internal or any(k == FORWARDED_INTERNAL_KEY for k, _v in metadata)
        self._code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The caller's metadata, as the worker it arrived at received it."""
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        """No transport identity (the socket is local; the caller's worker checked TLS);
        the user that worker identified, under ``auth.guard.FORWARDED_USER``."""
        if self._user is None:
            return {}
        user = self._user if isinstance(self._user, bytes) else str(self._user).encode()
        return {FORWARDED_USER: [user]}

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


class _Details:
    """``grpc.HandlerCallDetails`` of a forwarded call, for the owner's interceptor."""

    def __init__(self, method: str, metadata: tuple[tuple[str, Any], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


def owner_handlers(handlers: Mapping[str, grpc.RpcMethodHandler],
                   interceptor: Any = None) -> dict[str, Handler]:
    """``forward.py`` handlers for the unary-unary ones of ``handlers`` (method path ->
    generated method handler); the others are not forwarded (they answer UNIMPLEMENTED).
    With ``interceptor`` (the node's ``AuthInterceptor``), each call goes through it as a
    call arriving here would: the owner checks the caller again."""
    out: dict[str, Handler] = {}
    for method, h in handlers.items():
        if h.unary_unary is None or h.request_streaming or h.response_streaming:
            continue
        out[method] = _serve_with(method, h, interceptor)
    return out


async def intercepted(interceptor: Any, method: str, h: grpc.RpcMethodHandler,
                      context: ForwardedContext) -> grpc.RpcMethodHandler:
    """``h`` as ``interceptor`` (if any) wraps it for a call of ``method`` in ``context``
    (a recipe's own step, admitted with the call it serves, is not wrapped)."""
    if interceptor is None or context.internal:
        return h

    async def same(_details: Any) -> grpc.RpcMethodHandler:
        return h
    wrapped: grpc.RpcMethodHandler = await interceptor.intercept_service(
        same, _Details(method, context.invocation_metadata()))
    return wrapped


def _serve_with(method: str, h: grpc.RpcMethodHandler, interceptor: Any) -> Handler:
    deserialize, serialize = h.request_deserializer, h.response_serializer

    async def handle(body: bytes) -> bytes:
        try:
            raw, metadata = msgpack.unpackb(body)
            pairs = [(str(k), v) for k, v in metadata]
        except Exception as exc:
            raise ForwardedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"undecodable forwarded envelope: {exc}") from None
        request = deserialize(raw) if deserialize is not None else raw
        context = ForwardedContext(pairs)
        served = await intercepted(interceptor, method, h, context)
        response = await served.unary_unary(request, context)
        return serialize(response) if serialize is not None else bytes(response)
    return handle


async def forward_unary(client: ForwardClient, method: str, request: Any,
                        context: grpc.aio.ServicerContext,
                        deserialize: Callable[[bytes], Any]) -> Any:
    """Serve ``method(request)`` in the worker behind ``client``; the owner's error becomes
    this call's status."""
    body = msgpack.packb([request.SerializeToString(), forwarded_metadata(context)])
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
