"""A node's Prometheus metrics: one registry per node, read from the node at scrape time.

Nothing here runs per request. ``NodeCollector.collect`` reads the counters and state
the parts already keep (the host's groups, the WAL's and the transport's stats, the
watch hubs, the lease tables, SWIM's view and counters, the scheduler's replica) when
Prometheus scrapes, every 15 s or so: a scrape of a node with 10,000 groups walks them
once (a few ms), a put pays nothing. The few facts no part kept are gathered where they
happen, off the put path: leader changes from the groups' leader listeners (once per
election), the WAL's fsync durations through its ``on_fsync`` hook (once per write
batch, in the writer thread), placement latencies and preemptions from the scheduler's
leader loop (once per placement), peer round trips from ``peerprobe.py`` (every 5 s).

Names follow etcd where the meaning is the same, so etcd's dashboards and alerts work
(``etcd_server_has_leader``, ``etcd_server_proposals_*``,
``etcd_disk_wal_fsync_duration_seconds``, ``etcd_network_peer_round_trip_time_seconds``,
``etcd_mvcc_db_total_size_in_bytes``, ``etcd_debugging_mvcc_*``, ...); everything else
is ``accord_*``. Where etcd has one Raft group and accord many, the etcd series covers
all of this node's groups (see ``docs/ops/metrics.md``); label sets stay bounded however
many groups there are: per-group series exist only for the fixed groups (meta, the
scheduler, KV shard 0) and for the ``TOP_LAGGING`` groups with the largest apply lag.

Several nodes may live in one process (tests): each has its own ``CollectorRegistry``,
never the global one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from accord.membership.service import NodeMembership
from accord.membership.state import MemberState
from accord.node.backend import KV_GROUP, ReplicatedBackend
from accord.node.config import Config
from accord.node.grpc_server import AccordGrpcServer
from accord.node.health import raised_alarms
from accord.node.members import META_GROUP
from accord.raft.core.types import NO_NODE, Role
from accord.raft.host.multiraft import MultiRaftHost
from accord.raft.storage.wal import WriteAheadLog
from accord.raft.transport.links import PeerTransport
from accord.services.checkpoints.replicated import CheckpointGroup
from accord.services.kv.clockguard import ClockGuard
from accord.services.kv.statemachine import KVStateMachine
from accord.services.scheduling.replicated import SCHEDULING_GROUP, SchedulerShard

log = logging.getLogger("accord.node.metrics")

FSYNC_BUCKETS = tuple(0.001 * 2**i for i in range(14))
"""etcd's buckets for ``etcd_disk_wal_fsync_duration_seconds``: 1 ms .. 8.192 s."""
RTT_BUCKETS = tuple(0.0001 * 2**i for i in range(14))
"""etcd's buckets for ``etcd_network_peer_round_trip_time_seconds``: 0.1 ms .. 0.8192 s."""
PLACEMENT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Submit-to-placement seconds: from an idle cluster (tens of ms) to a long queue (an hour)."""
TOP_LAGGING = 5
"""Groups exported one by one in ``accord_raft_group_apply_lag_entries`` (the laggiest)."""
TOP_TENANTS = 20
"""Tenants exported one by one in the scheduler's queue gauge; the rest sum to ``_other``."""
DB_SIZE_MAX_AGE = 5.0
"""Seconds a measured data-directory size is reused by later scrapes (it walks the disk)."""
XTXN_COUNTERS = (
    ("committed", "Multi-shard transactions this member coordinated that committed "
                  "(Txns over several shards, lease revokes on every shard)."),
    ("aborted", "Aborts this member's coordinator proposed (a conflict, a refused "
                "prepare, a lost decision)."),
    ("retries", "Multi-shard Txn attempts prepared again after an abort."),
    ("resolved", "Intents of other coordinators' Txns this member resolved (a reader, "
                 "a writer or the recovery pass met them past their deadline)."),
    ("reserve_rounds", "RESERVE rounds run to agree on one revision (older formats)."),
)
"""The coordinator's counters (``xcoord.Coordinator.stats``), as ``accord_xtxn_*_total``."""

_ROLE_NAMES = {Role.FOLLOWER: "follower", Role.PRE_CANDIDATE: "pre_candidate",
               Role.CANDIDATE: "candidate", Role.LEADER: "leader"}


