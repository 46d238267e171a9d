"""The metrics pieces on their own: histogram buckets, log lines, gRPC call counting, config."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from accord.node import logs
from accord.node.config import Config, ConfigError, load_config
from accord.node.grpcmetrics import GrpcCollector, GrpcMetricsInterceptor, go_code_name
from accord.node.metrics import Buckets, exposition, histogram


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``registry`` as parsed back from its text exposition."""
    text, _ = exposition(registry, "")
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# ----------------------------------------------------------------------------- buckets
def test_buckets_are_cumulative_and_count_every_observation() -> None:
    b = Buckets((0.1, 1.0, 10.0))
    for v in (0.05, 0.1, 0.5, 2.0, 50.0):
        b.observe(v)
    assert b.cumulative() == [("0.1", 2), ("1.0", 3), ("10.0", 4), ("+Inf", 5)]
    assert b.count == 5
    assert b.total == pytest.approx(52.65)


def test_buckets_refuse_unordered_bounds() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Buckets((1.0, 0.5))
    with pytest.raises(ValueError):
        Buckets(())


def test_histogram_family_round_trips_through_the_exposition() -> None:
    b = Buckets((0.5, 1.0))
    b.observe(0.7)

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            yield histogram("x_seconds", "x", ["To"], [(("a1",), b)])

    reg = CollectorRegistry()
    reg.register(One())  # type: ignore[arg-type]
    got = samples(reg)
    assert got[("x_seconds_bucket", (("To", "a1"), ("le", "0.5")))] == 0
    assert got[("x_seconds_bucket", (("To", "a1"), ("le", "1.0")))] == 1
    assert got[("x_seconds_count", (("To", "a1"),))] == 1


# ----------------------------------------------------------------------------- logs
def _logger(fmt: str) -> tuple[logging.Logger, io.StringIO, logs.LogContext]:
    out = io.StringIO()
    ctx = logs.LogContext()
    handler = logging.StreamHandler(out)
    handler.addFilter(ctx)
    handler.setFormatter(logs.JsonFormatter(ctx) if fmt == "json" else logs.ConsoleFormatter(ctx))
    lg = logging.getLogger(f"accord.test.{fmt}")
    lg.handlers = [handler]
    lg.propagate = False
    lg.setLevel(logging.DEBUG)
    return lg, out, ctx


def test_json_lines_carry_node_group_and_request_ids() -> None:
    lg, out, ctx = _logger("json")
    ctx.set_node("n1", 0xABC)
    token = logs.REQUEST_ID.set("7f")
    try:
        lg.info("applied %d entries", 3, extra={"group": 101})
    finally:
        logs.REQUEST_ID.reset(token)
    lg.warning("no ids here")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["msg"] == "applied 3 entries"
    assert (first["level"], first["node"], first["member"], first["group"], first["request"]) == (
        "info", "n1", "abc", 101, "7f")
    assert first["ts"].endswith("Z") and first["logger"] == "accord.test.json"
    assert second["level"] == "warn" and "group" not in second and "request" not in second


def test_json_line_holds_a_traceback_in_one_line() -> None:
    lg, out, _ = _logger("json")
    try:
        raise RuntimeError("disk on fire")
    except RuntimeError:
        lg.exception("fsync failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert "RuntimeError: disk on fire" in json.loads(lines[0])["error"]


def test_console_line_is_readable() -> None:
    lg, out, ctx = _logger("console")
    ctx.set_node("n2", 0x10)
    lg.error("link down", extra={"group": 3})
    line = out.getvalue().strip()
    assert " ERROR accord.test.console [n2 10] group=3: link down" in line


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_secrets_never_reach_a_line(fmt: str) -> None:
    secret = "00112233445566778899aabbccddeeff"
    lg, out, ctx = _logger(fmt)
    ctx.redact([secret, ""])
    lg.info("keyring %s loaded", secret)
    try:
        raise ValueError(f"bad key {secret}")
    except ValueError:
        lg.exception("oops")
    text = out.getvalue()
    assert secret not in text
    assert logs.REDACTED in text


def test_default_format_follows_the_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert logs.default_format(Tty()) == "console"
    assert logs.default_format(io.StringIO()) == "json"


def test_bad_log_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="log-level 'loud'"):
        logs.level_number("loud")
    with pytest.raises(ValueError, match="log-format 'xml'"):
        logs.configure("xml", "info", stream=io.StringIO())
    with pytest.raises(ConfigError, match="log-format 'xml'"):
        load_config(["--log-format", "xml"], {})


