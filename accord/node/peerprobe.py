"""Round trips to the other members, for ``etcd_network_peer_round_trip_time_seconds``.

etcd measures its peers' round-trip time with a prober that calls each peer's HTTP
endpoint every few seconds. accord's peer links carry Raft batches with no echo to time,
so :class:`PeerProber` does what etcd's prober does over the peers' client port (over TLS
with this node's client certificate when they serve ``https://``): every
``INTERVAL`` seconds one ``grpc.health.v1.Health/Check`` per member that published a
client URL, on a channel kept open per peer (so a probe is one request and its answer,
not a connection set-up), with a ``TIMEOUT``. The time includes the peer's gRPC handling
(tens of microseconds), which a network path of milliseconds dwarfs; a probe that fails
or times out counts in ``accord_network_peer_probe_failures_total`` instead.

Each answer also carries the peer's wall clock (``grpc_server.CLOCK_METADATA``), which the
prober hands to this member's :class:`~accord.services.kv.clockguard.ClockGuard` with
its own readings before and after: the evidence that lets a member whose clock is off
stop stamping revisions. A guard that saw its clock step asks for a round at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accord.node.grpc_server import CLOCK_METADATA
from accord.node.metrics import RTT_BUCKETS, Buckets
from accord.services.cluster.members import MemberRecord
from accord.services.kv.clockguard import ClockGuard

log = logging.getLogger("accord.node.peerprobe")

INTERVAL = 5.0
"""Seconds between two probe rounds (etcd's prober runs every 4-5 s)."""
TIMEOUT = 1.0
"""Seconds a probe may take before it counts as failed."""
WAKE_CHECK = 0.25
"""Seconds between two looks at whether the clock guard wants a round now."""
EARLY_INTERVAL = 0.5
"""Seconds between rounds until every peer has answered once (a starting member)."""


def _address(url: str) -> tuple[str, bool] | None:
    """``http(s)://host:port`` -> (``host:port``, TLS or not); None for anything else."""
    for scheme, tls in (("http://", False), ("https://", True)):
        if url.startswith(scheme):
            rest = url[len(scheme):].rstrip("/")
            return (rest, tls) if rest else None
    return None


def tls_credentials(ca_file: str, cert_file: str, key_file: str) -> grpc.ChannelCredentials:
    """Credentials to probe peers' ``https://`` client URLs: the cluster's CA (the
    system's when none is given) and this node's certificate, which clients with
    ``--client-cert-auth`` ask for."""
    def read(path: str) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(root_certificates=read(ca_file),
                                        private_key=read(key_file),
                                        certificate_chain=read(cert_file))


class PeerProber:
    """Times a health check to every other member (see the module docstring)."""

    def __init__(self, member_id: int, members: Callable[[], Mapping[int, MemberRecord]],
                 rtt: dict[int, Buckets], failures: dict[int, int], *,
                 interval: float = INTERVAL, timeout: float = TIMEOUT,
                 tls: Callable[[], grpc.ChannelCredentials] | None = None,
                 clock: ClockGuard | None = None) -> None:
        """``tls``: makes the credentials for peers' ``https://`` URLs (None: only
        ``http://`` ones are probed); ``clock``: the guard fed with the peers' clocks."""
        self._self = member_id
        self._tls = tls
        self._clock = clock
        self._members = members
        self.rtt = rtt
        self.failures = failures
        self._interval = interval
        self._timeout = timeout
        self._channels: dict[int, tuple[str, grpc.aio.Channel]] = {}
        self._task: asyncio.Task[None] | None = None
        self._answered_all = False
        """Whether the last round reached every other member (then rounds slow down)."""

    def start(self) -> None:
        """Begin probing (the task is owned here; ``stop`` cancels and awaits it)."""
        self._task = asyncio.create_task(self._loop(), name="peer-probe")

    async def stop(self) -> None:
        """Stop probing and close the channels."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def _loop(self) -> None:
        while True:
            # The clock guard's first evidence comes without waiting: until every peer
            # answered once, rounds run every EARLY_INTERVAL.
            await self.probe_all()
            interval = self._interval if self._answered_all else min(EARLY_INTERVAL,
                                                                       self._interval)
            waited = 0.0
            while waited < interval:
                step = min(WAKE_CHECK, interval - waited)
                await asyncio.sleep(step)
                waited += step
                if self._clock is not None and self._clock.wanted:
                    break
            if self._clock is not None:
                self._clock.wanted = False

    async def probe_all(self) -> None:
        """One round: every other member with a client URL it can reach, concurrently."""
        wanted: dict[int, str] = {}
        unpublished = False
        for mid, rec in self._members().items():
            if mid == self._self:
                continue
            unpublished = unpublished or not rec.client_urls
            for url in rec.client_urls:
                found = _address(url)
                if found is not None and (not found[1] or self._tls is not None):
                    wanted[mid] = url
                    break
        for mid in list(self._channels):
            if self._channels[mid][0] != wanted.get(mid):
                _, ch = self._channels.pop(mid)
                await ch.close()
        before = sum(self.failures.values())
        if wanted:
            await asyncio.gather(*(self._probe(mid, t) for mid, t in wanted.items()))
        self._answered_all = not unpublished and sum(self.failures.values()) == before

    async def _probe(self, mid: int, target: str) -> None:
        entry = self._channels.get(mid)
        if entry is None:
            found = _address(target)
            assert found is not None
            address, tls = found
            if tls:
                assert self._tls is not None
                channel = grpc.aio.secure_channel(address, self._tls())
            else:
                channel = grpc.aio.insecure_channel(address)
            entry = self._channels[mid] = (target, channel)
        stub = health_pb2_grpc.HealthStub(entry[1])
        clock = self._clock
        sent_mono, sent = (clock.mono_us(), clock.wall_us()) if clock is not None else (0, 0)
        began = time.perf_counter()
        try:
            call = stub.Check(health_pb2.HealthCheckRequest(), timeout=self._timeout)
            metadata = await call.initial_metadata()
            await call
        except grpc.aio.AioRpcError as e:
            self.failures[mid] = self.failures.get(mid, 0) + 1
            log.debug("probe of member %x at %s failed: %s", mid, target, e.code().name)
            return
        if clock is not None:
            received = clock.wall_us()
            peer = _clock_of(metadata)
            if peer is not None:
                sample = clock.observe(mid, sent, peer, received, sent_mono)
                if clock.disagrees(sample):
                    log.warning("member %x's clock differs from this member's by %.1f ms "
                                "(+-%.1f ms), more than --max-clock-offset %g ms", mid,
                                sample.offset_us / 1000, sample.err_us / 1000,
                                clock.max_offset_us / 1000)
        b = self.rtt.get(mid)
        if b is None:
            b = self.rtt[mid] = Buckets(RTT_BUCKETS)
        b.observe(time.perf_counter() - began)


def _clock_of(metadata: object) -> int | None:
    """The peer's clock from a health answer's initial metadata (None if absent or not
    a number: an older member, or something else answering)."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == CLOCK_METADATA:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None
