"""One accord node: the parts assembled, and `accord serve`.

A node owns one write-ahead log and one snapshot store (under ``--data-dir``), one
peer transport (``--listen-peer-urls``), one Multi-Raft host driving its groups,
and one gRPC server (``--listen-client-urls``) serving the etcd v3 API:

* group 1, the meta group: the member table and the shard map (``ClusterStateMachine``);
* groups 2 and 101.. (``backend.kv_group``): the ``--shards`` shards of the key
  space (``KVStateMachine`` each), leases and watches;
* group 3: the GPU scheduler (``SchedulerShard``): its leader computes placements
  and commits them, so a failover loses no decision;
* group 4: checkpoint manifests (``CheckpointGroup``): a job's commit is one entry; the
  job's fencing tokens are checked against its coordinator lock in the KV store.

Every member hosts a replica of every group. A node of several worker processes
(``--workers N``, ``docs/workers.md``) is a supervisor (``supervise``) and N processes
``Node(config, worker=k)``, each hosting worker ``k``'s groups (``placement.py``) in
``<data-dir>/worker-k``, linked to worker ``k`` of the peers, sharing the client port;
``workers.py`` routes each call to the worker that owns its shard. Members are added and removed at
runtime through the meta group (``members.py``): a node started with
``--initial-cluster-state existing`` joins with an *empty* membership in every group
and waits for the leaders to add it and send it a snapshot (a node in no
configuration never campaigns). Such a node takes the shard count from ``--shards``
(it must be the cluster's; the node stops with a clear error once the meta group's
shard map says otherwise). ``<data-dir>/member`` records the node's id and whether
it joined, so a restart keeps both whatever the flags say. The KV
backend (``backend.py``) answers writes with the result of their apply, serves
linearizable reads after a ReadIndex barrier, and, while this node leads shard 0 (the
leases' home), expires leases (the leader decides, the log carries the decision) and
checkpoints their remaining TTL so a new leader neither extends nor cuts them. A SWIM
member (``accord/membership/service.py``) tells who is reachable, daemons and GPU
agents alike, and serves the Membership gRPC service.

Shutdown on SIGTERM/SIGINT is graceful: leaderships move to a peer, the gRPC
server stops taking requests, then the host, the transport and the log close.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import random
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import msgpack

from accord.locks.recipe import holder as lock_holder
from accord.locks.store import BackendLockStore, LockStore
from accord.node import autocompact, logs, metacopy
from accord.node.auth import auth_guard, auth_machine
from accord.node.autocompact import Retention
from accord.node.backend import COMMAND_FORMAT, KV_GROUP, ReplicatedBackend, kv_group
from accord.node.config import Config, ConfigError, load_config
from accord.node.forward import ForwardClient, ForwardedError, ForwardServer
from accord.node.grpc_server import ETCD_SERVICES, AccordGrpcServer, ServerOptions, build_server
from accord.node.grpcmetrics import GrpcCollector, GrpcMetricsInterceptor
from accord.node.health import HealthChecks, HealthMonitor
from accord.node.httpserve import MetricsServer, following
from accord.node.members import META_GROUP, MemberChanges, add_debug_service, groups_report
from accord.node.metacopy import MetaCopy, MetaFeed
from accord.node.metrics import NodeMetrics
from accord.node.peerprobe import PeerProber, tls_credentials
from accord.node.placement import WORKERS_FILE, PlacementError, WorkerPlan, check_workers
from accord.node.supervisor import MISFIT_EXIT, REMOVED_EXIT, Supervisor
from accord.node.tls import ReloadingTLS, client_files, peer_files
from accord.node.workermetrics import WorkersMetricsServer
from accord.node.workers import META_BARRIER, RoutedLockStore, WorkerRouter
from accord.proto import rpc_pb2
from accord.raft.core.types import NO_NODE, Role
from accord.raft.host.balance import plan_moves
from accord.raft.host.multiraft import GroupUnavailable, HostConfig, MultiRaftHost
from accord.raft.storage.files import fsync_dir, replace_durably
from accord.raft.storage.snapshot import SnapshotStore
from accord.raft.storage.wal import WriteAheadLog
from accord.raft.transport.links import PeerTransport
from accord.raft.transport.tls import PeerTLS
from accord.services.auth.interceptor import AuthInterceptor
from accord.services.checkpoints.replicated import CHECKPOINT_GROUP, CheckpointGroup
from accord.services.checkpoints.service import lock_name
from accord.services.checkpoints.servicer import add_checkpoints_service
from accord.services.cluster.members import ClusterStateMachine, MemberRecord, ShardPlacement
from accord.services.kv.clockguard import (
    CLOCK_FAILPOINT_ENV,
    ClockGuard,
    ClockUntrusted,
    failpoint_clock,
)
from accord.services.kv.errors import MSG_COMPACTED, EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.sharding import shards_of_range
from accord.services.kv.statemachine import KVStateMachine
from accord.services.kv.watchstream import notify_progress_now
from accord.services.kv.xcoord import FAILPOINT_ENV
from accord.services.scheduling.replicated import SCHEDULING_GROUP, SchedulerShard
from accord.services.scheduling.servicer import add_scheduler_service

log = logging.getLogger("accord.node.server")

LEASE_CHECK_INTERVAL = 0.5
"""Seconds between the leader's scans for expired leases."""
LEASE_CHECKPOINT_INTERVAL = 5.0
"""Seconds between lease TTL checkpoints: bounds what a leader change can add to a lease."""
LEASE_REAP_INTERVAL = 5.0
"""Seconds between two looks for lease ids left on a shard by an interrupted revocation."""
"""Seconds between two looks at how leaderships are spread over the nodes."""
META_BARRIER_WAIT_S = 5.0
"""How long a worker's auth freshness barrier waits for worker 0 and its copy."""
META_SYNC_S = 10.0
"""Seconds a worker > 0 waits at start for its first meta state from worker 0."""