# ----------------------------------------------------------------------------- config
def test_metrics_listener_defaults_to_client_port_plus_1000() -> None:
    cfg = load_config(["--listen-client-urls", "http://127.0.0.1:2479"], {})
    assert cfg.metrics_listen_addresses() == [("127.0.0.1", 3479)]
    cfg = load_config(["--listen-metrics-urls", "http://127.0.0.1:9100,http://127.0.0.1:9101"], {})
    assert cfg.metrics_listen_addresses() == [("127.0.0.1", 9100), ("127.0.0.1", 9101)]
    tls = Config(listen_client_urls=["https://127.0.0.1:2479"]).resolved()
    assert tls.metrics_urls() == ["https://127.0.0.1:3479"]  # clients get TLS: so do metrics
    off = load_config(["--listen-metrics-urls", "off"], {})
    assert not off.metrics_enabled and off.metrics_listen_addresses() == []


def test_bad_metrics_urls_are_refused() -> None:
    with pytest.raises(ConfigError, match="listen-metrics-urls"):
        load_config(["--listen-metrics-urls", "127.0.0.1:9100"], {})
    with pytest.raises(ConfigError, match="'off' cannot be combined"):
        load_config(["--listen-metrics-urls", "off,http://127.0.0.1:9100"], {})
    with pytest.raises(ConfigError, match="above 65535"):
        Config(listen_client_urls=["http://127.0.0.1:65000"]).resolved().validate()


# ----------------------------------------------------------------------------- grpc
def test_go_code_names() -> None:
    assert go_code_name(None) == "OK"
    assert go_code_name(grpc.StatusCode.OK) == "OK"
    assert go_code_name(grpc.StatusCode.CANCELLED) == "Canceled"
    assert go_code_name(grpc.StatusCode.INVALID_ARGUMENT) == "InvalidArgument"
    assert go_code_name(grpc.StatusCode.UNAVAILABLE) == "Unavailable"


class _Health(health_pb2_grpc.HealthServicer):
    """Answers, aborts or fails depending on the service name; records request ids."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        self.request_ids.append(logs.REQUEST_ID.get())
        if request.service == "abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad service")
        if request.service == "boom":
            raise RuntimeError("servicer bug")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        for _ in range(3):
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        if request.service == "abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, "gone")


async def test_interceptor_counts_calls_by_method_and_code() -> None:
    interceptor = GrpcMetricsInterceptor()
    servicer = _Health()
    server = grpc.aio.server(interceptors=[interceptor])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for _ in range(3):
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=5,
                             metadata=(("x-request-id", "req-42"),))
            for svc, code in (("abort", grpc.StatusCode.INVALID_ARGUMENT),
                              ("boom", grpc.StatusCode.UNKNOWN)):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5)
                assert err.value.code() == code
            got = [r async for r in stub.Watch(health_pb2.HealthCheckRequest(), timeout=5)]
            assert len(got) == 3
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in stub.Watch(health_pb2.HealthCheckRequest(service="abort"), timeout=5):
                    pass
    finally:
        await server.stop(0)
    await asyncio.sleep(0)
    reg = CollectorRegistry()
    reg.register(GrpcCollector(interceptor, lambda: {"3.5": 2}))
    s = samples(reg)
    check = (("grpc_method", "Check"), ("grpc_service", "grpc.health.v1.Health"),
             ("grpc_type", "unary"))
    watch = (("grpc_method", "Watch"), ("grpc_service", "grpc.health.v1.Health"),
             ("grpc_type", "server_stream"))

    def handled(base: tuple[tuple[str, str], ...], code: str) -> float:
        return s[("grpc_server_handled_total", tuple(sorted((*base, ("grpc_code", code)))))]

    assert s[("grpc_server_started_total", check)] == 6
    assert handled(check, "OK") == 4
    assert handled(check, "InvalidArgument") == 1
    assert handled(check, "Unknown") == 1
    assert s[("grpc_server_handling_seconds_count", check)] == 6
    assert handled(watch, "OK") == 1
    assert handled(watch, "NotFound") == 1
    assert s[("accord_grpc_client_api_version_calls_total", (("client_api_version", "3.5"),))] == 2
    # every call got an id; the client's own when it sent one; no two alike
    assert "req-42" in servicer.request_ids
    assert len(set(servicer.request_ids)) == len(servicer.request_ids) == 6
