"""gRPC server metrics with go-grpc-prometheus' names, and a request id for every call.

:class:`GrpcMetricsInterceptor` sits first in the server's interceptor chain. For each
method it wraps the handler once (cached while the chain returns the same handler) so
that a call counts ``grpc_server_started_total`` when it starts and, when it ends,
``grpc_server_handled_total`` and ``grpc_server_handling_seconds`` under its status
code, with the labels etcd's metrics carry: ``grpc_type`` (``unary``,
``client_stream``, ``server_stream``, ``bidi_stream``), ``grpc_service``,
``grpc_method``, ``grpc_code`` (Go's names: ``OK``, ``InvalidArgument``,
``Unavailable``, ...). The label set is bounded: only registered methods are counted
(an unknown one has no handler), and codes are at most 17.

The counts are plain integers in a per-method record the scrape reads
(:class:`GrpcCollector`); a call pays two ``perf_counter`` reads, a bisect and a few
additions, no lock and no label lookup.

The wrapper also sets ``logs.REQUEST_ID`` for the call's task: the client's
``x-request-id`` metadata when it sent one (up to 64 printable characters), else a
per-server sequence number in hex, so every log line the call causes names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from accord.node.logs import REQUEST_ID
from accord.node.metrics import Buckets, histogram

HANDLING_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""go-grpc-prometheus' buckets (Prometheus' defaults), as etcd exports them."""
REQUEST_ID_KEY = "x-request-id"
MAX_REQUEST_ID = 64


def go_code_name(code: grpc.StatusCode | None) -> str:
    """A status code as Go's ``codes.Code.String()`` spells it (``None`` is ``OK``)."""
    if code is None:
        return "OK"
    name = code.name
    if name == "OK":
        return "OK"
    if name == "CANCELLED":
        return "Canceled"
    return "".join(part.capitalize() for part in name.split("_"))


@dataclass(slots=True)
class MethodStats:
    """One method's counts (one writer: the event loop)."""

    grpc_type: str
    service: str
    method: str
    started: int = 0
    handled: dict[str, int] = field(default_factory=dict)
    seconds: Buckets = field(default_factory=lambda: Buckets(HANDLING_BUCKETS))

    def finish(self, began: float, code: str) -> None:
        """The call ended with ``code`` after ``perf_counter() - began`` seconds."""
        self.seconds.observe(time.perf_counter() - began)
        self.handled[code] = self.handled.get(code, 0) + 1


def _ended_code(exc: BaseException, context: grpc.aio.ServicerContext) -> str:
    """The code a call that raised ``exc`` ended with."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "Canceled"
    code = context.code()
    if code is not None:  # context.abort raised: it set the code
        return go_code_name(code)
    return "Unknown"  # what grpc answers for an exception the servicer let escape


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts every call by method and code; names every call for the logs."""

    def __init__(self) -> None:
        self.methods: dict[str, MethodStats] = {}
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self._seq = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The handler, wrapped so the call is counted and named."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            wrapped = cached[1]
        else:  # the first call, or a handler made for one call (an aborting one)
            wrapped = self._wrap(method, handler)
            self._wrapped[method] = (handler, wrapped)
        self._name_call(handler_call_details.invocation_metadata)
        return wrapped

    def _name_call(self, metadata: Any) -> None:
        rid = ""
        for key, value in metadata or ():
            if key == REQUEST_ID_KEY:
                text = str(value)
                if 0 < len(text) <= MAX_REQUEST_ID and text.isprintable():
                    rid = text
                break
        if not rid:
            self._seq += 1
            rid = f"{self._seq:x}"
        REQUEST_ID.set(rid)

    def _stats(self, method: str, grpc_type: str) -> MethodStats:
        st = self.methods.get(method)
        if st is None:
            service, _, name = method.lstrip("/").rpartition("/")
            st = self.methods[method] = MethodStats(grpc_type, service, name)
        return st

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            st = self._stats(method, "unary")
            return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, st), **kwargs)
        if handler.stream_unary is not None:
            st = self._stats(method, "client_stream")
            return grpc.stream_unary_rpc_method_handler(_unary(handler.stream_unary, st), **kwargs)
        if handler.unary_stream is not None:
            st = self._stats(method, "server_stream")
            return grpc.unary_stream_rpc_method_handler(_streaming(handler.unary_stream, st),
                                                        **kwargs)
        st = self._stats(method, "bidi_stream")
        return grpc.stream_stream_rpc_method_handler(_streaming(handler.stream_stream, st), **kwargs)


def _unary(inner: Callable[[Any, Any], Awaitable[Any]], st: MethodStats) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        st.started += 1
        began = time.perf_counter()
        try:
            response = await inner(request, context)
        except BaseException as e:
            st.finish(began, _ended_code(e, context))
            raise
        st.finish(began, go_code_name(context.code()))
        return response

    return call


def _streaming(inner: Callable[[Any, Any], Any], st: MethodStats) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(inner):
        # A streaming handler that writes with ``context.write`` and returns.
        return _unary(inner, st)

    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        st.started += 1
        began = time.perf_counter()
        try:
            async with contextlib.aclosing(inner(request, context)) as responses:
                async for item in responses:
                    yield item
        except BaseException as e:
            st.finish(began, _ended_code(e, context))
            raise
        st.finish(began, go_code_name(context.code()))

    return call


class GrpcCollector(Collector):
    """The interceptor's counts, and the client API versions etcd clients announce."""

    def __init__(self, interceptor: GrpcMetricsInterceptor,
                 versions: Callable[[], dict[str, int]] | None = None) -> None:
        self._i = interceptor
        self._versions = versions

    def collect(self) -> Iterator[Metric]:
        """grpc_server_started_total, _handled_total, _handling_seconds."""
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        started = CounterMetricFamily("grpc_server_started_total",
                                      "Total number of RPCs started on the server.", labels=labels)
        handled = CounterMetricFamily(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            labels=[*labels, "grpc_code"])
        series = []
        for st in sorted(self._i.methods.values(), key=lambda s: (s.service, s.method)):
            base = [st.grpc_type, st.service, st.method]
            started.add_metric(base, st.started)
            for code, n in sorted(st.handled.items()):
                handled.add_metric([*base, code], n)
            series.append((base, st.seconds))
        yield started
        yield handled
        yield histogram("grpc_server_handling_seconds",
                        "Histogram of response latency (seconds) of gRPC that had been application-"
                        "level handled by the server.", labels=labels, series=series)
        if self._versions is not None:
            fam = CounterMetricFamily("accord_grpc_client_api_version_calls_total",
                                      "Calls by the client-api-version metadata etcd clients send.",
                                      labels=["client_api_version"])
            for version, n in sorted(self._versions().items()):
                fam.add_metric([version], n)
            yield fam
