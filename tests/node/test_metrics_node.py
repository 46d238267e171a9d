"""A real node in this process, scraped over HTTP: metrics, /health, /livez, /readyz, gRPC health.

Two nodes run side by side in one test to show that each keeps its own registry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from accord.client import AccordClient
from accord.client.checkpoint_writer import CheckpointCoordinator
from accord.node.config import Config, ConfigError
from accord.node.server import Node
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.services.checkpoints.checksum import of_bytes
from accord.services.kv import sharding
from tests.integration.cluster import free_ports

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _config(root: Path, name: str) -> Config:
    client, peer, metrics = free_ports(3)
    return Config(
        name=name, data_dir=str(root / name),
        listen_client_urls=[f"http://127.0.0.1:{client}"],
        listen_peer_urls=[f"http://127.0.0.1:{peer}"],
        listen_metrics_urls=[f"http://127.0.0.1:{metrics}"],
        gossip_listen="off", heartbeat_interval=50, election_timeout=500, shards=2,
        leader_balance_interval=0,
    )


@contextlib.asynccontextmanager
async def running(root: Path, name: str) -> AsyncIterator[Node]:
    node = Node(_config(root, name))
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def base(node: Node) -> str:
    assert node.http is not None
    return f"http://127.0.0.1:{node.http.ports[0]}"


async def get(url: str) -> tuple[int, str, dict[str, str]]:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(10)) as r:
        return r.status, await r.text(), dict(r.headers)


async def scrape(node: Node) -> Samples:
    status, text, _ = await get(base(node) + "/metrics")
    assert status == 200
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def until_led(node: Node, timeout: float = 20.0) -> Samples:
    """Scrape until every group has a leader, and the node has counted each election (a
    core knows its new leader a turn before the host tells the listeners)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        s = await scrape(node)
        if (s[("etcd_server_has_leader", ())] == 1
                and s[("etcd_server_leader_changes_seen_total", ())] >= len(node.host.groups)):
            return s
        assert loop.time() < deadline, "no leader in every group in time"
        await asyncio.sleep(0.1)


def channel(node: Node) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{node.client_ports[0]}")


def v(s: Samples, name: str, **labels: str) -> float:
    return s[(name, tuple(sorted(labels.items())))]


