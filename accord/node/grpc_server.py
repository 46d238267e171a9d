"""The etcd-compatible gRPC server: every servicer, health, reflection and transport options.

:func:`build_server` assembles a ``grpc.aio`` server around a
:class:`~accord.services.kv.backend.Backend`; :func:`main` runs one with the in-process
:class:`~accord.services.kv.local.LocalBackend`::

    python -m accord.node.grpc_server --listen 127.0.0.1:2379 [--data-dir DIR]

It prints ``listening on HOST:PORT`` and then ``ready`` on stdout once it serves (a port
of 0 picks a free one), and stops cleanly on SIGINT/SIGTERM.

Transport choices (see ETCD_COMPAT.md, "Transport conventions"):

* keepalive: clients may ping every 5 s even without calls and are never struck out
  (``min_ping_interval_without_data_ms=5000``, ``keepalive_permit_without_calls=1``,
  ``max_ping_strikes=0``); with gRPC's defaults idle etcdctl watch connections get
  closed every ~40 s. The server itself pings idle clients every 2 h (etcd's
  ``--grpc-keepalive-interval``) and gives up after 20 s without an answer.
* message sizes: responses are unlimited (``max_send_message_length=-1``) as etcd's; a
  request may be ``max_request_bytes`` (1.5 MiB, etcd's ``--max-request-bytes``) plus
  512 KiB of gRPC overhead before gRPC itself refuses it; between the two, the servicers
  answer etcd's ``InvalidArgument "etcdserver: request is too large"``.
* metadata: ``hasleader: true`` makes any call fail with ``Unavailable "etcdserver: no
  leader"`` while this member knows no leader (etcd's ``WithRequireLeader``);
  ``client-api-version`` is counted per version (:attr:`AccordGrpcServer.client_api_versions`).
* handlers: every service's methods are looked up in one :class:`MethodTable`, never
  registered with grpc.aio one by one (that costs every call ~90 us, see the class).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from accord.locks.servicer import ElectionServicer, LockServicer, add_lock_services
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.auth.guard import AuthGuard, local_guard
from accord.services.auth.interceptor import AuthInterceptor
from accord.services.auth.servicer import AuthServicer
from accord.services.cluster.servicer import ClusterServicer, MaintenanceServicer
from accord.services.kv.backend import Backend
from accord.services.kv.errors import MSG_NO_LEADER
from accord.services.kv.servicer import KVServicer, LeaseServicer
from accord.services.kv.watchstream import WatchServicer, add_watch_servicer

MIB = 1024 * 1024
GRPC_OVERHEAD_BYTES = 512 * 1024
"""Room above ``max_request_bytes`` for gRPC framing, as etcd leaves (``grpcOverheadBytes``)."""

ETCD_SERVICES = ("KV", "Watch", "Lease", "Cluster", "Maintenance", "Auth")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Transport settings of the gRPC server (defaults: etcd's)."""

    max_request_bytes: int = 3 * MIB // 2
    keepalive_min_time_ms: int = 5_000
    """Clients may ping this often (etcd ``--grpc-keepalive-min-time``)."""
    keepalive_time_ms: int = 2 * 3600 * 1000
    """The server pings an idle client this often (etcd ``--grpc-keepalive-interval``)."""
    keepalive_timeout_ms: int = 20_000
    """and closes the connection if the ping is not answered in time."""
    max_concurrent_streams: int = 2**31 - 1
    max_pending_requests: int = 1 << 20
    """Calls gRPC's core may hold for the Python server before refusing more. Its default
    (1,000; hard limit 3,000) cancels calls once about a thousand are in flight, which
    etcd never does; a coordination store serving thousands of clients needs more."""
    share_port: bool = False
    """Bind the client port with ``SO_REUSEPORT``, so that the workers of a node of several
    (``docs/workers.md``) all listen on it and the kernel spreads connections over them.
    Off for a node of one process: a second server on its port is then a mistake, and
    the bind fails."""

    def __post_init__(self) -> None:
        if not isinstance(self.share_port, bool):
            raise ValueError(f"ServerOptions.share_port must be a bool, got {self.share_port!r}")
        for name in self.__slots__:
            if name == "share_port":
                continue
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ServerOptions.{name} must be a positive integer, got {value!r}")

    def channel_args(self) -> list[tuple[str, int]]:
        """The ``grpc.aio.server`` options these settings stand for."""
        return [
            ("grpc.http2.min_ping_interval_without_data_ms", self.keepalive_min_time_ms),
            ("grpc.http2.min_time_between_pings_ms", self.keepalive_min_time_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", self.max_request_bytes + GRPC_OVERHEAD_BYTES),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.so_reuseport", int(self.share_port)),
            ("grpc.server.max_pending_requests", self.max_pending_requests),
            ("grpc.server.max_pending_requests_hard_limit", self.max_pending_requests),
        ]