class Buckets:
    """A histogram's counts: fixed upper bounds, one writer, read at scrape time.

    Lighter than ``prometheus_client.Histogram`` (no lock, no label lookup): ``observe``
    is one bisect and two additions, ~0.15 us against ~1.2 us. One thread writes; a
    scrape from another reads a snapshot that may miss the observation in flight, never
    a torn one (``count`` is derived from the buckets, so ``+Inf`` equals it).
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("bucket bounds must be distinct and increasing")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count at or below)`` for every bound and ``+Inf``, Prometheus' shape."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((_le(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


def histogram(name: str, doc: str, labels: Sequence[str] = (),
              series: Iterable[tuple[Sequence[str], Buckets]] = ()) -> HistogramMetricFamily:
    """A histogram family from ``(label values, Buckets)`` pairs."""
    fam = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, b in series:
        fam.add_metric(list(values), b.cumulative(), b.total)
    return fam


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class MonitoredNode(Protocol):
    """What the collectors read of a started node (``server.Node`` fits)."""

    @property
    def config(self) -> Config: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def member_id(self) -> int: ...

    @property
    def host(self) -> MultiRaftHost: ...

    @property
    def transport(self) -> PeerTransport: ...

    @property
    def wal(self) -> WriteAheadLog | None: ...

    @property
    def backend(self) -> ReplicatedBackend: ...

    @property
    def grpc(self) -> AccordGrpcServer | None: ...

    @property
    def hosts_node_services(self) -> bool:
        """Whether ``membership``, ``scheduling`` and ``checkpoints`` exist here (a worker
        other than 0 of a node of several runs none of them)."""

    @property
    def membership(self) -> NodeMembership: ...

    @property
    def scheduling(self) -> SchedulerShard: ...

    @property
    def machines(self) -> list[KVStateMachine]: ...

    @property
    def checkpoints(self) -> CheckpointGroup: ...

    @property
    def clock(self) -> ClockGuard: ...


class NodeMetrics:
    """The metrics of one node: its registry and the few counts no part keeps.

    Build it once the groups exist and before the host starts (``watch_groups`` must see
    the first election), then ``attach`` once the gRPC server and SWIM exist.
    """

    def __init__(self, member_id: int) -> None:
        self.member_id = member_id
        self.registry = CollectorRegistry(auto_describe=False)
        self.leader_changes = 0
        """New leaders seen by this node's groups (etcd's ``leader_changes_seen``)."""
        self.leader_moves = 0
        """Leaderships this node's balancer handed to another member."""
        self.auto_compactions = 0
        """Compactions this node's automatic compactor made (``--auto-compaction-*``)."""
        self.health_success = 0
        self.health_failures = 0
        self.fsync = Buckets(FSYNC_BUCKETS)
        self.placement = Buckets(PLACEMENT_BUCKETS)
        self.preemptions = 0
        self.peer_rtt: dict[int, Buckets] = {}
        """Peer member id -> round trips measured by ``peerprobe.PeerProber``."""
        self.peer_probe_failures: dict[int, int] = {}
        """Peer member id -> probes that failed or timed out."""
        self._last_leader: dict[int, int] = {}
        self._db_size = 0
        self._db_size_at = float("-inf")
        self._node: MonitoredNode | None = None
        self._sources: list[Collector] = []

    # ------------------------------------------------------------------ feeding
    def watch_groups(self, host: MultiRaftHost) -> None:
        """Count leader changes of every hosted group (call before the host starts)."""
        for g in host.groups.values():
            self._last_leader.setdefault(g.id, NO_NODE)
            g.leader_listeners.append(self._leader_seen)

    def _leader_seen(self, group_id: int, leader: int) -> None:
        """A group's soft state changed: a new known leader is a leader change (etcd's
        rule: a leader after a spell without one counts again)."""
        last = self._last_leader.get(group_id, NO_NODE)
        if leader != NO_NODE and leader != last:
            self.leader_changes += 1
        self._last_leader[group_id] = leader

    def placed(self, latency: float) -> None:
        """A job was placed ``latency`` seconds after it was submitted (leader only)."""
        self.placement.observe(max(0.0, latency))

    def preempted(self, n: int) -> None:
        """``n`` running jobs were preempted by a committed decision (leader only)."""
        self.preemptions += n

    def health_checked(self, ok: bool) -> None:
        """One ``/health`` answer (etcd's ``health_success`` / ``health_failures``)."""
        if ok:
            self.health_success += 1
        else:
            self.health_failures += 1

    def add_source(self, collector: Collector) -> None:
        """Register another collector on this node's registry (a service's own metrics:
        the checkpoint service's commits and GC plug in here)."""
        self._sources.append(collector)
        self.registry.register(collector)

    def attach(self, node: MonitoredNode, *extra: Collector) -> None:
        """Start exporting ``node`` (and ``extra`` collectors, e.g. the gRPC one)."""
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

        self._node = node
        wal = node.wal
        if wal is not None:
            wal.on_fsync = self.fsync.observe
        if node.hosts_node_services:
            node.scheduling.on_placed = self.placed
            node.scheduling.on_preempted = self.preempted
        self.registry.register(NodeCollector(node, self))
        for c in extra:
            self.registry.register(c)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def detach(self) -> None:
        """Stop the hooks (node shutdown): the WAL and scheduler no longer call in."""
        node = self._node
        if node is None:
            return
        if node.wal is not None:
            node.wal.on_fsync = None
        if node.hosts_node_services:
            node.scheduling.on_placed = None
            node.scheduling.on_preempted = None

    # ------------------------------------------------------------------ scrape
    @property
    def db_size(self) -> int:
        """The data directory's size at the last ``refresh``."""
        return self._db_size

    async def refresh(self) -> None:
        """Measure what cannot be read on the loop (the data directory's size, off it),
        at most every ``DB_SIZE_MAX_AGE`` seconds; call before ``exposition``."""
        node = self._node
        loop = asyncio.get_running_loop()
        if node is None or loop.time() - self._db_size_at < DB_SIZE_MAX_AGE:
            return
        self._db_size_at = loop.time()
        with contextlib.suppress(OSError):
            self._db_size = await node.backend.db_size()