async def test_metrics_follow_the_node(tmp_path: Path) -> None:
    async with running(tmp_path, "n1") as a, running(tmp_path, "m1") as b:
        first = await until_led(a)
        await until_led(b)
        groups = sum(v(first, "accord_raft_groups", role=r)
                     for r in ("leader", "follower", "candidate", "pre_candidate"))
        assert groups == 5  # meta, scheduler, checkpoints, two KV shards
        assert v(first, "etcd_server_is_leader") == 1
        assert v(first, "etcd_server_leader_changes_seen_total") >= groups
        async with channel(a) as ch:
            kv = rpc_pb2_grpc.KVStub(ch)
            for i in range(20):
                await kv.Put(rpc_pb2.PutRequest(key=f"/m/k{i}".encode(), value=b"v"), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError):
                await kv.Put(rpc_pb2.PutRequest(key=b""), timeout=10)  # etcd: key is not provided
            lease = await rpc_pb2_grpc.LeaseStub(ch).LeaseGrant(
                rpc_pb2.LeaseGrantRequest(TTL=60), timeout=10)
            watch = rpc_pb2_grpc.WatchStub(ch).Watch()
            await watch.write(rpc_pb2.WatchRequest(
                create_request=rpc_pb2.WatchCreateRequest(key=b"/m/")))
            await asyncio.wait_for(watch.read(), 10)  # created
            after = await scrape(a)
            other = await scrape(b)
            watch.cancel()
        assert lease.ID
        # a checkpoint saved through the real service (its coordinator holds the job's lock)
        async with AccordClient([f"127.0.0.1:{a.client_ports[0]}"]) as client, \
                CheckpointCoordinator(client, "mjob", ttl=30) as coord:
            expected = [(f"rank-{r}", r) for r in range(2)]
            await coord.begin(1, layout={"world_size": 2}, expected=expected)
            await client.checkpoints.register_shards("mjob", 1, coord.token, [
                {"shard_id": f"rank-{r}", "rank": r, "size": 1, "uri": f"file:///m/{r}",
                 "checksum": of_bytes(b"x").to_wire()} for r in range(2)])
            await coord.commit(1)
        saved = await scrape(a)
        assert v(saved, "accord_checkpoint_commits_total") == 1
        assert v(saved, "accord_checkpoint_jobs") == 1
        assert v(saved, "accord_checkpoint_steps", state="committed") == 1
        assert v(saved, "accord_checkpoint_gc_runs_total") == 0
        assert v(saved, "accord_checkpoint_register_batches_total") == 1
        assert v(saved, "accord_checkpoint_registrations_proposed_total") == 1
        put = {"grpc_service": "etcdserverpb.KV", "grpc_method": "Put", "grpc_type": "unary"}
        assert v(after, "grpc_server_handled_total", **put, grpc_code="OK") == 20
        assert v(after, "grpc_server_handled_total", **put, grpc_code="InvalidArgument") == 1
        assert v(after, "grpc_server_handling_seconds_count", **put) == 21
        assert v(after, "etcd_server_proposals_applied_total") >= \
            v(first, "etcd_server_proposals_applied_total") + 20
        assert v(after, "etcd_server_proposals_committed_total") >= \
            v(after, "etcd_server_proposals_applied_total")
        assert v(after, "etcd_disk_wal_fsync_duration_seconds_count") > \
            v(first, "etcd_disk_wal_fsync_duration_seconds_count")
        assert v(after, "etcd_debugging_mvcc_keys_total") == 20
        assert v(after, "etcd_debugging_mvcc_watch_stream_total") == 1
        assert v(after, "etcd_debugging_mvcc_watcher_total") == 1
        assert v(after, "accord_leases") == 1
        assert v(after, "etcd_mvcc_db_total_size_in_bytes") > 0
        assert v(after, "etcd_server_quota_backend_bytes") == a.config.quota_backend_bytes
        assert v(after, "accord_raft_groups_without_leader") == 0
        assert ("process_resident_memory_bytes", ()) in after
        # the other node in this process has its own registry: none of it happened there
        assert v(other, "etcd_debugging_mvcc_keys_total") == 0
        assert ("grpc_server_handled_total", tuple(sorted({**put, "grpc_code": "OK"}.items()))) \
            not in other
        # a Txn over both KV shards, run by this node's coordinator (which also ran the
        # revoke of the checkpoint coordinator's lease, on every shard at one revision)
        assert v(after, "accord_xtxn_committed_total") == 0
        assert v(saved, "accord_xtxn_committed_total") == 1
        one, two = (next(k for k in (f"/x{i}/k".encode() for i in range(64))
                         if sharding.shard_of(k, 2) == s) for s in (0, 1))
        async with channel(a) as ch:
            resp = await rpc_pb2_grpc.KVStub(ch).Txn(rpc_pb2.TxnRequest(success=[
                rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=k, value=b"v"))
                for k in (one, two)]), timeout=10)
        assert resp.succeeded
        crossed = await scrape(a)
        assert v(crossed, "accord_xtxn_committed_total") == 2
        assert v(crossed, "accord_xtxn_aborted_total") == 0
        assert v(crossed, "accord_xtxn_retries_total") == 0
        assert v(other, "accord_xtxn_committed_total") == 0


async def test_health_endpoints_and_grpc_health_agree(tmp_path: Path) -> None:
    async with running(tmp_path, "n1") as node:
        await until_led(node)
        url = base(node)
        assert (await get(url + "/health"))[:2] == (200, '{"health":"true","reason":""}')
        assert (await get(url + "/health?serializable=true"))[:2] == (
            200, '{"health":"true","reason":""}')
        assert (await get(url + "/livez"))[:2] == (200, "ok\n")
        status, text, _ = await get(url + "/readyz?verbose")
        assert status == 200
        assert text == ("[+]data_corruption ok\n[+]serializable_read ok\n"
                        "[+]linearizable_read ok\nok\n")
        assert (await get(url + "/readyz/linearizable_read"))[:2] == (200, "ok\n")
        assert (await get(url + "/readyz/no_such_check"))[0] == 404
        async with aiohttp.ClientSession() as s, s.post(url + "/health") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET"
        async with channel(node) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            maintenance = rpc_pb2_grpc.MaintenanceStub(ch)

            async def grpc_status() -> int:
                assert node._health is not None
                await node._health.sync()
                resp = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                return int(resp.status)

            assert await grpc_status() == health_pb2.HealthCheckResponse.SERVING
            alarm = rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.ACTIVATE,
                                         memberID=node.member_id, alarm=rpc_pb2.NOSPACE)
            await maintenance.Alarm(alarm, timeout=10)
            status, text, _ = await get(url + "/health")
            assert (status, text) == (503, '{"health":"false","reason":"ALARM NOSPACE"}\n')
            assert (await get(url + "/health?exclude=NOSPACE"))[0] == 200
            assert (await get(url + "/readyz"))[0] == 200  # no space is not corruption
            alarm.alarm = rpc_pb2.CORRUPT
            await maintenance.Alarm(alarm, timeout=10)
            status, text, _ = await get(url + "/readyz")
            assert status == 503
            assert "[-]data_corruption failed: alarm activated: CORRUPT\n" in text
            assert await grpc_status() == health_pb2.HealthCheckResponse.NOT_SERVING
            assert (await get(url + "/livez"))[0] == 200  # alive, just not to be used
            for kind in (rpc_pb2.CORRUPT, rpc_pb2.NOSPACE):
                await maintenance.Alarm(rpc_pb2.AlarmRequest(
                    action=rpc_pb2.AlarmRequest.DEACTIVATE, memberID=node.member_id, alarm=kind),
                    timeout=10)
            assert await grpc_status() == health_pb2.HealthCheckResponse.SERVING
            assert (await get(url + "/readyz"))[0] == 200
        s = await scrape(node)
        assert v(s, "etcd_server_health_success") >= 3
        assert v(s, "etcd_server_health_failures") == 1