class _KVMachine:
    """Adapts ``KVStateMachine`` to the host's ``StateMachine`` protocol."""

    def __init__(self, sm: KVStateMachine) -> None:
        self.sm = sm

    def apply(self, index: int, payload: bytes) -> object:
        return self.sm.apply(payload)

    def apply_unanswered(self, index: int, payload: bytes) -> None:
        self.sm.apply(payload, answer=False)

    def prepare_snapshot(self) -> Callable[[], bytes]:
        return self.sm.prepare_snapshot()

    def restore(self, data: bytes) -> None:
        self.sm.restore(data)


class Node:
    """One accord node (see the module docstring)."""

    def __init__(self, config: Config, worker: int = 0, socket_dir: Path | None = None) -> None:
        self.config = config.resolved()
        self.worker = worker
        """This process's worker index in a node of several (``--workers``; 0 alone)."""
        self.socket_dir = socket_dir or Path(self.config.data_dir)
        """Where a node of several workers keeps their Unix sockets: the directory its
        supervisor made (``SOCKETS_ENV``), or the data directory for a worker run alone."""
        self.plan = (WorkerPlan(self.config.workers, self.config.shards)
                     if self.config.workers > 1 else None)
        """The split of the groups over the node's workers; None for a node of one."""
        base = Path(self.config.data_dir)
        self.data_dir = base if self.plan is None else self.plan.data_dir(base, worker)
        recorded = _read_member_file(self.data_dir)
        if recorded is not None:
            self.member_id, self.joined = recorded
        else:
            self.member_id, self.joined = self.config.member_id, self.config.joining
        self.removed = asyncio.Event()
        """Set when this member was removed from the cluster (or cannot be part of it)."""
        self.wal: WriteAheadLog | None = None
        self.grpc: AccordGrpcServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.client_ports: list[int] = []
        self.metrics = NodeMetrics(self.member_id)
        """This node's Prometheus registry and the counts behind it (``metrics.py``)."""
        self.http: MetricsServer | None = None
        """The metrics listener (``--listen-metrics-urls``), once started."""
        self._health: HealthMonitor | None = None
        self._prober: PeerProber | None = None
        self.router: WorkerRouter | None = None
        """How calls are routed between the workers (a node of several only)."""
        self._forward_server: ForwardServer | None = None
        self._forward_clients: dict[int, ForwardClient] = {}
        self.meta_copy: MetaCopy | None = None
        """The meta state fed by worker 0 (workers > 0 only)."""
        self.restarted = False
        """Whether the log held this process's groups at start (``NodeParts.restarted``)."""

    @property
    def hosted_shards(self) -> list[int]:
        """The KV shards this process hosts: all of them, or its worker's."""
        if self.plan is None:
            return list(range(self.config.shards))
        return self.plan.shards_of(self.worker)

    @property
    def hosts_node_services(self) -> bool:
        """Whether this process runs the node-wide groups and services (the meta group,
        scheduler, checkpoints, SWIM): a node of one process, or worker 0 of several."""
        return self.worker == 0

    @property
    def home_group(self) -> int:
        """The KV group whose Raft facts stand for this process (shard 0's, or a worker's
        first shard's)."""
        return kv_group(self.hosted_shards[0])

    async def start(self) -> None:
        """Open storage, join the peers, start the groups and serve clients."""
        cfg = self.config
        # Certificates first: a bad file stops the node before it touches its data.
        client_tls, peer_tls = client_files(cfg), peer_files(cfg)
        self.client_tls = ReloadingTLS(client_tls) if client_tls else None
        self.peer_tls = ReloadingTLS(peer_tls) if peer_tls else None
        await asyncio.to_thread(make_dir_durably, self.data_dir)
        self.shards = await asyncio.to_thread(check_shard_count, self.data_dir, cfg.shards)
        await asyncio.to_thread(write_member_file, self.data_dir, self.member_id, self.joined)
        wal, recovered = await asyncio.to_thread(
            functools.partial(WriteAheadLog.open, self.data_dir / "wal",
                              segment_bytes=cfg.wal_segment_bytes))
        self.wal = wal
        self.restarted = bool(recovered)
        snapshots = SnapshotStore(self.data_dir / "snap")
        host_ip, peer_port = cfg.peer_listen_address()
        if self.plan is not None:
            peer_port = self.plan.peer_port(peer_port, self.worker)
        self.transport = PeerTransport(
            self.member_id, host_ip, peer_port, cluster_id=cfg.cluster_id, worker=self.worker,
            on_messages=self._deliver, on_snapshot_chunk=self._snapshot_chunk,
            on_heartbeats=self._heartbeats,
            tls=None if self.peer_tls is None else PeerTLS(
                self.peer_tls.server_context, self.peer_tls.client_context),
        )
        self.host = MultiRaftHost(
            self.member_id, wal, snapshots, self.transport,
            HostConfig(
                tick_interval=cfg.tick_interval,
                election_ticks=cfg.election_ticks,
                snapshot_entries=cfg.snapshot_count,
                snapshot_log_percent=cfg.snapshot_log_percent,
                lease_read=cfg.lease_read,
                clock_drift_ticks=cfg.clock_drift_ticks if cfg.lease_read else 0,
            ),
            boot_nonce=time.time_ns(),
        )
        ids = cfg.member_ids()
        if self.joined:
            # Every group starts with an empty membership: the leaders send it.
            voters: list[int] = []
            self.cluster = ClusterStateMachine({}, [], auth=auth_machine(cfg))
        else:
            voters = sorted(ids.values())
            self.cluster = initial_table(cfg, self.shards)
        if self.plan is not None and self.worker != 0:
            # Worker 0 feeds this copy of the meta state (metacopy.py); it starts as the
            # bootstrap table, as worker 0's machine did (joining is refused with workers).
            self._forward_clients = {
                k: ForwardClient(self.plan.forward_socket(self.socket_dir, k))
                for k in range(self.plan.workers) if k != self.worker}
            self.meta_copy = MetaCopy(self.cluster, self._forward_clients[0])
        self.members = MemberChanges(self)
        limits = Limits(max_request_bytes=cfg.max_request_bytes, max_txn_ops=cfg.max_txn_ops)
        self.machines = [
            KVStateMachine(limits=limits, lease_id_seed=kv_group(i), stripe=(self.shards, i))
            for i in range(self.shards)
        ]
        self.kv = self.machines[0]
        home = self.hosts_node_services
        self.meta_feed: MetaFeed | None = None
        if home:
            meta: Any = self.cluster
            if self.plan is not None:
                self.meta_feed = meta = MetaFeed(self.cluster,
                                                 lambda: self.host.group(META_GROUP).applied)
            self.host.add_group(META_GROUP, meta, recovered.get(META_GROUP), voters=voters)
        for i in self.hosted_shards:
            gid = kv_group(i)
            self.host.add_group(gid, _KVMachine(self.machines[i]), recovered.get(gid),
                                voters=voters)
            if self.shards > 1:
                self.host.fence_reads(gid, functools.partial(self._read_fence, gid))
        if home:
            self.scheduling = SchedulerShard.on_host(self.host, self.member_id)
            self.host.add_group(SCHEDULING_GROUP, self.scheduling,
                                recovered.get(SCHEDULING_GROUP), voters=voters)
            self.checkpoints = CheckpointGroup.on_host(self.host, self.member_id,
                                                       holder=self._checkpoint_lock_holder)
            self.host.add_group(CHECKPOINT_GROUP, self.checkpoints,
                                recovered.get(CHECKPOINT_GROUP), voters=voters)
        self.metrics.watch_groups(self.host)  # before the first election
        peers = cfg.peer_candidates() if self.joined else cfg.peer_addresses()
        for nid, addr in peers.items():
            self.members.note_peer(nid, addr)
        self.cluster.listeners.append(self.members.sync_peers)
        await self.transport.start()
        await self.host.start()
        self.backend = ReplicatedBackend(
            self, self.machines, local=None if self.plan is None else self.hosted_shards,
            worker=self.worker)
        self.clock = ClockGuard(cfg.max_clock_offset, cluster_size=lambda: len(self.cluster.members),
                                wall_ns=failpoint_clock(os.environ.get(CLOCK_FAILPOINT_ENV, "")))
        self.backend.set_clock_drift(cfg.max_clock_offset, self.clock)
        self.backend.xcoord.set_failpoint(os.environ.get(FAILPOINT_ENV, ""))
        calls = GrpcMetricsInterceptor()
        self.grpc = build_server(self.backend, ServerOptions(max_request_bytes=cfg.max_request_bytes,
                                                             share_port=self.plan is not None),
                                 outer_interceptors=[calls],
                                 auth=auth_guard(cfg, self.cluster, self.host,
                                                 None if self.meta_copy is None
                                                 else self._meta_barrier),
                                 clock_us=self.clock.wall_us)
        for url, (h, p) in zip(cfg.listen_client_urls, cfg.client_listen_addresses(), strict=True):
            creds = (self.client_tls.grpc_credentials()
                     if self.client_tls is not None and cfg.client_url_is_tls(url) else None)
            self.client_ports.append(self.grpc.add_port(f"{h}:{p}", creds))
        versions = self.grpc.client_api_versions
        self.metrics.attach(self, GrpcCollector(calls, lambda: dict(versions)))
        checks = HealthChecks(self, read=None if self.plan is None else self._routed_read)
        if cfg.metrics_enabled:
            self.http = MetricsServer(self.metrics, checks)
            if self.plan is not None:  # the supervisor serves the URLs, from every worker
                await self.http.start_unix(
                    self.plan.metrics_socket(self.socket_dir, self.worker))
            else:
                await self.http.start(metrics_addresses(cfg, self.client_tls))
        if home:
            add_scheduler_service(self.grpc.server, self.scheduling)
            add_checkpoints_service(self.grpc.server, self.checkpoints)
            add_debug_service(self.grpc.server, self, self._groups_report)
            from accord.membership.servicer import add_membership_service
            from accord.node.gossip import node_membership
            self.membership = node_membership(cfg, self.member_id, scheduler=self.scheduling)
            add_membership_service(self.grpc.server, self.membership)
            await self.membership.start()  # SWIM (off with --gossip-listen off)
        if self.plan is not None:
            await self._start_forwarding(self.plan)
        if self.meta_copy is not None:
            # Serve with worker 0's table, not the bootstrap one (a worker 0 that does not
            # answer soon is waited for no longer: the copy catches up as it can).
            self._tasks.append(asyncio.create_task(self.meta_copy.run(), name="meta-copy"))
            try:
                async with asyncio.timeout(META_SYNC_S):
                    await self.meta_copy.wait_applied(1)
            except TimeoutError:
                log.warning("worker %d: no meta state from worker 0 within %.0fs; serving "
                            "with the bootstrap table until it comes", self.worker, META_SYNC_S)
        await self.grpc.start()
        self._health = HealthMonitor(checks, self.grpc, ("", *(f"etcdserverpb.{s}" for s in ETCD_SERVICES)))
        await self._health.start()
        probe_tls = None
        if cfg.cert_file and cfg.key_file:
            def probe_tls() -> grpc.ChannelCredentials:
                return tls_credentials(cfg.trusted_ca_file, cfg.cert_file, cfg.key_file)
        # Every worker probes the peers: its own clock guard needs their clocks.
        self._prober = PeerProber(self.member_id, lambda: self.cluster.members,
                                  self.metrics.peer_rtt, self.metrics.peer_probe_failures,
                                  tls=probe_tls, clock=self.clock)
        self._prober.start()
        if not home:
            self._tasks.append(asyncio.create_task(self._intent_loop(), name="intent-recovery"))
            self._tasks.append(asyncio.create_task(self._progress_loop(), name="watch-progress"))
            # This worker's groups follow worker 0's member table (its meta copy).
            self._tasks.append(asyncio.create_task(self.members.run(repair=False),
                                                   name="member-changes"))
            if cfg.leader_balance_interval > 0:
                self._tasks.append(asyncio.create_task(self._balance_loop(), name="leader-balance"))
            return
        self._tasks = [
            asyncio.create_task(self._publish(), name="publish-member"),
            asyncio.create_task(self._advertise(), name="advertise-version"),
            asyncio.create_task(self._lease_loop(), name="lease-expiry"),
            asyncio.create_task(self._progress_loop(), name="watch-progress"),
            asyncio.create_task(self.members.run(), name="member-changes"),
        ]
        if cfg.leader_balance_interval > 0:
            self._tasks.append(asyncio.create_task(self._balance_loop(), name="leader-balance"))
        retention = cfg.retention()
        if retention.enabled:
            self._tasks.append(asyncio.create_task(self._compaction_loop(retention),
                                                   name="auto-compaction"))
        self._tasks.append(self.scheduling.start())
        self._tasks.append(self.checkpoints.start())

    async def _routed_read(self, req: rpc_pb2.RangeRequest) -> object:
        """A health read in a worker: the health key read from its shard's owner."""
        assert self.router is not None and self.plan is not None
        return await self.router.range_across(
            req, shards_of_range(req.key, req.range_end, self.plan.shards))

    async def _start_forwarding(self, plan: WorkerPlan) -> None:
        """A worker's part in a node of several: route the client calls
        (``workers.py``) and serve the other workers on this worker's socket."""
        assert self.grpc is not None
        base = self.socket_dir
        if not self._forward_clients:
            self._forward_clients = {k: ForwardClient(plan.forward_socket(base, k))
                                     for k in range(plan.workers) if k != self.worker}
        self.router = WorkerRouter(plan, self.worker, self.backend, self._forward_clients)
        self.router.wait_gone = self.members.wait_gone
        if self.worker == 0:  # a MemberRemove waits for every worker's groups
            self.members.others_gone = self.router.members_gone
        served = self.router.install(self.grpc.methods.handlers,
                                     AuthInterceptor(self.grpc.auth))
        self.grpc.methods.fallback = self.router.fallback
        for lock_servicer in self.grpc.locks or ():
            lock_servicer.store = RoutedLockStore(self.backend, self.grpc.methods.handlers)
        every_shard = list(range(plan.shards))
        backend = self.backend

        async def lease_keys(lease_id: int) -> list[bytes]:
            """A lease's keys on every worker's shards (auth's check of a revoke)."""
            return await backend.lease_keys_on(every_shard, lease_id)

        self.grpc.auth.lease_keys = lease_keys
        if self.meta_feed is not None:
            served[metacopy.METHOD] = self.meta_feed.serve
        self._forward_server = ForwardServer(plan.forward_socket(base, self.worker), served)
        await self._forward_server.start()

    async def read_meta(self, timeout: float) -> None:
        """Bring this process's meta state (the member table, the shard map, auth) up to
        the meta group's as of this call: a ReadIndex on the meta group here (it returns
        once this replica applied what the leader had committed), or, on a worker without
        it, worker 0's and then this worker's copy caught up. Raises ``GroupUnavailable``,
        ``EtcdError`` or ``TimeoutError`` when that takes longer than ``timeout`` seconds."""
        if self.meta_copy is None:
            await self.host.read_barrier(META_GROUP, timeout)
            return
        async with asyncio.timeout(timeout):
            await self._meta_barrier()

    async def _meta_barrier(self) -> None:
        """On a worker without the meta group: a ReadIndex on it in worker 0, then this
        worker's copy caught up to what worker 0 had applied (the auth guard's freshness
        barrier, ``docs/workers.md``)."""
        assert self.meta_copy is not None and self.plan is not None
        try:
            index = int(msgpack.unpackb(await self._forward_clients[0].call(
                META_BARRIER, msgpack.packb([]), META_BARRIER_WAIT_S)))
            await asyncio.wait_for(self.meta_copy.wait_applied(index), META_BARRIER_WAIT_S)
        except (ForwardedError, OSError, TimeoutError, ValueError) as e:
            raise EtcdError(grpc.StatusCode.UNAVAILABLE,
                            f"etcdserver: request timed out (worker 0: {e})") from None

    async def _groups_report(self) -> dict[str, Any]:
        """The debug report: this process's groups, or every worker's on a node of several."""
        if self.router is not None:
            return await self.router.groups_across()
        return groups_report(self)

    async def _checkpoint_lock_holder(self, job: str) -> int | None:
        """The fencing token of the holder of ``job``'s coordinator lock now (linearizable)."""
        store: LockStore = BackendLockStore(self.backend)
        if self.router is not None and self.grpc is not None:  # a worker: routed calls
            store = RoutedLockStore(self.backend, self.grpc.methods.handlers)
        resp = await lock_holder(store, lock_name(job))
        return int(resp.kvs[0].create_revision) if resp.kvs else None

    # transport callbacks go through the node so they can be bound before the host exists
    def _deliver(self, frm: int, batch: list[Any]) -> None:
        self.host.deliver(frm, batch)

    def _heartbeats(self, frm: int, heartbeats: Any, resps: Any) -> None:
        self.host.deliver_heartbeats(frm, heartbeats, resps)

    async def _snapshot_chunk(self, frm: int, piece: Any) -> int:
        return await self.host.receive_snapshot_chunk(frm, piece)

    async def _publish(self) -> None:
        """Publish this member's client URLs through the meta group (retried until done)."""
        cmd = ClusterStateMachine.encode_publish(
            self.member_id, self.config.name, list(self.config.advertise_client_urls))
        while True:
            try:
                # A short timeout: a forwarded proposal lost on the way is retried soon.
                await self.host.propose(META_GROUP, cmd, timeout=2.0)
                return
            except GroupUnavailable:
                await asyncio.sleep(self.config.tick_interval * 2)
            except ValueError as e:  # a joining node not yet in the table it replicates
                log.info("publishing this member's client URLs deferred: %s", e)
                await asyncio.sleep(1.0)

    def _read_fence(self, group_id: int) -> bytes | None:
        """A KV shard's read fence (``MultiRaftHost.fence_reads``, ``docs/txn.md``): the
        backend's floor. Until the backend is built, or while the clock guard refuses
        this member's clock, no fence can be made and the leader appends nothing; with
        a refused clock it also hands the shard to another voter, so that the shard
        goes on with a leader whose clock the cluster agrees with."""
        backend: ReplicatedBackend | None = getattr(self, "backend", None)
        if backend is None:
            raise GroupUnavailable("this member is starting: its reads are not fenced yet")
        try:
            return backend.read_fence()
        except ClockUntrusted as e:
            # Handed over before the refusal is raised: a proposal refused while its
            # leader hands over waits for the new leader instead of failing
            # (``Proposer.propose``), so a write or a floor through this member goes on.
            self._hand_over(group_id)
            raise GroupUnavailable(str(e)) from None

    def _hand_over(self, group_id: int) -> None:
        """Transfer the leadership of ``group_id`` to another voter, picked at random
        (one that is down only costs an election timeout, then another is tried)."""
        core = self.host.group(group_id).core
        if core.role != Role.LEADER or core.lead_transferee != NO_NODE:
            return
        others = [v for v in core.conf_state.voters if v != self.member_id]
        if others:
            target = random.choice(others)
            log.warning("group %d: this member's clock is refused; handing leadership to %d",
                        group_id, target)
            self.host.transfer_leader(group_id, target)

    async def _advertise(self) -> None:
        """Advertise, through the meta group, the newest command format this node
        applies (the cluster-version gate: ``ClusterStateMachine.min_command_format``).

        Again whenever another member's advertised format rises: a member restored
        from a snapshot an older version wrote lost the advertisements made before it
        (an older node refuses them and keeps nothing), and this one brings them back.
        One round per upgrade: each node re-advertises once per rise it sees."""
        rose = asyncio.Event()
        seen: dict[int, int] = {}

        def check() -> None:
            for mid, m in self.cluster.members.items():
                if mid != self.member_id and m.command_format > seen.get(mid, 1):
                    rose.set()
                seen[mid] = m.command_format

        check()
        rose.clear()
        self.cluster.listeners.append(check)
        cmd = ClusterStateMachine.encode_advertise(self.member_id, COMMAND_FORMAT)
        while True:
            try:
                await self.host.propose(META_GROUP, cmd, timeout=2.0)
            except GroupUnavailable:
                await asyncio.sleep(self.config.tick_interval * 2)
                continue
            except ValueError as e:  # a joining node not yet in the table it replicates
                log.info("advertising this member's version deferred: %s", e)
                await asyncio.sleep(1.0)
                continue
            await rose.wait()
            rose.clear()

    async def _recover_intents(self) -> None:
        """The recovery of multi-shard Txns' stale intents on the shards this process
        leads (docs/txn.md); a failure waits for the next pass."""
        try:
            await self.backend.resolve_stale_intents()
        except EtcdError as e:
            log.info("intent recovery deferred: %s", e.message)

    async def _intent_loop(self) -> None:
        """A worker other than 0 (worker 0 recovers in ``_lease_loop``): its shards'
        stale intents, every ``LEASE_CHECK_INTERVAL``."""
        while True:
            await asyncio.sleep(LEASE_CHECK_INTERVAL)
            await self._recover_intents()

    async def _lease_loop(self) -> None:
        """On every member: resolve the stale intents of multi-shard Txns on the shards
        it leads. While leading shard 0 (the leases' home): checkpoint lease clocks while
        a lease exists, expire overdue leases (on every shard), and reap lease ids another
        shard kept after an interrupted revocation (seen stray in two scans in a row, so a
        grant still on its way is not taken for one)."""
        last_checkpoint_term = 0
        last_checkpoint = 0.0
        last_reap = 0.0
        suspects: set[int] = set()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(LEASE_CHECK_INTERVAL)
            if self.shards > 1:
                await self._recover_intents()
            g = self.host.group(KV_GROUP)
            if g.core.role != Role.LEADER:
                continue
            now, term = self.backend.lease_clock()
            try:
                # A checkpoint records remaining TTLs: with no lease there is none to
                # record (an idle cluster would log an entry every interval for nothing).
                # The next grant carries the leader's clock and term itself.
                if self.kv.leases.leases and (
                        term != last_checkpoint_term
                        or loop.time() - last_checkpoint > LEASE_CHECKPOINT_INTERVAL):
                    await self.backend.commit(self.kv.encode_lease_checkpoint(now, term))
                    last_checkpoint_term, last_checkpoint = term, loop.time()
                await self.backend.expire_leases()
                if self.shards > 1 and loop.time() - last_reap > LEASE_REAP_INTERVAL:
                    last_reap = loop.time()
                    stray = self.backend.stray_leases()
                    await self.backend.reap_stray_leases(stray & suspects)
                    suspects = stray
            except EtcdError as e:
                log.info("lease maintenance deferred: %s", e.message)

    async def _compaction_loop(self, retention: Retention) -> None:
        """etcd's automatic compaction (``autocompact.py``): every member samples the
        store's revision, and the member leading shard 0 compacts, so a new leader goes
        on from its own samples."""
        loop = asyncio.get_running_loop()
        every = range(self.shards)
        backend, router = self.backend, self.router
        revision: Callable[[], Awaitable[int]]
        writes_ago: Callable[[int], Awaitable[int]]
        compact: Callable[[rpc_pb2.CompactionRequest], Awaitable[object]]
        if router is not None:  # worker 0 of several: every worker's shards
            revision, writes_ago = router.store_revision, router.revision_writes_ago
            compact = router.compact_across
        else:
            async def revision() -> int:
                return backend.revision_state(every)[0]

            async def writes_ago(n: int) -> int:
                return backend.revision_writes_ago(n)

            compact = backend.compact
        c = autocompact.compactor(retention, loop.time())
        while True:
            await asyncio.sleep(c.step)
            now = loop.time()
            try:
                at = await c.decide(now, self.host.group(KV_GROUP).core.role == Role.LEADER,
                                    revision, writes_ago)
            except Exception as e:  # e.g. a worker that did not answer: asked next step
                log.info("automatic compaction: the store's revisions not known now: %s", e)
                continue
            if at is None:
                continue
            try:
                await compact(rpc_pb2.CompactionRequest(revision=at))
                log.info("automatic compaction at revision %d (%s)", at, retention.kept())
            except EtcdError as e:
                if e.message != MSG_COMPACTED:  # etcd counts "compacted" as done
                    log.info("automatic compaction at revision %d deferred: %s", at, e.message)
                    continue
            except Exception:  # one failed attempt must not end automatic compaction
                log.warning("automatic compaction at revision %d failed", at, exc_info=True)
                continue
            c.done(now, at)
            self.metrics.auto_compactions += 1

    async def _balance_loop(self) -> None:
        """Move leaderships toward the nodes their requests arrive at, else spread them
        evenly, one move at a time (see ``balance.py``)."""
        self.host.take_loads()
        led = {gid for gid, g in self.host.groups.items() if g.core.leader_id == self.member_id}
        while True:
            await asyncio.sleep(self.config.leader_balance_interval / 1000)
            groups = self.host.groups
            gone = self.cluster.removed  # still voters until their groups drop them
            loads = self.host.take_loads()
            leaders = {gid: g.core.leader_id for gid, g in groups.items()}
            led_now = {gid for gid, lead in leaders.items() if lead == self.member_id}
            moves = plan_moves(
                self.member_id,
                leaders,
                {gid: tuple(v for v in g.core.conf_state.voters if v not in gone)
                 for gid, g in groups.items()},
                loads,
                min_requests=self.config.leader_follow_requests,
                arrived=led_now - led,
            )
            led = led_now
            for gid, target in moves:
                if self.transport.connected(target):
                    said = {f"{n:x}": c for n, c in loads.get(gid, {}).items()}
                    log.info("moving leadership of group %d to node %x (%s)", gid, target,
                             f"this interval's requests by arrival node: {said}" if said
                             else "no requests this interval: by count",
                             extra={"group": gid})
                    self.host.transfer_leader(gid, target)
                    self.metrics.leader_moves += 1

    async def _progress_loop(self) -> None:
        """etcd's periodic progress notifications to idle watchers that asked for them,
        at the store's current revision (over several shards the idle ones are floored
        there first, when there is a watcher to tell). Every worker runs it: a watch
        stream lands on whichever worker accepted its connection."""
        interval = self.config.watch_progress_notify_interval / 1000
        while True:
            await asyncio.sleep(interval)
            await notify_progress_now(self.backend)

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop serving and close everything; ``graceful`` first hands leaderships over
        (``False``: as a crash looks to the peers, which must elect new leaders; used by
        ``accord.testing`` to kill an in-process node)."""
        if graceful:
            await self._transfer_leaderships()
        if self._health is not None:
            await self._health.stop()  # readiness says no from now on
        if self._prober is not None:
            await self._prober.stop()
        if getattr(self, "checkpoints", None) is not None:
            self.checkpoints.watchers.close()  # WatchLatest streams end before the server stops
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.grpc is not None:
            with contextlib.suppress(Exception):
                await self.grpc.stop(0.5)
        if self._forward_server is not None:
            await self._forward_server.stop()
        for client in self._forward_clients.values():
            await client.close()
        if getattr(self, "backend", None) is not None:
            await self.backend.xcoord.close()
        if self.http is not None:
            await self.http.stop()
        self.metrics.detach()
        if getattr(self, "membership", None) is not None:
            await self.membership.stop()  # a graceful SWIM leave
        await self.host.stop()
        await self.transport.stop()
        if self.wal is not None:
            self.wal.close()

    async def _transfer_leaderships(self) -> None:
        led = [gid for gid, g in self.host.groups.items() if g.core.role == Role.LEADER]
        peers = [n for n in self.host.group(self.home_group).core.conf_state.voters
                 if n != self.member_id and self.transport.connected(n)]
        if not led or not peers:
            return  # nobody to hand over to (the last member, or the others down): no wait
        for i, gid in enumerate(led):
            self.host.transfer_leader(gid, peers[i % len(peers)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.0
        while loop.time() < deadline:
            if all(self.host.group(g).core.role != Role.LEADER for g in led):
                return
            await asyncio.sleep(0.02)


SHARDS_FILE = "shards"
MEMBER_FILE = "member"


def initial_table(cfg: Config, shards: int) -> ClusterStateMachine:
    """The meta group's table of a cluster bootstrapped from ``--initial-cluster``: its
    members, and every shard on all of them (also what a restore starts a cluster with)."""
    ids = cfg.member_ids()
    voters = tuple(sorted(ids.values()))
    initial = {ids[name]: MemberRecord(ids[name], name, tuple(urls))
               for name, urls in cfg.members().items()}
    return ClusterStateMachine(
        initial, [ShardPlacement(i, kv_group(i), voters) for i in range(shards)],
        auth=auth_machine(cfg))


def _read_member_file(data_dir: Path) -> tuple[int, bool] | None:
    """(member id, joined at runtime) recorded by an earlier start, or None."""
    path = data_dir / MEMBER_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    fields = dict(line.split("=", 1) for line in text.split() if "=" in line)
    try:
        return int(fields["id"], 16), fields["joined"] == "1"
    except (KeyError, ValueError):
        raise ConfigError(f"{path}: expected 'id=<hex>' and 'joined=0|1', found {text!r}; "
                          "the data directory is damaged") from None


def write_member_file(data_dir: Path, member_id: int, joined: bool) -> None:
    """Record the member id and how the member started (once, durably)."""
    path = data_dir / MEMBER_FILE
    if not path.exists():
        write_durably(path, f"id={member_id:x}\njoined={int(joined)}\n")


def make_dir_durably(path: Path) -> None:
    """Create ``path`` and its missing parents, each made durable in its parent.

    Without the parent's fsync a power cut soon after the first start could take the
    whole data directory with it (the member id, the log and the vote in it)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        fsync_dir(d.parent)