class NodeCollector(Collector):
    """Reads one node's state into metric families at every scrape."""

    def __init__(self, node: MonitoredNode, metrics: NodeMetrics) -> None:
        self._node = node
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        """Every family (called by the registry on the event loop, per scrape)."""
        start = time.perf_counter()
        yield from self._raft()
        yield from self._storage()
        yield from self._kv()
        yield from self._network()
        if self._node.hosts_node_services:
            yield from self._swim()
            yield from self._scheduler()
            yield from self._checkpoints()
        m = self._m
        # etcd's names have no _total, which a counter must have in OpenMetrics: gauges here.
        yield _gauge("etcd_server_health_success", "The total number of successful /health checks.",
                     m.health_success)
        yield _gauge("etcd_server_health_failures", "The total number of failed /health checks.",
                     m.health_failures)
        yield _gauge("accord_metrics_collect_seconds",
                     "Seconds this node took to read its state for this scrape.",
                     time.perf_counter() - start)

    # -- raft ----------------------------------------------------------------------------
    def _raft(self) -> Iterator[Metric]:
        node, m = self._node, self._m
        host = node.host
        groups = host.groups
        roles: Counter[str] = Counter()
        committed = applied = pending = leaderless = 0
        lags: list[tuple[int, int]] = []
        kv_lag = kv_term = 0
        for gid, g in groups.items():
            core = g.core
            roles[_ROLE_NAMES[core.role]] += 1
            commit = core.commit_index
            committed += commit
            applied += g.applied
            pending += len(g.proposals)
            if core.leader_id == NO_NODE:
                leaderless += 1
            lag = max(0, commit - g.applied)
            if lag:
                lags.append((lag, gid))
            if gid not in (META_GROUP, SCHEDULING_GROUP):
                kv_lag = max(kv_lag, lag)
                kv_term = max(kv_term, core.term)
        yield _gauge("etcd_server_has_leader",
                     "Whether every Raft group on this member knows a leader (1) or not (0).",
                     1 if groups and leaderless == 0 else 0)
        kv0 = groups.get(KV_GROUP)
        yield _gauge("etcd_server_is_leader",
                     "Whether this member leads KV shard 0, the group etcd clients see (1) or not (0).",
                     1 if kv0 is not None and kv0.core.role == Role.LEADER else 0)
        yield _counter("etcd_server_leader_changes_seen_total",
                       "The number of leader changes seen, summed over this member's groups.",
                       m.leader_changes)
        yield _gauge("etcd_server_proposals_committed_total",
                     "Committed Raft entries, summed over this member's groups (commit indexes).",
                     committed)
        yield _gauge("etcd_server_proposals_applied_total",
                     "Applied Raft entries, summed over this member's groups.", applied)
        yield _gauge("etcd_server_proposals_pending",
                     "Proposals of this member waiting to be committed and applied.", pending)
        yield _counter("etcd_server_proposals_failed_total",
                       "Proposals of this member that failed (no leader, timeout, leader changed).",
                       host.proposals_failed)
        fam = GaugeMetricFamily("accord_raft_groups", "Raft groups on this member by role.",
                                labels=["role"])
        for role in _ROLE_NAMES.values():
            fam.add_metric([role], roles.get(role, 0))
        yield fam
        yield _gauge("accord_raft_groups_quiesced",
                     "Groups on this member that stopped ticking while idle.",
                     len(groups) - host.active_groups)
        yield _gauge("accord_raft_groups_without_leader",
                     "Groups on this member that know no leader now.", leaderless)
        term = GaugeMetricFamily("accord_raft_term", "Raft term (kv: the highest over the KV shards).",
                                 labels=["group"])
        lag_fam = GaugeMetricFamily("accord_raft_apply_lag_entries",
                                    "Committed entries not yet applied here (kv: the most of any shard).",
                                    labels=["group"])
        leader = GaugeMetricFamily("accord_raft_leader_is_self",
                                   "Whether this member leads the group (1) or not (0).",
                                   labels=["group"])
        for label, gid in (("meta", META_GROUP), ("scheduling", SCHEDULING_GROUP), ("kv0", KV_GROUP)):
            fixed = groups.get(gid)
            if fixed is None:
                continue
            term.add_metric([label], fixed.core.term)
            lag_fam.add_metric([label], max(0, fixed.core.commit_index - fixed.applied))
            leader.add_metric([label], 1 if fixed.core.role == Role.LEADER else 0)
        term.add_metric(["kv"], kv_term)
        lag_fam.add_metric(["kv"], kv_lag)
        yield term
        yield lag_fam
        yield leader
        top = GaugeMetricFamily("accord_raft_group_apply_lag_entries",
                                f"Apply lag of the {TOP_LAGGING} groups that lag most (only those "
                                "that lag).", labels=["group"])
        for lag, gid in sorted(lags, reverse=True)[:TOP_LAGGING]:
            top.add_metric([str(gid)], lag)
        yield top
        yield _counter("accord_raft_leader_moves_total",
                       "Leaderships this member's balancer handed to another member.", m.leader_moves)
        yield _counter("accord_mvcc_auto_compactions_total",
                       "Compactions this member's automatic compactor made "
                       "(--auto-compaction-mode/-retention).", m.auto_compactions)
        yield _counter("accord_raft_fast_elections_total",
                       "Groups that campaigned early because the link to their leader was lost.",
                       host.fast_elections)
        yield _counter("accord_raft_read_index_resent_total",
                       "ReadIndex rounds sent again after going unanswered for 0.5 s "
                       "(a message lost on the way).", host.reads.resent)
        yield _counter("accord_raft_turns_total", "Poll-loop turns that wrote to the log.", host.turns)

    # -- storage --------------------------------------------------------------------------
    def _storage(self) -> Iterator[Metric]:
        wal = self._node.wal
        m = self._m
        yield histogram("etcd_disk_wal_fsync_duration_seconds",
                        "The latency distributions of fsync called by the WAL.",
                        series=[((), m.fsync)])
        if wal is None:
            return
        st = wal.stats
        yield _counter("etcd_disk_wal_write_bytes_total", "Bytes written to the WAL.",
                       st.bytes_written)
        yield _counter("accord_wal_writes_total", "Write calls to the WAL (one per batch of turns).",
                       st.writes)
        yield _counter("accord_wal_fsyncs_total", "fsync calls on WAL files.", st.fsyncs)
        yield _counter("accord_wal_records_total", "Records appended to the WAL.", st.records)
        yield _counter("accord_wal_segments_created_total", "WAL segments created.",
                       st.segments_created)
        yield _counter("accord_wal_segments_deleted_total", "WAL segments deleted (log GC).",
                       st.segments_deleted)

    # -- kv ---------------------------------------------------------------------------------
    def _kv(self) -> Iterator[Metric]:
        node = self._node
        keys = watchers = slow = 0
        leases = len(node.machines[0].leases.leases) if node.machines else 0  # shard 0: their home
        for sm in node.machines:
            keys += len(sm.store.keys)
            hub = sm.watch_hub
            watchers += len(hub)
            slow += hub.unsynced
        yield _gauge("etcd_mvcc_db_total_size_in_bytes",
                     "Bytes this member keeps on disk (log segments and snapshots).", self._m.db_size)
        yield _gauge("etcd_server_quota_backend_bytes", "Storage quota in bytes.",
                     node.config.quota_backend_bytes)
        yield _gauge("etcd_debugging_mvcc_keys_total",
                     "Keys in the index (deleted ones count until compaction), all shards.", keys)
        yield _gauge("etcd_debugging_mvcc_watcher_total", "Watchers on this member.", watchers)
        yield _gauge("etcd_debugging_mvcc_slow_watcher_total",
                     "Watchers still catching up from history (unsynced).", slow)
        grpc = node.grpc
        yield _gauge("etcd_debugging_mvcc_watch_stream_total", "Watch streams on this member.",
                     grpc.watch.open_streams if grpc is not None else 0)
        yield _counter("accord_watch_slow_cancels_total",
                       "Watchers cancelled because their client fell too far behind.",
                       sum(sm.watch_hub.slow_cancels for sm in node.machines))
        yield _gauge("accord_leases", "Leases granted and not yet expired or revoked.", leases)
        for field, doc in XTXN_COUNTERS:
            yield _counter(f"accord_xtxn_{field}_total", doc, node.backend.xcoord.stats[field])
        alarms = GaugeMetricFamily("accord_alarms", "Alarms raised in the cluster, by type.",
                                   labels=["alarm"])
        for name, n in Counter(raised_alarms(node.backend)).items():
            alarms.add_metric([name], n)
        yield alarms

    # -- network ------------------------------------------------------------------------------
    def _network(self) -> Iterator[Metric]:
        st = self._node.transport.stats
        yield histogram("etcd_network_peer_round_trip_time_seconds",
                        "Round-trip time to each peer (a gRPC health check every 5 s).",
                        labels=["To"],
                        series=[((f"{peer:x}",), b) for peer, b in sorted(self._m.peer_rtt.items())])
        failures = CounterMetricFamily("accord_network_peer_probe_failures_total",
                                       "Round-trip probes of a peer that failed or timed out.",
                                       labels=["To"])
        for peer, n in sorted(self._m.peer_probe_failures.items()):
            failures.add_metric([f"{peer:x}"], n)
        yield failures
        clock = self._node.clock
        offsets = GaugeMetricFamily(
            "accord_peer_clock_offset_seconds",
            "Each peer's wall clock minus this member's, at the last probe (known to within "
            "half its round trip).", labels=["To"])
        for peer, sample in sorted(clock.samples().items()):
            offsets.add_metric([f"{peer:x}"], sample.offset_us / 1e6)
        yield offsets
        yield _counter("accord_clock_refusals_total",
                       "Writes refused because this member's clock disagreed with the "
                       "cluster's or had just stepped.", clock.refusals)
        yield _counter("accord_clock_steps_total",
                       "Steps of this member's wall clock seen (moves unlike its monotonic "
                       "clock).", clock.steps)
        for field, doc in (("msgs_sent", "Raft messages sent to peers."),
                           ("msgs_received", "Raft messages received from peers."),
                           ("msgs_dropped", "Raft messages dropped (no link, queue full, stalled peer)."),
                           ("connects", "Outbound peer connections established."),
                           ("peers_lost", "Peer links that closed and could not be redialed."),
                           ("snapshot_pieces_sent", "Snapshot pieces streamed to peers.")):
            yield _counter(f"accord_transport_{field}_total", doc, getattr(st, field))

    # -- swim -----------------------------------------------------------------------------------
    def _swim(self) -> Iterator[Metric]:
        ms = self._node.membership
        if not ms.running:
            return
        states: Counter[str] = Counter(m.state.name.lower() for m in ms.swim_members())
        fam = GaugeMetricFamily("accord_swim_members", "SWIM members known here, by state.",
                                labels=["state"])
        for st in MemberState:
            fam.add_metric([st.name.lower()], states.get(st.name.lower(), 0))
        yield fam
        stats = ms.protocol_stats()
        if stats is None:
            return
        for field, doc in (("suspicions", "Members this node started suspecting."),
                           ("dead_declared", "Suspicions of this node that timed out (member dead)."),
                           ("refutations", "Suspicions of this node it refuted."),
                           ("probes", "SWIM probes sent."),
                           ("probe_failures", "SWIM probes that got no ack.")):
            yield _counter(f"accord_swim_{field}_total", doc, getattr(stats, field))

    # -- scheduler ---------------------------------------------------------------------------------
    def _scheduler(self) -> Iterator[Metric]:
        shard = self._node.scheduling
        sm = shard.sm
        by_status: Counter[str] = Counter(r.status for r in sm.jobs.values())
        fam = GaugeMetricFamily("accord_scheduler_jobs", "Jobs in the scheduler, by status.",
                                labels=["status"])
        for status in ("pending", "running", "succeeded", "failed", "cancelled"):
            fam.add_metric([status], by_status.get(status, 0))
        yield fam
        tenants: Counter[str] = Counter(sm.jobs[j].job.tenant for j in sm.pending if j in sm.jobs)
        queue = GaugeMetricFamily(
            "accord_scheduler_queue_jobs",
            f"Pending jobs by tenant (the {TOP_TENANTS} with most; the rest as _other).",
            labels=["tenant"])
        top = tenants.most_common(TOP_TENANTS)
        for tenant, n in top:
            queue.add_metric([tenant], n)
        rest = sum(tenants.values()) - sum(n for _, n in top)
        if rest:
            queue.add_metric(["_other"], rest)
        yield queue
        nodes = GaugeMetricFamily("accord_scheduler_nodes", "Registered GPU nodes, by state.",
                                  labels=["state"])
        alive = sum(1 for n in sm.nodes.values() if n.alive and not n.drained)
        drained = sum(1 for n in sm.nodes.values() if n.alive and n.drained)
        nodes.add_metric(["ready"], alive)
        nodes.add_metric(["drained"], drained)
        nodes.add_metric(["dead"], len(sm.nodes) - alive - drained)
        yield nodes
        yield histogram("accord_scheduler_placement_latency_seconds",
                        "Seconds from a job's submission to its placement (counted by the leader).",
                        series=[((), self._m.placement)])
        yield _counter("accord_scheduler_preemptions_total",
                       "Running jobs preempted by placements this member committed as leader.",
                       self._m.preemptions)
        yield _counter("accord_scheduler_cycles_total",
                       "Scheduling cycles this member committed as leader.", shard.cycles)


    # -- checkpoints -------------------------------------------------------------------------------
    def _checkpoints(self) -> Iterator[Metric]:
        sm = self._node.checkpoints.sm
        yield GaugeMetricFamily("accord_checkpoint_jobs", "Jobs with checkpoint records.",
                                value=len(sm.jobs))
        by_state: Counter[str] = Counter(
            s.state for job in sm.jobs.values() for s in job.steps.values())
        steps = GaugeMetricFamily("accord_checkpoint_steps", "Checkpoint steps, by state.",
                                  labels=["state"])
        for state in ("pending", "committed", "aborted", "deleted"):
            steps.add_metric([state], by_state.get(state, 0))
        yield steps
        yield GaugeMetricFamily("accord_checkpoint_garbage_objects",
                                "Storage objects no kept manifest references (safe to delete, "
                                "not yet confirmed deleted).", value=len(sm.garbage))
        yield GaugeMetricFamily("accord_checkpoint_garbage_bytes",
                                "Bytes of those objects.",
                                value=sum(g.size for g in sm.garbage.values()))
        for field, doc in (
                ("commits", "Checkpoint steps committed (applied on this member)."),
                ("aborts", "Pending steps aborted by their job."),
                ("expired", "Pending steps aborted because their lease ran out."),
                ("gc_runs", "Checkpoint GC passes applied."),
                ("gc_deleted_steps", "Committed steps deleted by retention."),
                ("deletions_confirmed", "Storage objects confirmed deleted after GC.")):
            yield _counter(f"accord_checkpoint_{field}_total", doc, sm.stats[field])
        batches = self._node.checkpoints.coalescer
        yield _counter("accord_checkpoint_register_batches_total",
                       "Raft entries this member proposed for registrations (concurrent "
                       "ones share an entry).", batches.batches)
        yield _counter("accord_checkpoint_registrations_proposed_total",
                       "Registrations this member proposed (in those entries).",
                       batches.commands)


def exposition(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The registry in the format ``accept`` asks for (OpenMetrics or Prometheus text)."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type