async def test_https_metrics_url_serves_with_the_client_certificate(tmp_path: Path) -> None:
    import ssl

    from accord.node.certs import make_cluster_pki

    _, files = make_cluster_pki(tmp_path / "pki", ["n1"])
    cfg = _config(tmp_path, "n1")
    cfg.listen_client_urls = [u.replace("http://", "https://") for u in cfg.listen_client_urls]
    cfg.listen_metrics_urls = [u.replace("http://", "https://") for u in cfg.listen_metrics_urls]
    cfg.cert_file, cfg.key_file = str(files["n1"].cert), str(files["n1"].key)
    cfg.resolved().validate()
    node = Node(cfg)
    await node.start()
    try:
        assert node.http is not None
        url = f"https://127.0.0.1:{node.http.ports[0]}/livez"
        trusted = ssl.create_default_context(cafile=str(files["n1"].ca))
        async with aiohttp.ClientSession() as s:
            async with s.get(url, ssl=trusted, timeout=aiohttp.ClientTimeout(10)) as r:
                assert (r.status, await r.text()) == (200, "ok\n")
            with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer
                async with s.get(url.replace("https://", "http://"),
                                 timeout=aiohttp.ClientTimeout(10)) as r:
                    await r.text()
    finally:
        await node.stop()
    # without the certificate, an https:// metrics URL is refused before anything starts
    bare = _config(tmp_path, "n2")
    bare.listen_metrics_urls = [u.replace("http://", "https://") for u in bare.listen_metrics_urls]
    with pytest.raises(ConfigError, match="is served with the client certificate"):
        bare.resolved().validate()


async def test_peer_prober_times_health_checks_over_http_and_https(tmp_path: Path) -> None:
    from accord.node.certs import make_cluster_pki
    from accord.node.metrics import Buckets
    from accord.node.peerprobe import PeerProber, tls_credentials
    from accord.services.cluster.members import MemberRecord

    _, files = make_cluster_pki(tmp_path / "pki", ["n1"])
    plain_cfg = _config(tmp_path, "p1")
    tls_cfg = _config(tmp_path, "t1")
    tls_cfg.listen_client_urls = [u.replace("http://", "https://")
                                  for u in tls_cfg.listen_client_urls]
    tls_cfg.listen_metrics_urls = ["off"]
    tls_cfg.cert_file, tls_cfg.key_file = str(files["n1"].cert), str(files["n1"].key)
    tls_cfg.trusted_ca_file, tls_cfg.client_cert_auth = str(files["n1"].ca), True
    plain, secure = Node(plain_cfg), Node(tls_cfg)
    await plain.start()
    await secure.start()
    try:
        (closed,) = free_ports(1)  # nobody listens here: that probe fails
        members = {
            1: MemberRecord(1, "me", ("http://127.0.0.1:1",), (plain.config.advertise_client_urls[0],)),
            2: MemberRecord(2, "plain", (), tuple(plain.config.advertise_client_urls)),
            3: MemberRecord(3, "secure", (), tuple(secure.config.advertise_client_urls)),
            4: MemberRecord(4, "gone", (), (f"http://127.0.0.1:{closed}",)),
        }
        rtt: dict[int, Buckets] = {}
        failures: dict[int, int] = {}
        c = secure.config
        prober = PeerProber(1, lambda: members, rtt, failures, timeout=2.0,
                            tls=lambda: tls_credentials(c.trusted_ca_file, c.cert_file, c.key_file))
        try:
            for _ in range(2):
                await prober.probe_all()
        finally:
            await prober.stop()
        assert rtt[2].count == 2 and rtt[3].count == 2  # itself (1) is never probed
        assert 1 not in rtt and 4 not in rtt and failures == {4: 2}
        assert all(0 < b.total < 4.0 for b in rtt.values())
        # without credentials an https:// peer is left alone rather than dialled in clear
        bare = PeerProber(1, lambda: members, {}, {}, timeout=2.0)
        await bare.probe_all()
        assert set(bare.rtt) == {2}
        await bare.stop()
    finally:
        await secure.stop()
        await plain.stop()
