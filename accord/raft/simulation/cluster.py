"""The simulation proper: a seeded cluster of cores over a simulated network and clock.

``Simulation`` owns the nodes, the network queue and the checker; it delivers
messages, hands every Ready to the node's disk and state machine in the order of
duty, and checks invariants after every round. ``nemesis.py`` decides the
faults and client requests of each tick.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from accord.raft.core.raft import Config, RaftCore
from accord.raft.core.types import (
    Entry,
    EntryType,
    Message,
    MessageType,
    ProposalDropped,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from accord.raft.simulation.checker import Checker
from accord.raft.simulation.model import (
    CoreFactory,
    InvariantViolation,
    Read,
    SimNode,
    SimResult,
    StateMachine,
    Write,
    apply_entry,
    decode_write,
    default_core,
    encode_write,
)
from accord.raft.simulation.nemesis import (
    client_step,
    describe_cc,
    fault_step,
    leader_commit_fault,
    new_leader_fault,
)
from accord.raft.simulation.profiles import (
    DRIFT_WINDOW,
    LEASE_DRIFT,
    PEER_LOST,
    ROUNDS_PER_TICK,
    SNAP_FAIL,
    SNAP_OK,
    UNREACHABLE,
    SimConfig,
    parse_profile,
)


class Simulation:
    """One seeded run: a cluster, a network, a fault schedule, a client and the checker."""

    def __init__(self, seed: int, config: SimConfig | None = None,
                 core_factory: CoreFactory = default_core, variant: str = "",
                 trace: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.cfg = config or SimConfig()
        self.factory = core_factory
        self.variant = variant
        self.trace_fn = trace
        self.rng = random.Random(seed)
        self.tick_no = 0
        self.round = 0
        total = self.cfg.nodes + self.cfg.spare
        self.nodes = {i: SimNode(i) for i in range(1, total + 1)}
        if self.cfg.profile.lease_read:
            # Fast clocks gain at most one tick per DRIFT_WINDOW ticks: within the lease
            # (election_tick - LEASE_DRIFT ticks) no follower's clock gains LEASE_DRIFT ticks.
            for node in self.nodes.values():
                node.fast_every = self.rng.choice((0, 0, DRIFT_WINDOW, DRIFT_WINDOW + 3))
        self.initial_voters = tuple(range(1, self.cfg.nodes + 1))
        self.started: set[int] = set()
        self.queue: list[tuple[int, int, int, Message]] = []
        self.reports: list[tuple[int, int, int, int, int]] = []
        """Transport reports due to senders: (round, sender, incarnation, peer, kind)."""
        self.seq = 0
        self.blocked: dict[tuple[int, int], int] = {}
        """Cut links (from, to) and the tick each is restored at."""
        self.lossless = False
        self.link_due: dict[tuple[int, int], int] = {}
        """Healed network only: the last delivery round per link, to keep links FIFO."""
        self.faults_on = False
        self.drop_filter: Callable[[Message], bool] | None = None
        """Scripted nemesis: messages for which it returns True are lost."""
        self.replay_hint = ""
        """Overrides the replay command in violation messages (scripted scenarios)."""
        self.acked_index: dict[str, int] = {}
        self.writes = 0
        self.writes_acked = 0
        self.reads_issued = 0
        self.reads_served = 0
        self.elections = 0
        self.checker = Checker(self._fail)
        for nid in self.initial_voters:
            self.start(nid)

    # -- reporting

    def _fail(self, what: str) -> None:
        c = self.cfg
        variant = f" --variant {self.variant}" if self.variant else ""
        if self.replay_hint:
            raise InvariantViolation(f"{what}\n  at tick {self.tick_no} (round {self.round}); "
                                     f"replay: {self.replay_hint}")
        raise InvariantViolation(
            f"{what}\n  at tick {self.tick_no} (round {self.round}); seed={self.seed} "
            f"profile={c.profile.name} nodes={c.nodes} ticks={c.ticks}{variant}\n"
            f"  replay: python -m accord.raft.simulation --seed {self.seed} "
            f"--profile {c.profile.name} --nodes {c.nodes} --ticks {c.ticks}{variant}")

    def trace(self, text: str) -> None:
        """Report one event to the trace callback, if any."""
        if self.trace_fn is not None:
            self.trace_fn(f"[tick {self.tick_no:4}] {text}")

    # -- node lifecycle

    def alive(self) -> list[SimNode]:
        """Nodes that are up, in id order."""
        return [n for n in self.nodes.values() if n.core is not None]

    def start(self, nid: int) -> None:
        """Boot (or reboot) a node from what its disk holds."""
        node = self.nodes[nid]
        node.incarnation += 1
        self.started.add(nid)
        small = self.cfg.profile.small_messages
        cfg = Config(id=nid, election_tick=self.cfg.election_tick, heartbeat_tick=1,
                     pre_vote=self.cfg.profile.pre_vote,
                     check_quorum=self.cfg.profile.check_quorum,
                     max_size_per_msg=1 if small else 1 << 20,
                     max_inflight_msgs=self.cfg.profile.max_inflight,
                     lease_read=self.cfg.profile.lease_read,
                     clock_drift_ticks=LEASE_DRIFT if self.cfg.profile.lease_read else 0,
                     seed=self.seed * 7919 + nid * 131 + node.incarnation)
        node.core = self.factory(cfg, node.disk.recovered(), self.initial_voters, ())
        node.sm = (StateMachine.decode(node.disk.snapshot_data) if node.disk.snapshot
                   else StateMachine())
        node.reads.clear()
        node.servable.clear()
        node.writes.clear()
        node.torn_crash = False
        node.conf_to_persist = None
        node.last_role = Role.FOLLOWER
        if node.incarnation > 1:
            self.trace(f"node {nid} restarts from disk: term {node.disk.hard_state.term}, "
                       f"{node.disk.last_index()} entries, commit {node.disk.hard_state.commit}")

    def crash(self, nid: int, torn: bool = False, down_ticks: int = 10) -> None:
        """Take a node down; ``torn`` strikes between sending a Ready's messages and its fsync."""
        node = self.nodes[nid]
        node.down_until = self.tick_no + down_ticks
        if torn:
            node.torn_crash = True
            return
        node.core = None
        node.reads.clear()
        node.servable.clear()
        node.writes.clear()
        self.trace(f"node {nid} CRASHES")
        p = self.cfg.profile
        if p.conn_loss and self.rng.random() < p.conn_loss:
            for other in self.alive():
                if (nid, other.id) in self.blocked:
                    continue  # a cut link carries no FIN either
                # TCP delivers what was sent before the FIN: the report comes after the
                # crashed node's messages still in flight to this node.
                last = max((due for due, _, _, m in self.queue
                            if m.frm == nid and m.to == other.id), default=0)
                after = max(self.rng.randint(1, p.max_delay), last + 1 - self.round)
                self.report_peer_lost(other.id, nid, after)

    def report_peer_lost(self, observer: int, peer: int, after_rounds: int = 1) -> None:
        """In ``after_rounds`` rounds, tell ``observer`` its link to ``peer`` is lost (the
        transport's peer-lost report, which the host turns into ``leader_unreachable``)."""
        node = self.nodes[observer]
        self.reports.append((self.round + after_rounds, observer, node.incarnation, peer,
                             PEER_LOST))

    def leader(self) -> SimNode | None:
        """The up node that leads the highest term, if any."""
        best: SimNode | None = None
        for n in self.alive():
            assert n.core is not None
            if n.core.role == Role.LEADER and (best is None or best.core is None
                                               or n.core.term > best.core.term):
                best = n
        return best

    # -- network

    def partition(self, pairs: set[tuple[int, int]], ticks: int) -> None:
        """Cut the given (from, to) links for ``ticks`` ticks."""
        until = self.tick_no + ticks
        for pair in pairs:
            self.blocked[pair] = max(until, self.blocked.get(pair, 0))

    def heal_partition(self) -> None:
        """Restore every link."""
        if self.blocked:
            self.trace("network heals")
        self.blocked.clear()

    def _send(self, node: SimNode, msgs: Sequence[Message]) -> None:
        p = self.cfg.profile
        for m in msgs:
            self._check_promise(node, m)
            if m.type == MessageType.SNAP and m.snapshot is not None:
                meta = m.snapshot.meta
                disk = node.disk
                if disk.snapshot is None or disk.snapshot.index != meta.index:
                    self._fail(f"node {node.id} sent a snapshot at {meta.index} it does not hold")
                m = replace(m, snapshot=Snapshot(meta, disk.snapshot_data))
                self.trace(f"node {node.id} sends snapshot at index {meta.index} to {m.to}")
            lost = (m.frm, m.to) in self.blocked or (
                not self.lossless and self.rng.random() < p.drop) or (
                self.drop_filter is not None and self.drop_filter(m))
            if lost:
                if m.type == MessageType.SNAP:
                    self.reports.append((self.round + 1, node.id, node.incarnation, m.to, SNAP_FAIL))
                elif (m.frm, m.to) in self.blocked and m.type == MessageType.APP:
                    # The transport notices a cut link and says so (etcd's ReportUnreachable).
                    self.reports.append((self.round + 1, node.id, node.incarnation, m.to,
                                         UNREACHABLE))
                continue
            copies = 2 if not self.lossless and self.rng.random() < p.dup else 1
            for _ in range(copies):
                self.seq += 1
                due = self.round + self.rng.randint(1, p.max_delay)
                if p.straggler and not self.lossless and self.rng.random() < p.straggler:
                    due += self.rng.randint(10, 40) * ROUNDS_PER_TICK
                if self.lossless:  # a healed link is FIFO, like the TCP transport
                    due = max(due, self.link_due.get((m.frm, m.to), 0))
                    self.link_due[(m.frm, m.to)] = due
                heapq.heappush(self.queue, (due, self.seq, node.incarnation,
                                            replace(m, entries=list(m.entries))))

    def _check_promise(self, node: SimNode, m: Message) -> None:
        """Acks promise durable state: a granted vote or an append ack must be on disk.

        A message of an older term than the disk's promises nothing more: once a
        later term is durable the node can never vote (or accept entries) in the
        older one again, so a vote or ack of that term cannot be contradicted.
        """
        hs = node.disk.hard_state
        if m.type == MessageType.VOTE_RESP and not m.reject and m.term >= hs.term and (
                hs.term != m.term or hs.vote != m.to):
            self._fail(f"node {node.id} granted its vote to {m.to} in term {m.term} before "
                       f"persisting it (disk: {hs})")
        last = node.disk.last_index()
        if (m.type == MessageType.APP_RESP and not m.reject and m.term >= hs.term
                and m.index > last):
            self._fail(f"node {node.id} acknowledged entries up to {m.index} in term {m.term} "
                       f"with only {last} on disk")

    def _deliver_due(self) -> None:
        due_reports = [r for r in self.reports if r[0] <= self.round]
        self.reports = [r for r in self.reports if r[0] > self.round]
        for _, frm, inc, to, kind in due_reports:
            sender = self.nodes[frm]
            if sender.core is None or sender.incarnation != inc:
                continue
            if kind == UNREACHABLE:
                sender.core.report_unreachable(to)
            elif kind == PEER_LOST:
                if sender.core.leader_unreachable(to):
                    self.trace(f"node {frm} lost its link to leader {to}: campaigns early")
            else:
                sender.core.report_snapshot(to, kind == SNAP_OK)
        while self.queue and self.queue[0][0] <= self.round:
            _, _, inc, m = heapq.heappop(self.queue)
            dest = self.nodes.get(m.to)
            ok = dest is not None and dest.core is not None and (m.frm, m.to) not in self.blocked
            if m.type == MessageType.SNAP:
                self.reports.append((self.round + 1, m.frm, inc, m.to,
                                     SNAP_OK if ok else SNAP_FAIL))
            if ok and dest is not None and dest.core is not None:
                dest.core.step(m)

    # -- ready processing

    def _handle_ready(self, node: SimNode) -> None:
        for _ in range(100):
            core = node.core
            if core is None or not core.has_ready():
                return
            rd = core.ready()
            self._send(node, rd.messages)
            if node.torn_crash:
                self.trace(f"node {node.id} is about to crash after sending, before persisting")
                self.crash(node.id, down_ticks=max(0, node.down_until - self.tick_no))
                return
            self._persist(node, rd)
            self._send(node, rd.persisted_messages)
            leaders = [(n, n.core.term) for n in self.alive()
                       if n.core is not None and n.core.role == Role.LEADER]
            for e in rd.committed_entries:
                self._apply(node, core, e, leaders)
            for rs in rd.read_states:
                read = node.reads.pop(rs.request_ctx, None)
                if read is not None:
                    node.servable.append((rs.index, read))
            core.advance(rd)
            # Like the host, record the membership with the next write batch: a crash
            # before it restarts the node from the previous record (and a replay).
            node.conf_to_persist = core.conf_state
            self._serve_reads(node)
            self._maybe_compact(node, core)
        self._fail(f"node {node.id} kept producing Ready objects (100 in one round)")

    def _persist(self, node: SimNode, rd: Ready) -> None:
        disk = node.disk
        if node.conf_to_persist is not None:
            disk.conf_state, node.conf_to_persist = node.conf_to_persist, None
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            if disk.snapshot is not None and meta.index <= disk.snapshot.index:
                self._fail(f"node {node.id} was handed snapshot {meta.index} older than its own "
                           f"{disk.snapshot.index}")
            if meta.index < disk.hard_state.commit:
                self._fail(f"node {node.id} installs snapshot {meta.index} below its commit "
                           f"{disk.hard_state.commit}")
            disk.snapshot, disk.snapshot_data, disk.entries = meta, rd.snapshot.data, []
            disk.conf_state = meta.conf_state
            node.sm = StateMachine.decode(rd.snapshot.data)
            want = self.checker.reference_state(meta.index)
            if node.sm.kv != want.kv or node.sm.applied != meta.index:
                self._fail(f"node {node.id} installed a snapshot at {meta.index} whose state "
                           f"{node.sm.kv} differs from the applied log's {want.kv}")
            self.trace(f"node {node.id} installs snapshot at index {meta.index}")
        if rd.entries:
            first = rd.entries[0].index
            if first < disk.first_index() or first > disk.last_index() + 1:
                self._fail(f"node {node.id} persists entries from {first}, but its log spans "
                           f"{disk.first_index()}..{disk.last_index()}")
            for e in rd.entries:
                if e.index > disk.hard_state.commit:
                    break
                if disk.term_at(e.index) not in (e.term, None):
                    self._fail(f"node {node.id} overwrites committed entry {e.index} "
                               f"(commit {disk.hard_state.commit})")
            del disk.entries[first - disk.first_index():]
            disk.entries.extend(rd.entries)
            self.checker.on_append(node, rd.entries)
        if rd.hard_state is not None:
            self.checker.on_hard_state(node, disk.hard_state, rd.hard_state)
            disk.hard_state = rd.hard_state
        if disk.hard_state.commit > disk.last_index():
            self._fail(f"node {node.id} persisted commit {disk.hard_state.commit} beyond its "
                       f"last entry {disk.last_index()}")

    def _apply(self, node: SimNode, core: RaftCore, e: Entry,
               leaders: Sequence[tuple[SimNode, int]]) -> None:
        if e.index > node.disk.hard_state.commit:
            self._fail(f"node {node.id} was handed entry {e.index} to apply, beyond its "
                       f"persisted commit {node.disk.hard_state.commit}")
        self.checker.on_apply(node, e, core.term, leaders)
        apply_entry(node.sm, e)
        if e.type == EntryType.CONF_CHANGE and core.role == Role.LEADER:
            self.trace(f"leader {node.id} applies conf change at {e.index}: "
                       f"{describe_cc(e.data)}")
        if e.type == EntryType.NORMAL and e.data:
            wid, key, value = decode_write(e.data)
            w = node.writes.pop(wid, None)
            if w is not None:
                w.acked = True
                self.writes_acked += 1
                self.acked_index[key] = max(self.acked_index.get(key, 0), e.index)
                self.trace(f"write {wid} {key}={value} committed at index {e.index} "
                           f"(acknowledged by node {node.id})")

    def _serve_reads(self, node: SimNode) -> None:
        keep: list[tuple[int, Read]] = []
        for index, read in node.servable:
            if node.sm.applied >= index:
                self.checker.on_read(node, read)
                self.reads_served += 1
                seen = node.sm.kv.get(read.key, (0, 0))
                self.trace(f"read {read.ctx.decode()} on node {node.id}: {read.key}={seen[0]} "
                           f"(read index {index})")
            else:
                keep.append((index, read))
        node.servable = keep

    def _maybe_compact(self, node: SimNode, core: RaftCore) -> None:
        every = self.cfg.profile.compact_every
        disk, sm = node.disk, node.sm
        base = disk.snapshot.index if disk.snapshot else 0
        if not every or sm.applied - base < every or sm.applied > disk.last_index():
            return
        meta = SnapshotMeta(sm.applied, sm.applied_term, core.conf_state)
        core.compact(meta)
        if node.conf_to_persist is not None:  # one write batch with the compaction
            disk.conf_state, node.conf_to_persist = node.conf_to_persist, None
        disk.entries = disk.entries[sm.applied - base:]
        disk.snapshot, disk.snapshot_data = meta, sm.encode()

    def _observe(self) -> None:
        for node in self.alive():
            core = node.core
            assert core is not None
            role = core.role
            if role == Role.LEADER:
                self.checker.on_leader(node, core.term)
                if core.commit_index > node.last_commit and self.faults_on:
                    leader_commit_fault(self, node)
            node.last_commit = core.commit_index
            if role != node.last_role:
                if role == Role.LEADER:
                    self.elections += 1
                    self.trace(f"node {node.id} becomes LEADER of term {core.term}")
                    if self.faults_on:
                        new_leader_fault(self, node)
                elif node.last_role == Role.LEADER:
                    self.trace(f"node {node.id} steps down in term {core.term}")
                node.last_role = role
            if node.torn_crash:
                self.crash(node.id, down_ticks=max(0, node.down_until - self.tick_no))

    # -- the client

    def propose(self, nid: int, key: str, value: int) -> Write | None:
        """Propose a write through node ``nid``; None when the node refuses it."""
        node = self.nodes[nid]
        if node.core is None:
            return None
        self.writes += 1
        wid = f"w{self.writes}"
        try:
            index = node.core.propose(encode_write(wid, key, value))
        except ProposalDropped:
            return None
        w = Write(wid, key, value, nid, index)
        node.writes[wid] = w
        self.trace(f"client proposes {wid} {key}={value} to node {nid} -> index {index}")
        return w

    def read(self, nid: int, key: str) -> Read | None:
        """Issue a ReadIndex read of ``key`` at node ``nid``; None when refused."""
        node = self.nodes[nid]
        if node.core is None:
            return None
        self.reads_issued += 1
        ctx = f"r{self.reads_issued}".encode()
        read = Read(ctx, key, nid, self.acked_index.get(key, 0), self.tick_no)
        try:
            node.core.read_index(ctx)
        except ProposalDropped:
            return None
        node.reads[ctx] = read
        return read

    # -- driving

    def step_tick(self, faults: bool = True) -> None:
        """Advance the clock one tick: faults and client requests, tick, then network rounds."""
        self.tick_no += 1
        self.faults_on = faults
        if faults:
            fault_step(self)
            client_step(self)
        for node in self.alive():
            assert node.core is not None
            node.core.tick()
            if node.fast_every and self.tick_no % node.fast_every == 0:
                node.core.tick()
        for _ in range(ROUNDS_PER_TICK):
            self.round += 1
            self._deliver_due()
            for node in self.alive():
                self._handle_ready(node)
            self._observe()

    def run_until(self, done: Callable[[], bool], limit: int, faults: bool = False) -> bool:
        """Tick until ``done()`` holds or ``limit`` ticks pass; True when it held."""
        for _ in range(limit):
            if done():
                return True
            self.step_tick(faults=faults)
        return done()

    def heal(self) -> None:
        """End all faults: links restored, lossless network, every crashed node restarted."""
        self.heal_partition()
        self.lossless = True
        for node in self.nodes.values():
            if node.core is None and node.id in self.started:
                self.start(node.id)
        self.trace("faults end: network healed and lossless, every node up")

    def await_liveness(self) -> int:
        """Run until a leader exists and a fresh write commits; return the ticks it took."""
        begin = self.tick_no
        pending: Write | None = None
        while self.tick_no - begin < self.cfg.liveness_ticks:
            self.step_tick(faults=False)
            if pending is not None and pending.acked:
                return self.tick_no - begin
            leader = self.leader()
            if leader is not None and (pending is None or pending.node != leader.id
                                       or self.nodes[leader.id].writes.get(pending.wid) is None):
                pending = self.propose(leader.id, "live", self.tick_no)
        leader = self.leader()
        self._fail(f"liveness: no write committed within {self.cfg.liveness_ticks} ticks "
                   f"after healing (leader: {leader.id if leader else 'none'})")
        return -1

    def run(self) -> SimResult:
        """The whole schedule: faulty phase, healing, liveness; raises InvariantViolation."""
        try:
            for _ in range(self.cfg.ticks):
                self.step_tick()
            self.heal()
            took = self.await_liveness()
        except InvariantViolation:
            raise
        except Exception as exc:
            try:
                self._fail(f"the core raised {exc!r}")
            except InvariantViolation as failure:
                raise failure from exc
            raise
        return SimResult(self.seed, self.cfg.profile.name, self.tick_no, self.writes_acked,
                         self.reads_served, max(self.checker.leader_of_term, default=0),
                         self.elections, took, self.fingerprint())

    def fingerprint(self) -> str:
        """A digest of everything applied and every disk: equal runs give equal digests."""
        parts = [repr(sorted(self.checker.applied.items()))]
        for node in self.nodes.values():
            parts.append(repr((node.disk.hard_state, node.disk.snapshot, node.disk.entries)))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def run_schedule(seed: int, profile: str = "chaos", nodes: int = 3, ticks: int = 200,
                 core_factory: CoreFactory = default_core, variant: str = "",
                 trace: Callable[[str], None] | None = None) -> SimResult:
    """Run one seeded schedule under a fault profile spec; raises InvariantViolation."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    cfg = SimConfig(nodes=nodes, ticks=ticks, profile=parse_profile(profile))
    return Simulation(seed, cfg, core_factory, variant, trace).run()