class MethodTable(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Every registered method's handler in one dict, served as one generic handler.

    The generated ``add_*Servicer_to_server`` functions give each service to the server
    twice: as a generic handler and as *registered* methods. ``grpc.aio`` keeps one
    request task per registered method and, for every call that arrives, waits on all
    of them (``asyncio.wait`` over 78 tasks on a node serving every accord service):
    83-110 us of CPU per call, 15-19% of the whole front end (``bench/frontend.py``;
    ``bench/README.md``, "the registered-method tax"). :func:`generic_only` routes the registered
    methods here instead, so the server keeps one request task and a call's handler is
    one dict lookup (this table is the server's first generic handler)."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.fallback: Callable[[str], grpc.RpcMethodHandler | None] | None = None
        """Asked for a method without a handler (a worker of a node of several refuses
        those by name: ``node/workers.py``); None: the other generic handlers are."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The handler of the call's method, or None (the other generic handlers are asked)."""
        h = self.handlers.get(handler_call_details.method)
        if h is None and self.fallback is not None:
            return self.fallback(handler_call_details.method)
        return h

    def add(self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        """Take ``service_name``'s methods (``add_registered_method_handlers``' arguments)."""
        for name, handler in method_handlers.items():
            self.handlers[f"/{service_name}/{name}"] = handler


def generic_only(server: grpc.aio.Server) -> MethodTable:
    """Make ``server`` serve registered methods through one :class:`MethodTable`.

    Call before any service is added; returns the table."""
    table = MethodTable()
    server.add_generic_rpc_handlers((table,))
    server.add_registered_method_handlers = table.add  # on this instance only
    return table


def _aborting_handler(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> Any:
    """A handler of the same shape as ``handler`` that fails every call with ``code``."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - abort raises; this only makes it an async generator

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)


_KEY_SPACE_SERVICES = ("/etcdserverpb.KV/", "/etcdserverpb.Lease/", "/etcdserverpb.Watch/",
                       "/v3lockpb.Lock/", "/v3electionpb.Election/")
"""Services whose answers depend on the command formats (``Backend.settle_formats``)."""
_SETTLED_BY_THE_CALL = "/etcdserverpb.KV/Range"
"""Settles in the backend, which can tell a serializable read (answered at once)."""


class MetadataInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Honours etcd client metadata: ``hasleader`` and ``client-api-version``; a
    starting member's first key-space calls wait for the command formats to settle."""

    def __init__(self, backend: Backend, versions: Counter[str]) -> None:
        self._backend = backend
        self._versions = versions

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Count the client's API version; refuse leader-requiring calls without a leader."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        version = "unknown"
        require_leader = False
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "client-api-version":
                version = str(value)
            elif key == "hasleader" and value == "true":
                require_leader = True
        if len(self._versions) < 64 or version in self._versions:
            self._versions[version] += 1
        if require_leader and self._backend.header_info().leader == 0:
            return _aborting_handler(handler, grpc.StatusCode.UNAVAILABLE, MSG_NO_LEADER)
        method = handler_call_details.method
        if (not self._backend.formats_settled and method.startswith(_KEY_SPACE_SERVICES)
                and method != _SETTLED_BY_THE_CALL):
            await self._backend.settle_formats()  # a starting member's first calls
        return handler


@dataclass(slots=True)
class AccordGrpcServer:
    """A built (not yet started) server and the pieces tests and the node need."""

    server: grpc.aio.Server
    backend: Backend
    health: health.aio.HealthServicer
    watch: WatchServicer
    auth: AuthGuard
    methods: MethodTable
    """The registered methods of every service added (:func:`generic_only`)."""
    client_api_versions: Counter[str] = field(default_factory=Counter)
    locks: tuple[LockServicer, ElectionServicer] | None = None
    """The v3lock and v3election servicers (their recipes' store can be swapped)."""

    def add_port(self, address: str, credentials: grpc.ServerCredentials | None = None) -> int:
        """Listen on ``address`` (``host:port``; port 0 picks one), over TLS with
        ``credentials`` (else plaintext); returns the port."""
        try:
            if credentials is None:
                port = int(self.server.add_insecure_port(address))
            else:
                port = int(self.server.add_secure_port(address, credentials))
        except RuntimeError as e:  # grpc reports bind failures this way
            raise OSError(f"cannot listen on {address}: address in use or not resolvable") from e
        if port == 0:
            raise OSError(f"cannot listen on {address}: address in use or not resolvable")
        return port

    async def start(self) -> None:
        """Start serving and mark every service SERVING in the health service."""
        await self.server.start()
        for name in ("", *(f"etcdserverpb.{s}" for s in ETCD_SERVICES)):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop: health NOT_SERVING, end watch streams, then close the server."""
        await self.health.enter_graceful_shutdown()
        await self.watch.close()
        await self.server.stop(grace)


def _lease_keys_of(backend: Backend) -> Callable[[int], Awaitable[list[bytes]]]:
    """The keys attached to a lease, as the backend answers LeaseTimeToLive."""

    async def lease_keys(lease_id: int) -> list[bytes]:
        resp = await backend.lease_time_to_live(
            rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id, keys=True))
        return list(resp.keys)

    return lease_keys


CLOCK_METADATA = "accord-clock-us"
"""Initial metadata of every health check's answer: the serving member's wall clock in
microseconds, which the other members' clock guards compare with theirs
(``peerprobe.py``, ``services/kv/clockguard.py``)."""


class ClockedHealth(health.aio.HealthServicer):  # type: ignore[misc]
    """The standard health service, whose answers also say what this member's clock
    reads (:data:`CLOCK_METADATA`), read as late as possible before the answer."""

    def __init__(self, clock_us: Callable[[], int]) -> None:
        super().__init__()
        self._clock_us = clock_us

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.send_initial_metadata(((CLOCK_METADATA, str(self._clock_us())),))
        return await super().Check(request, context)


def build_server(
    backend: Backend,
    options: ServerOptions | None = None,
    *,
    extra_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    outer_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    auth: AuthGuard | None = None,
    clock_us: Callable[[], int] | None = None,
) -> AccordGrpcServer:
    """A ``grpc.aio`` server serving the etcd v3 API from ``backend``, plus health and reflection.

    ``outer_interceptors`` run before etcd's metadata handling (the metrics interceptor,
    which must see the calls it refuses), ``extra_interceptors`` after it. ``auth`` guards
    every call (``accord/services/auth``); without one, an in-process auth store is used
    (auth off until a client enables it; not replicated). ``clock_us`` is the wall clock
    a health check reports to the peers' clock guards (``ClockedHealth``; default the
    system's)."""
    opts = options or ServerOptions()
    versions: Counter[str] = Counter()
    guard = auth or local_guard()
    if guard.lease_keys is None:
        guard.lease_keys = _lease_keys_of(backend)
    server = grpc.aio.server(
        options=opts.channel_args(),
        interceptors=[*outer_interceptors, MetadataInterceptor(backend, versions),
                      AuthInterceptor(guard),
                      *extra_interceptors],
    )
    methods = generic_only(server)
    watch = WatchServicer(backend, max_response_bytes=opts.max_request_bytes, auth=guard)
    servicers: dict[str, object] = {
        "KV": KVServicer(backend),
        "Lease": LeaseServicer(backend),
        "Cluster": ClusterServicer(backend),
        "Maintenance": MaintenanceServicer(backend),
        "Auth": AuthServicer(backend, guard),
    }
    for name, servicer in servicers.items():
        register: Callable[[object, grpc.aio.Server], None] = getattr(
            rpc_pb2_grpc, f"add_{name}Servicer_to_server"
        )
        register(servicer, server)
    add_watch_servicer(watch, server)
    locks = add_lock_services(server, backend)
    health_servicer = ClockedHealth(clock_us or (lambda: time.time_ns() // 1000))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    service_names = [
        *(rpc_pb2.DESCRIPTOR.services_by_name[s].full_name for s in ETCD_SERVICES),
        "v3lockpb.Lock",
        "v3electionpb.Election",
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection.enable_server_reflection(service_names, server)
    return AccordGrpcServer(server, backend, health_servicer, watch, guard, methods, versions,
                            locks)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m accord.node.grpc_server",
        description="Serve the etcd v3 API from a single-process (non-replicated) accord store.",
    )
    p.add_argument("--listen", default="127.0.0.1:2379", help="host:port to serve on (port 0: any)")
    p.add_argument("--data-dir", default=None, help="persist the store here (default: memory only)")
    p.add_argument("--name", default="default", help="member name reported by MemberList")
    p.add_argument(
        "--max-request-bytes", type=int, default=3 * MIB // 2, help="largest request accepted"
    )
    args = p.parse_args(argv)
    host, sep, port = args.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        p.error(f"--listen must be HOST:PORT with PORT in 0..65535, got {args.listen!r}")
    if args.max_request_bytes <= 0:
        p.error(f"--max-request-bytes must be positive, got {args.max_request_bytes}")
    return args


async def serve(args: argparse.Namespace) -> None:
    """Run the local-backend server until SIGINT/SIGTERM."""
    from accord.services.kv.local import LocalBackend

    backend = await LocalBackend.open(
        data_dir=args.data_dir,
        name=args.name,
        client_url=f"http://{args.listen}",
        max_request_bytes=args.max_request_bytes,
    )
    srv = build_server(backend, ServerOptions(max_request_bytes=args.max_request_bytes))
    host = args.listen.rsplit(":", 1)[0]
    try:
        port = srv.add_port(args.listen)
        backend.set_client_urls([f"http://{host}:{port}"])
        await srv.start()
        print(f"listening on {host}:{port}", flush=True)
        print("ready", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await srv.stop(0.5)
        await backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accord.node.grpc_server``."""
    args = _parse_args(argv)
    try:
        asyncio.run(serve(args))
    except OSError as e:
        print(f"accord.node.grpc_server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
