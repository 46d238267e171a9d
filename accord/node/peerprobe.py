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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accord.node.metrics import RTT_BUCKETS, Buckets
from accord.services.cluster.members import MemberRecord

log = logging.getLogger("accord.node.peerprobe")

INTERVAL = 5.0
"""Seconds between two probe rounds (etcd's prober runs every 4-5 s)."""
TIMEOUT = 1.0
"""Seconds a probe may take before it counts as failed."""


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
                 tls: Callable[[], grpc.ChannelCredentials] | None = None) -> None:
        """``tls``: makes the credentials for peers' ``https://`` URLs (None: only
        ``http://`` ones are probed)."""
        self._self = member_id
        self._tls = tls
        self._members = members
        self.rtt = rtt
        self.failures = failures
        self._interval = interval
        self._timeout = timeout
        self._channels: dict[int, tuple[str, grpc.aio.Channel]] = {}
        self._task: asyncio.Task[None] | None = None

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
            await asyncio.sleep(self._interval)
            await self.probe_all()

    async def probe_all(self) -> None:
        """One round: every other member with a client URL it can reach, concurrently."""
        wanted: dict[int, str] = {}
        for mid, rec in self._members().items():
            if mid == self._self:
                continue
            for url in rec.client_urls:
                found = _address(url)
                if found is not None and (not found[1] or self._tls is not None):
                    wanted[mid] = url
                    break
        for mid in list(self._channels):
            if self._channels[mid][0] != wanted.get(mid):
                _, ch = self._channels.pop(mid)
                await ch.close()
        if wanted:
            await asyncio.gather(*(self._probe(mid, t) for mid, t in wanted.items()))

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
        began = time.perf_counter()
        try:
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            self.failures[mid] = self.failures.get(mid, 0) + 1
            log.debug("probe of member %x at %s failed: %s", mid, target, e.code().name)
            return
        b = self.rtt.get(mid)
        if b is None:
            b = self.rtt[mid] = Buckets(RTT_BUCKETS)
        b.observe(time.perf_counter() - began)