def write_durably(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file, fsync, rename, fsync the dir)."""
    replace_durably(path, text.encode())


def check_shard_count(data_dir: Path, shards: int) -> int:
    """The number of KV shards, fixed when the member's data directory was created.

    Recorded in ``<data-dir>/shards`` on first start; a restart with another
    ``--shards`` is refused (keys would map to other shards and be lost from view)."""
    path = data_dir / SHARDS_FILE
    if path.exists():
        text = path.read_text().strip()
        if not text.isdigit():
            raise ConfigError(f"{path}: expected the shard count, found {text!r}")
        recorded = int(text)
        if recorded != shards:
            raise ConfigError(
                f"--shards {shards} does not match this member's data directory, created "
                f"with --shards {recorded}: the number of shards is fixed when a cluster is "
                f"created (start with --shards {recorded})")
        return recorded
    write_durably(path, f"{shards}\n")
    return shards


def _secrets(config: Config) -> list[str]:
    """Values of ``config`` that must never appear in a log line (the gossip keys)."""
    keys = [k.strip() for k in config.gossip_key.split(",") if k.strip()]
    return [config.gossip_key.strip(), *keys, *(k.lower() for k in keys), *(k.upper() for k in keys)]


GC_THRESHOLDS = (10_000, 20, 10)
"""The collector's thresholds in a serving node (CPython's default: 700, 10, 10)."""


def tune_gc() -> None:
    """Make the cyclic garbage collector cheaper for a long-running server.

    Everything alive once the node has started (modules, gRPC, the recovered store) is
    moved out of the collector's sight (``gc.freeze``): it lives as long as the process
    and would otherwise be traversed by every full collection. Young collections run
    after 10,000 net container allocations instead of 700, and the older generations
    less often. Reference counting still frees all acyclic garbage at once; only cycles
    wait longer. Measured with ``bench/kv.py`` (put:256, get:256, watch:1000, 2 rounds,
    3 nodes): time spent collecting 4.4 s -> 0.8 s, longest full collection 183 -> 36 ms.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(config: Config, log_context: logs.LogContext | None = None,
                worker: int = 0, socket_dir: Path | None = None) -> int:
    """Run a node (or worker ``worker`` of one, its sockets in ``socket_dir``) until
    SIGTERM/SIGINT or a fatal storage error."""
    node = Node(config, worker, socket_dir)
    if log_context is not None:
        log_context.set_node(node.config.name, node.member_id)
    await node.start()
    tune_gc()
    cfg = node.config
    metrics = ""
    if node.http is not None and node.plan is None:  # else the supervisor serves them
        metrics = "; metrics on " + ", ".join(f"{u.rstrip('/')}/metrics" for u in cfg.metrics_urls())
    which = f" worker {worker} of {cfg.workers}" if cfg.workers > 1 else ""
    print(f"accord node {cfg.name}{which} (id {node.member_id:x}) serving clients on "
          + ", ".join(cfg.advertise_client_urls) + metrics, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if cfg.workers > 1:
        # A worker stops when its supervisor says so (SIGTERM); a Ctrl-C reaches the
        # whole process group, and a worker leaving on it first would look like a crash.
        stops: tuple[signal.Signals, ...] = (signal.SIGTERM,)
    else:
        stops = (signal.SIGINT, signal.SIGTERM)
    for sig in stops:
        loop.add_signal_handler(sig, stop.set)
    fatal = asyncio.create_task(node.host.wait_fatal())
    stopper = asyncio.create_task(stop.wait())
    removed = asyncio.create_task(node.removed.wait())
    try:
        await asyncio.wait({fatal, stopper, removed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (fatal, stopper, removed):
            t.cancel()
        await node.stop()
    if node.host.fatal is not None:
        print(f"accord: node stopped: {node.host.fatal}", file=sys.stderr)
        return 1
    if node.removed.is_set():
        reason = node.members.stopped_reason
        print(f"accord: node stopped: {reason}", file=sys.stderr)
        left = reason.startswith("this member was removed")
        if cfg.workers > 1:  # the supervisor stops the node instead of restarting this one
            return REMOVED_EXIT if left else MISFIT_EXIT
        return 0 if left else 1
    return 0


WORKER_ENV = "ACCORD_WORKER_INDEX"
"""Set by the supervisor in each worker's environment (``supervisor.py``)."""
SUPERVISOR_ENV = "ACCORD_SUPERVISOR_PID"
"""The supervisor's pid, in each worker's environment: a worker whose supervisor is gone
stops at once (and the kernel kills it when the supervisor dies later)."""
SOCKETS_ENV = "ACCORD_WORKER_SOCKETS"
"""The directory, in each worker's environment, where the node's workers keep their
forwarding and metrics sockets: made by the supervisor in the system's temporary
directory (mode 0700) and removed when it exits, so the data directory may be on a file
system without Unix sockets (FUSE, some network file systems) or have a long path."""


def check_layout(config: Config) -> WorkerPlan | None:
    """Before a node starts: its worker layout (``placement.py``), checked, and the worker
    count recorded in (or checked against) its data directory; None for one worker.
    Raises ``ConfigError``."""
    base = Path(config.resolved().data_dir)
    try:
        if config.workers == 1:
            if (base / WORKERS_FILE).exists():
                check_workers(base, 1)
            return None
        plan = WorkerPlan(config.workers, config.shards)
        _host, port = config.resolved().peer_listen_address()
        plan.peer_port(port, config.workers - 1)
        make_dir_durably(base)
        check_workers(base, config.workers)
        return plan
    except PlacementError as e:
        raise ConfigError(str(e)) from None


def metrics_addresses(cfg: Config, client_tls: ReloadingTLS | None,
                      ) -> list[tuple[str, int, ssl.SSLContext | None]]:
    """Where the metrics listener binds: ``(host, port, TLS context or None)`` of each
    metrics URL, an https:// one served with the client certificate, following its
    rotation (config validation made sure there is one)."""
    out: list[tuple[str, int, ssl.SSLContext | None]] = []
    for url, (host, port) in zip(cfg.metrics_urls(), cfg.metrics_listen_addresses(),
                                 strict=True):
        context = None
        if cfg.metrics_url_is_tls(url):
            if client_tls is None:
                raise ConfigError("listen-metrics-urls: https:// needs --cert-file and "
                                  "--key-file")
            context = following(client_tls.server_context)
        out.append((host, port, context))
    return out


async def supervise(config: Config, argv: Sequence[str]) -> int:
    """``accord serve --workers N``: run the node's N workers (each ``accord serve`` with
    the same arguments and its index in ``ACCORD_WORKER_INDEX``), restart one that dies,
    stop them all on SIGTERM/SIGINT."""
    cfg = config.resolved()
    sockets = Path(tempfile.mkdtemp(prefix=f"accord-{cfg.name}-"))
    try:
        return await _supervise(cfg, argv, sockets)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


async def _supervise(cfg: Config, argv: Sequence[str], sockets: Path) -> int:
    """:func:`supervise` with the workers' sockets in ``sockets``."""
    plan = WorkerPlan(cfg.workers, cfg.shards)
    try:
        for k in range(cfg.workers):
            plan.forward_socket(sockets, k)
            plan.metrics_socket(sockets, k)
    except PlacementError as e:
        print(f"accord serve: {e}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "accord", "serve", *argv]
    sup = Supervisor([cmd] * cfg.workers, env={SUPERVISOR_ENV: str(os.getpid()),
                                               SOCKETS_ENV: str(sockets)})
    http: WorkersMetricsServer | None = None
    if cfg.metrics_enabled:
        files = client_files(cfg)
        http = WorkersMetricsServer([plan.metrics_socket(sockets, k)
                                     for k in range(cfg.workers)])
        await http.start(metrics_addresses(cfg, ReloadingTLS(files) if files else None))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await sup.start()
        metrics = ("; metrics on " + ", ".join(f"{u.rstrip('/')}/metrics"
                                               for u in cfg.metrics_urls())
                   if http is not None else "")
        print(f"accord node {cfg.name}: supervising {cfg.workers} workers (pids "
              + ", ".join(str(w.pid) for w in sup.workers) + ")" + metrics, flush=True)
        stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        failed: asyncio.Future[Any] = sup.failed
        try:
            await asyncio.wait({stopper, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            await sup.stop()
    finally:
        if http is not None:
            await http.stop()
    if sup.failed.done():
        print(f"accord serve: {sup.failed.result()}", file=sys.stderr)
        return sup.exit_code
    return 0


def _die_with_supervisor(supervisor_pid: int) -> None:
    """Ask the kernel to kill this worker when its supervisor dies (Linux), and stop now
    if it already has (a kill -9 of the supervisor must not leave workers serving)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != supervisor_pid:
        raise SystemExit(1)


def main(argv: Sequence[str]) -> int:
    """Entry point of ``accord serve``."""
    try:
        config = load_config(argv, os.environ)
        worker_env = os.environ.get(WORKER_ENV)
        if worker_env is None:
            plan = check_layout(config)
        elif config.workers > 1 and worker_env.isdigit() and int(worker_env) < config.workers:
            plan = WorkerPlan(config.workers, config.shards)
        else:
            raise ConfigError(f"{WORKER_ENV}={worker_env!r} names no worker of --workers "
                              f"{config.workers}")
    except ConfigError as e:
        print(f"accord serve: {e}", file=sys.stderr)
        return 2
    if plan is not None and worker_env is None:
        logs.configure(config.log_format or logs.default_format(sys.stderr), config.log_level)
        return int(asyncio.run(supervise(config, argv)))
    worker = 0
    if worker_env is not None:
        worker = int(worker_env)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops it (SIGTERM)
        _die_with_supervisor(int(os.environ.get(SUPERVISOR_ENV, "0")))
    ctx = logs.configure(config.log_format or logs.default_format(sys.stderr), config.log_level)
    ctx.redact(_secrets(config))
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    sockets = os.environ.get(SOCKETS_ENV) if worker_env is not None else None
    try:
        return int(runner(serve(config, ctx, worker, Path(sockets) if sockets else None)))
    except ConfigError as e:
        print(f"accord serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"accord serve: {e}", file=sys.stderr)
        return 1
