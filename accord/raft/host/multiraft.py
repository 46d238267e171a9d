"""Multi-Raft host: drives every Raft group of one node from one event loop.

The shape is TiKV's batch system: a poll loop takes every group that has work
(``_dirty``), collects their ``Ready`` outputs, and handles them *together*:

1. the leaders' messages go out at once (they depend on nothing unpersisted, so
   the leader replicates while its own write is in flight, Raft thesis §10.2.1);
2. every group's entries and hard state go to the shared write-ahead log in one
   ``WriteBatch``: one write and one fsync per turn for the whole node (a hard
   state that only moves the commit index is not written on its own: commit is
   volatile in Raft, so a turn that only learns of commits costs no fsync);
3. then the messages that promise durable state (votes, append acks);
4. committed entries are queued for the apply task, which runs apart from the
   poll loop, so a slow state machine delays answers, never heartbeats; only a
   turn that writes nothing applies a short queue itself (``Applier.dispatch``),
   and then sends its messages one loop iteration later, after the answers.

Latency: a message read from a peer is stepped inside the transport's read callback,
and when the poll loop is idle the turn runs right there (``_turn_now``) instead of
one loop iteration later in the poll task; a turn that must write hands its write
to the poll task, which starts no other turn until it is done.

Collaborators, one job each: this module drives the groups (poll loop, turns,
ticks, inbound messages, group and peer bookkeeping) and owns a ``Proposer``
(``propose.py``: proposals from any replica, forwarding and refusals, membership
changes), ``ReadRounds`` (``reads.py``: ReadIndex rounds), an ``Applier``
(``apply.py``: the apply task, answers, snapshots) and ``Waits`` (``waits.py``: the
deadlines of waiting callers). ``group.py`` holds the ``Group`` record and the
contracts (``StateMachine``, ``Transport``, ``HostConfig``). The answer to a proposal
is the state machine's return value for its entry (the same on every replica).

Linearizable reads go through ReadIndex: one ``read_index`` round per group is in
flight at a time, and every read that arrives meanwhile shares the next one (as
etcd's read loop does); a read is served once the local applied index reaches the
index the leader confirmed. A round a leader change leaves unanswered goes to the
next leader.

Snapshots: the apply task snapshots a group's state machine every
``snapshot_entries`` applied entries, writes it through ``SnapshotStore``, then
compacts the core and the WAL; once the WAL's record of a snapshot (local or
installed) is durable, the group's older snapshot files are pruned, and recovery
restores exactly the file the WAL names. A leader streams the snapshot file to a lagging
follower on the transport's snapshot stream, and sends the ``SNAP`` message
only after the follower holds the verified file; the follower attaches the data
when the message arrives.

Membership changes: ``propose_conf_change`` works from any replica (a follower
forwards the CONF_CHANGE entry in a ``PROPOSE``) and returns once this node applied
the new membership. A replica added to a group starts with an empty membership
and must begin from a snapshot, never from index 1 (it could not apply the conf
changes in the log): it ignores appends from the start of the log, and every
replica compacts a log that still starts at index 1 once it applied an addition,
so whichever node leads next sends a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from accord.raft.core.confchange import ConfChange, members
from accord.raft.core.raft import Config as CoreConfig
from accord.raft.core.raft import RaftCore
from accord.raft.core.types import (
    NO_NODE,
    ConfState,
    Message,
    MessageType,
    PersistentState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)
from accord.raft.host.apply import Applier
from accord.raft.host.group import (
    ApplyError,
    FileSource,
    Group,
    GroupUnavailable,
    HostConfig,
    ReadWaiter,
    StateMachine,
    Transport,
)
from accord.raft.host.propose import Proposer
from accord.raft.host.quiesce import (
    QUIESCE_CONTEXT,
    PeerLiveness,
    follower_can_quiesce,
    leader_can_quiesce,
    quorum_reachable,
)
from accord.raft.host.reads import ReadRounds, fail_futures
from accord.raft.host.waits import Waits
from accord.raft.storage.snapshot import SnapshotReceiver, SnapshotStore
from accord.raft.storage.wal import WALFatalError, WriteAheadLog, WriteBatch
from accord.raft.transport.codec import SnapshotPiece

__all__ = [
    "ApplyError",
    "Group",
    "GroupUnavailable",
    "HostConfig",
    "MultiRaftHost",
    "StateMachine",
    "Transport",
]

log = logging.getLogger("accord.raft.host")





class MultiRaftHost:
    """Drives every Raft group of one node (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        wal: WriteAheadLog,
        snapshots: SnapshotStore,
        transport: Transport,
        config: HostConfig | None = None,
        *,
        boot_nonce: int = 0,
    ) -> None:
        self.node_id = node_id
        self.config = config or HostConfig()
        self._loop = asyncio.get_running_loop()  # hosts are built inside the node's loop
        self._wal = wal
        self._snapshots = snapshots
        self._transport = transport
        self._groups: dict[int, Group] = {}
        self._dirty: set[Group] = set()
        self._wake = asyncio.Event()
        self._boot = boot_nonce & 0xFFFFFFFFFFFFFFFF
        self._tasks: list[asyncio.Task[None]] = []
        self._receivers: dict[tuple[int, int, int], SnapshotReceiver] = {}
        self._snapshot_loads: set[asyncio.Task[None]] = set()
        """Tasks reading a received snapshot file before its SNAP is stepped."""
        self._flush_forwarded = False
        """Proposals were forwarded this turn: the turn flushes the transport."""
        self._turning = False
        """A turn is under way (its log write in flight): no other may start."""
        self._held_write: tuple[WriteBatch, list[tuple[Group, Ready]]] | None = None
        """A turn ``_turn_now`` started whose write the poll task must finish."""
        self._halted = False
        """``stop`` was called."""
        self._pending_confs: list[tuple[int, int, ConfState]] = []
        self._fatal: BaseException | None = None
        self._stopped = asyncio.Event()
        self._active: set[Group] = set()
        """Groups that tick (not quiesced)."""
        self._peer_nodes: set[int] = set()
        self._unsure_peers: set[int] = set()
        """Peers whose link was lost or which went silent, not heard from since. When one
        is heard again (it may have restarted), the groups this node leads with it wake
        and heartbeat it before they quiesce again: a restarted replica knows no leader
        and perhaps an old commit index until its leader tells it, and a learner, or a
        voter whose own addition it has not applied yet, cannot campaign to find out."""
        self._liveness = PeerLiveness(
            self.config.tick_interval, self.config.tick_interval * self.config.election_ticks)
        self._quiesce = self.config.quiesce and not self.config.lease_read
        self._commits_to_save: set[Group] = set()
        """Quiesced groups whose commit index the log does not have yet (``_quiesced``)."""
        self._next_tick = float("inf")
        """When the next tick is due (``_ticks_owed``); set when the ticker starts."""
        self.turns = 0
        """Poll-loop rounds that wrote to the log (for metrics and tests)."""
        self.fast_elections = 0
        """Groups whose election timer a lost leader link fast-forwarded (metrics, tests)."""
        self.waits = Waits(self._loop, self.config.request_timeout)
        self.reads = ReadRounds(node_id, self._boot, self._loop, self._mark)
        self.applier = Applier(node_id, self.config, snapshots, self._mark)
        self.proposer = Proposer(
            node_id, self._boot, self.config, self._loop, self._groups, transport, self.waits,
            mark=self._mark, activate=self._activate, forwarded=self._note_forwarded,
            check_alive=self._check_alive, running=self._running)
        transport.add_peer_lost_listener(self.peer_lost)

    # ------------------------------------------------------------------ plumbing
    def _mark(self, g: Group) -> None:
        """``g`` has work: the next turn takes it."""
        self._dirty.add(g)
        self._wake.set()

    def _activate(self, g: Group) -> None:
        """Let ``g`` tick again (a quiesced group wakes for any work)."""
        g.idle_ticks = 0
        self._active.add(g)

    def _note_forwarded(self) -> None:
        """A message went to a peer outside a turn: the next turn flushes the links."""
        self._flush_forwarded = True
        self._wake.set()

    def _check_alive(self) -> None:
        if self._fatal is not None:
            raise GroupUnavailable("request timed out")

    def _running(self) -> bool:
        return not self._halted and self._fatal is None

    def _fail_waiters(self, g: Group, err: BaseException) -> None:
        """Fail every proposal and read waiting on ``g``."""
        fail_futures(g.proposals.values(), err)
        ReadRounds.fail_all(g, err)

    @property
    def answered(self) -> int:
        """Proposals of this node answered by their apply (metrics and tests)."""
        return self.applier.answered

    # ------------------------------------------------------------------ groups
    def add_group(
        self,
        group_id: int,
        sm: StateMachine,
        recovered: PersistentState | None,
        voters: Sequence[int] = (),
        learners: Sequence[int] = (),
    ) -> Group:
        """Host a group; ``recovered`` is what the WAL held for it (None when new)."""
        if group_id in self._groups:
            raise ValueError(f"group {group_id} is already hosted on node {self.node_id}")
        state = recovered or PersistentState()
        cfg = CoreConfig(
            id=self.node_id,
            election_tick=self.config.election_ticks,
            heartbeat_tick=1,
            lease_read=self.config.lease_read,
            clock_drift_ticks=self.config.clock_drift_ticks,
            seed=(self.node_id * 1_000_003 + group_id * 7919 + self._boot) & 0x7FFFFFFF,
        )
        applied = snapshot_bytes = 0
        if state.snapshot is not None and state.snapshot.index > 0:
            # Exactly the snapshot the log names: a newer file whose record a crash
            # lost holds entries the log still replays after this one.
            info = self._snapshots.find(group_id, state.snapshot)
            if info is None:
                raise RuntimeError(
                    f"group {group_id}: the log says a snapshot at index {state.snapshot.index} "
                    f"(term {state.snapshot.term}) is durable but the snapshot store does not "
                    "have it; the data directory is damaged"
                )
            data = b"".join(self._snapshots.data_chunks(info))
            sm.restore(data)
            applied, snapshot_bytes = state.snapshot.index, len(data)
            del data
        core = RaftCore(cfg, state, voters=voters, learners=learners)
        g = Group(group_id, core, sm, applied=applied, last_snapshot_index=applied,
                  last_snapshot_bytes=snapshot_bytes)
        g.persisted_conf = core.conf_state
        g.saved_vote = (state.hard_state.term, state.hard_state.vote)
        g.saved_commit = state.hard_state.commit
        self._groups[group_id] = g
        self._note_peers(core.conf_state)
        self._activate(g)
        self._mark(g)
        return g

    def fence_reads(self, group_id: int, fence: Callable[[], bytes | None]) -> None:
        """Fence the reads of ``group_id``: its leader answers a ReadIndex at its last
        index and, before it appends anything after answering reads (or first in a
        term), appends ``fence()`` (``Proposer.fence``). The KV shards use it so that a
        read may answer at a revision from the clock (``docs/txn.md``)."""
        g = self._groups[group_id]
        g.core.answer_reads_at_last_index()
        g.read_fence = fence

    def _note_peers(self, cs: ConfState) -> None:
        for n in (*cs.voters, *cs.learners, *cs.voters_outgoing):
            if n != self.node_id:
                self._peer_nodes.add(n)

    # ------------------------------------------------------------------ quiescence
    @property
    def active_groups(self) -> int:
        """How many groups tick now (the rest are quiesced)."""
        return len(self._active)

    def _maybe_quiesce_leader(self, g: Group) -> None:
        core = g.core
        if (not leader_can_quiesce(core) or g.proposals or g.reads_pending or g.reads_issued
                or not quorum_reachable(core, self._unsure_peers)):
            g.idle_ticks = 0
            return
        g.idle_ticks += 1
        if g.idle_ticks < self.config.quiesce_after_ticks:
            return
        for peer in core.progress:
            if peer != self.node_id:
                self._transport.send(peer, g.id, Message(
                    MessageType.HEARTBEAT, to=peer, frm=self.node_id, term=core.term,
                    commit=core.commit_index, context=QUIESCE_CONTEXT))
        self._quiesced(g)

    def _quiesced(self, g: Group) -> None:
        """``g`` stops ticking. Its commit index goes to the log with the next turn if
        the log has an older one: a commit index that only moved rides along with the
        group's next write (``_start_turn``), and a quiet group has none, so a replica
        restarted after its group went quiet would start from an older commit index and
        apply the last entries it holds only once its leader speaks again (a restarted
        member then served its first calls from a member table without the last
        advertisements: ``ReplicatedBackend.settle_formats``). One small record per
        group and quiet spell, written with whatever else the turn writes."""
        self._active.discard(g)
        if g.core.commit_index > g.saved_commit:
            self._commits_to_save.add(g)
            self._wake.set()

    def deliver_heartbeats(self, from_node: int, heartbeats: object, resps: object) -> None:
        """Transport callback for heartbeat bundles: node-level liveness pings."""
        self._heard(from_node)

    def peer_lost(self, node: int) -> None:
        """Transport callback: the link to ``node`` closed and a redial failed.

        Every group led by ``node`` is told (``RaftCore.leader_unreachable``) so it
        elects a new leader within a few ticks instead of an election timeout;
        quiesced ones wake up first, since their timer must run for that.
        """
        self._unsure_peers.add(node)
        woken = 0
        for g in self._groups.values():
            core = g.core
            if core.leader_id != node or core.role != Role.FOLLOWER:
                continue
            if core.leader_unreachable(node):
                woken += 1
                g.quiesce_from = NO_NODE
                self._activate(g)
                self._mark(g)
        if woken:
            self.fast_elections += woken
            log.info("node %d: link to leader %d lost; %d groups campaign early",
                     self.node_id, node, woken)

    def _heard(self, node: int) -> None:
        if self._liveness.heard(node, self._loop.time()):
            log.info("node %d: peer %d is reachable again", self.node_id, node)
        if node in self._unsure_peers and self._transport.connected(node):
            # Back, perhaps restarted, and reachable again over this node's own link (a
            # heartbeat sent while that still redials is dropped): the groups it shares
            # with this leader heartbeat it for ``quiesce_after_ticks`` before they may
            # quiesce again.
            self._unsure_peers.discard(node)
            self._wake_groups_led_with(node)

    def _wake_groups_led_with(self, node: int) -> None:
        """Let every group this node leads and ``node`` replicates tick from now on."""
        for g in self._groups.values():
            if g.core.role == Role.LEADER and node in g.core.progress:
                self._activate(g)

    def group(self, group_id: int) -> Group:
        """The hosted group ``group_id``; KeyError if it is not on this node."""
        return self._groups[group_id]

    @property
    def groups(self) -> dict[int, Group]:
        """Every hosted group by id."""
        return self._groups

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the poll loop, the apply task and the ticker."""
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name=f"raft-poll-{self.node_id}"),
            asyncio.create_task(self.applier.run(), name=f"raft-apply-{self.node_id}"),
            asyncio.create_task(self._ticker(), name=f"raft-tick-{self.node_id}"),
        ]

    async def stop(self) -> None:
        """Cancel and await every task; fail every waiter."""
        self._halted = True  # no turn from a transport callback from now on
        tasks = [*self._tasks, *self._snapshot_loads]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        for g in self._groups.values():
            self._fail_waiters(g, GroupUnavailable("request timed out"))
        for r in self._receivers.values():
            r.close()
        self._receivers.clear()
        self._stopped.set()

    @property
    def fatal(self) -> BaseException | None:
        """The error that stopped the host (a failed fsync), if any."""
        return self._fatal

    async def wait_fatal(self) -> BaseException:
        """Wait until the host hits an unrecoverable error, and return it."""
        await self._stopped.wait()
        assert self._fatal is not None
        return self._fatal

    # ------------------------------------------------------------------ client API
    async def read_barrier(self, group_id: int, timeout: float | None = None) -> None:
        """Wait until a linearizable read of the group may be served locally."""
        g = self._groups[group_id]
        self._check_alive()
        fut: asyncio.Future[None] = self._loop.create_future()
        g.reads_pending.append(fut)
        self._activate(g)
        self._mark(g)
        await self.waits.wait(fut, timeout)

    async def propose(self, group_id: int, payload: bytes, timeout: float | None = None) -> object:
        """Replicate ``payload`` in the group and return the state machine's answer."""
        return await self.proposer.propose(group_id, payload, timeout)

    @property
    def proposals_failed(self) -> int:
        """Proposals of this node that failed with ``GroupUnavailable`` (metrics)."""
        return self.proposer.failed

    async def propose_conf_change(
        self, group_id: int, cc: ConfChange, timeout: float | None = None
    ) -> ConfState:
        """Change the group's membership; the membership once this node applied it
        (see ``Proposer.propose_conf_change``)."""
        return await self.proposer.propose_conf_change(group_id, cc, timeout)

    def transfer_leader(self, group_id: int, target: int) -> None:
        """Ask the group's leader (this node) to hand leadership to ``target``."""
        g = self._groups[group_id]
        self._activate(g)
        g.core.transfer_leader(target)
        self._mark(g)

    def campaign(self, group_id: int) -> None:
        """Start an election for the group now (used at bootstrap to save a timeout)."""
        g = self._groups[group_id]
        self._activate(g)
        g.core.campaign()
        self._mark(g)

    # ------------------------------------------------------------------ membership
    async def compact_now(self, group_id: int, timeout: float = 5.0) -> int:
        """Make sure the group's log was compacted once; returns the snapshot index.

        A replica added to a group must start from a snapshot: its membership is
        empty until it receives one (``confchange.apply_conf_change`` never invents
        one), so a leader compacts a log that still starts at index 1 before adding.
        """
        g = self._groups[group_id]
        deadline = self._loop.time() + timeout
        while True:
            self._check_alive()
            if g.core.log.snapshot_index > 0:
                return g.core.log.snapshot_index
            if g.applied > 0 and not g.snapshot_busy:
                await self.applier.take_snapshot(g)  # may decline (the core not caught up yet)
                if g.core.log.snapshot_index > 0:
                    continue
            if self._loop.time() >= deadline:
                raise GroupUnavailable("request timed out")
            await asyncio.sleep(self.config.tick_interval / 2)

    def take_loads(self) -> dict[int, dict[int, int]]:
        """Each group's requests by arrival node since the last call (``Group.load``),
        for the groups this node leads now; every count starts again from zero."""
        loads = {}
        for gid, g in self._groups.items():
            if g.load:
                if g.core.role == Role.LEADER:
                    loads[gid] = g.load
                g.load = {}
        return loads

    def forget_peer(self, node: int) -> None:
        """Stop sending node-level heartbeats to ``node`` (it left every group)."""
        self._peer_nodes.discard(node)

    # ------------------------------------------------------------------ inbound
    def deliver(self, from_node: int, batch: list[tuple[int, Message]]) -> None:
        """Transport callback: messages from ``from_node`` for our groups."""
        self._heard(from_node)
        for group_id, msg in batch:
            g = self._groups.get(group_id)
            if g is None:
                continue
            if g not in self._active and msg.type != MessageType.HEARTBEAT_RESP:
                self._activate(g)
            if msg.type == MessageType.HEARTBEAT and msg.context == QUIESCE_CONTEXT:
                g.quiesce_from = msg.frm
            if msg.type == MessageType.PROPOSE:
                if msg.reject:
                    self.proposer.forward_refused(g, msg)
                else:
                    self.proposer.handle_forwarded(g, msg)
                continue
            if msg.type == MessageType.READ_INDEX and g.core.role == Role.LEADER:
                g.load[msg.frm] = g.load.get(msg.frm, 0) + 1
            if msg.type == MessageType.APP and msg.index == 0 and not g.core.conf_state.voters:
                # A joining replica knows no membership yet: replaying the log from
                # index 1 would skip every conf change (confchange.apply_conf_change), so
                # it waits for a snapshot; the leader compacts once it added a node.
                continue
            if msg.type == MessageType.SNAP and msg.snapshot is not None and not msg.snapshot.data:
                # Reading the received file may take a while: off the loop, then step.
                task = asyncio.create_task(self._step_snapshot(g, msg),
                                           name=f"snapshot-load-{g.id}")
                self._snapshot_loads.add(task)
                task.add_done_callback(self._snapshot_loads.discard)
                continue
            g.core.step(msg)
            self._dirty.add(g)
        if self._dirty:
            self._turn_now()

    async def _step_snapshot(self, g: Group, msg: Message) -> None:
        """Attach the data of the snapshot file the stream delivered, then step the SNAP."""
        assert msg.snapshot is not None
        meta = msg.snapshot.meta
        info = self._snapshots.find(g.id, meta)
        if info is None:
            log.warning("group %d: SNAP for index %d without the received file; dropped",
                        g.id, meta.index)
            return
        try:
            data = await asyncio.to_thread(lambda: b"".join(self._snapshots.data_chunks(info)))
        except FileNotFoundError:  # a newer snapshot's record pruned it meanwhile
            log.warning("group %d: the received snapshot at index %d is gone; dropped",
                        g.id, meta.index)
            return
        msg.snapshot = Snapshot(meta, data)
        g.core.step(msg)
        self._mark(g)

    async def receive_snapshot_chunk(self, from_node: int, piece: SnapshotPiece) -> int:
        """Transport callback for snapshot streams (see ``OnSnapshotChunk``)."""
        key = (piece.group_id, piece.meta.term, piece.meta.index)
        rcv = self._receivers.get(key)
        if rcv is None:
            if piece.group_id not in self._groups:
                raise ValueError(f"snapshot for unknown group {piece.group_id}")
            rcv = self._snapshots.receiver(piece.group_id, piece.meta)
            self._receivers[key] = rcv
        if not piece.data and not piece.done:
            return rcv.offset
        if piece.offset != rcv.offset:
            return rcv.offset
        await asyncio.to_thread(rcv.write, piece.offset, piece.data)
        end = piece.offset + len(piece.data)
        if piece.done:
            try:
                await asyncio.to_thread(rcv.finish)
            finally:
                self._receivers.pop(key, None)
        return end

    # ------------------------------------------------------------------ poll loop
    async def _ticker(self) -> None:
        self._next_tick = self._loop.time() + self.config.tick_interval
        while True:
            await asyncio.sleep(max(0.0, self._next_tick - self._loop.time()))
            self._tick(self._ticks_owed())

    def _ticks_owed(self) -> int:
        """Ticks due now, and when the next one is.

        Without lease reads a late ticker (a stalled loop, a paused process) ticks
        once: the time lost stretches every timer, which keeps a busy node from
        calling elections it does not need. With lease reads every whole interval
        that passed counts (up to enough to expire any lease and timer): a leader's
        lease must never outlive the time its process was paused.
        """
        now = self._loop.time()
        if now < self._next_tick:
            return 0
        interval = self.config.tick_interval
        if not self.config.lease_read:
            self._next_tick = now + interval
            return 1
        owed = int((now - self._next_tick) / interval) + 1
        self._next_tick += owed * interval
        return min(owed, 2 * self.config.election_ticks + 2)

    def _tick(self, ticks: int) -> None:
        if ticks <= 0:
            return
        self.waits.expire()
        for peer in self._peer_nodes:
            self._transport.send_heartbeat(peer, 0, 0, 0)
        for g in list(self._active):
            if self._quiesce and g.core.role == Role.LEADER:
                self._maybe_quiesce_leader(g)
                if g not in self._active:
                    continue
            for _ in range(ticks):
                g.core.tick()
            if g.reads_pending or g.core.has_ready():
                self._dirty.add(g)
        self._wake_groups_of_silent_peers()
        self._transport.flush()
        self._wake.set()

    def _wake_groups_of_silent_peers(self) -> None:
        down = self._liveness.newly_down(self._loop.time())
        if not down:
            return
        log.info("node %d: peers %s went silent; waking their quiesced groups", self.node_id, down)
        silent = set(down)
        self._unsure_peers.update(silent)
        for g in self._groups.values():
            if g in self._active:
                continue
            core = g.core
            # A follower's leader went quiet: its election timer must run again. A
            # leader lost a voter: CheckQuorum must run, in case it is the one cut off.
            if core.leader_id in silent or (
                core.role == Role.LEADER and silent.intersection(core.conf_state.voters)
            ):
                self._activate(g)

    async def _poll_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                self._turning = True
                try:
                    held, self._held_write = self._held_write, None
                    if held is not None:
                        await self._finish_turn(*held)
                    write = self._start_turn()
                    if write is not None:
                        await self._finish_turn(*write)
                finally:
                    self._turning = False
        except WALFatalError as e:
            self._die(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: stop rather than run on with unknown state
            log.exception("raft poll loop failed on node %d", self.node_id)
            self._die(e)

    def _die(self, e: BaseException) -> None:
        self._fatal = e
        log.critical("node %d stops: %s", self.node_id, e)
        for g in self._groups.values():
            self._fail_waiters(g, GroupUnavailable("request timed out"))
        self._stopped.set()

    def _turn_now(self) -> None:
        """Run a turn from a transport callback if the poll loop is idle, else wake it.

        A turn that needs no write (a heartbeat answered, a ReadIndex confirmed, a
        commit learned) then completes in the loop iteration that read the message,
        instead of one iteration later in the poll task; one that writes leaves its
        write to the poll task (``_held_write``), which runs nothing else meanwhile.
        """
        if self._turning or self._halted or self._fatal is not None:
            self._wake.set()
            return
        self._turning = True  # a transport that delivers synchronously must not re-enter
        try:
            write = self._start_turn()
        except Exception as e:  # a bug, as in the poll loop: stop
            log.exception("raft turn failed on node %d", self.node_id)
            self._die(e)
            return
        if write is None:
            self._turning = False
        else:  # still turning until the poll task finished the write
            self._held_write = write
            self._wake.set()

    def _read_round_overdue(self, g: Group) -> bool:
        """One ReadIndex round per group is in flight at a time (reads that arrive
        meanwhile share the next one, as etcd's read loop does); a round unanswered
        for two ticks (a lost message) no longer holds the next one back."""
        return self._loop.time() - g.reads_round_at > 2 * self.config.tick_interval

    def _start_turn(self) -> tuple[WriteBatch, list[tuple[Group, Ready]]] | None:
        """A turn up to its log write: the batch and readies to finish, or None if done."""
        if self.config.lease_read and self._loop.time() >= self._next_tick:
            # Whatever woke a resumed process first (a read, above all) runs after the
            # ticks it owes, so no lease is judged on a clock that stood still.
            self._tick(self._ticks_owed())
        if self._flush_forwarded:
            self._flush_forwarded = False
            self._transport.flush()
        dirty, self._dirty = self._dirty, set()
        readies: list[tuple[Group, Ready]] = []
        for g in dirty:
            if g.reads_pending and (not g.reads_issued or self._read_round_overdue(g)):
                self.reads.issue(g)
            if g.core.has_ready():
                readies.append((g, g.core.ready()))
        compactions, self.applier.compactions = self.applier.compactions, []
        confs, self._pending_confs = self._pending_confs, []
        saves, self._commits_to_save = self._commits_to_save, set()
        if not readies and not compactions and not confs and not saves:
            return None
        transport = self._transport
        batch = WriteBatch()
        handed: list[Group] = []
        for g, rd in readies:
            for m in rd.messages:
                self._send(g, m)
            if rd.snapshot is None and self._hand_out(g, rd, wake=False):
                # Committed entries are durable on a quorum already: apply them while
                # this node's own write (of new entries or of the commit index) is in
                # flight, rather than after it. A snapshot to install waits for its write.
                handed.append(g)
            hs = rd.hard_state
            if (hs is not None and not rd.entries and rd.snapshot is None
                    and (hs.term, hs.vote) == g.saved_vote):
                # Only the commit index moved. It is volatile state in Raft (a restarted
                # node starts from its snapshot and learns it again from the leader), so
                # it rides along with the next write instead of costing one of its own.
                hs = None
            if rd.snapshot is not None or rd.entries or hs is not None:
                batch.add(g.id, hard_state=hs, entries=rd.entries,
                          snapshot=rd.snapshot.meta if rd.snapshot is not None else None)
                if hs is not None:
                    g.saved_vote = (hs.term, hs.vote)
                    g.saved_commit = hs.commit
                    saves.discard(g)
        for g in saves:
            if g.core.commit_index > g.saved_commit and self._groups.get(g.id) is g:
                hs = g.core.hard_state
                batch.add(g.id, hard_state=hs)
                g.saved_vote, g.saved_commit = (hs.term, hs.vote), hs.commit
        for gid, meta in compactions:
            batch.compact(gid, meta)
        for gid, index, cs in confs:
            batch.set_conf_state(gid, index, cs)
        if handed and not len(batch):
            # Nothing to write: apply now. If that answered callers of this node, write
            # this turn's messages (typically the commit index for the followers) in
            # the next loop iteration, after those callers had their turn to answer;
            # if not (the proposals came from other nodes, which answer once they
            # learn the commit), at once.
            answered = self.applier.answered
            self.applier.dispatch(handed, inline=True)
            self._end_turn(readies, defer_flush=self.applier.answered != answered)
            return None
        transport.flush()
        if handed:
            self.applier.dispatch(handed, inline=False)
        if len(batch):
            return batch, readies
        self._end_turn(readies)
        return None

    async def _finish_turn(self, batch: WriteBatch, readies: list[tuple[Group, Ready]]) -> None:
        """Write a turn's batch, then send what waited for it (``_end_turn``)."""
        await self._wal.append(batch)
        self.turns += 1
        self._end_turn(readies)
        recorded = [(gid, gw.install or gw.compact) for gid, gw in batch.groups.items()
                    if gw.install is not None or gw.compact is not None]
        if recorded:
            await asyncio.to_thread(self._prune_snapshots, recorded)

    def _prune_snapshots(self, recorded: list[tuple[int, SnapshotMeta | None]]) -> None:
        """Worker thread: the WAL recorded these snapshots; older files may go."""
        for gid, meta in recorded:
            if meta is not None:
                self._snapshots.prune(gid, meta)

    def _end_turn(self, readies: list[tuple[Group, Ready]], *, defer_flush: bool = False) -> None:
        """Send the messages that waited for the write, then let the cores advance.
        ``defer_flush`` writes them one loop iteration later (after answered callers)."""
        transport = self._transport
        for g, rd in readies:
            for m in rd.persisted_messages:
                self._send(g, m)
        if defer_flush:
            self._loop.call_soon(transport.flush)
        else:
            transport.flush()
        for g, rd in readies:
            self._after_persist(g, rd)

    def _after_persist(self, g: Group, rd: Ready) -> None:
        if rd.soft_state is not None:
            self._activate(g)
            self.reads.reissue(g, rd.soft_state.leader)
            for cb in g.leader_listeners:
                cb(g.id, rd.soft_state.leader)
        if rd.snapshot is not None:
            g.apply_queue.clear()
            g.pending_restore = rd.snapshot
            self.applier.schedule(g)
            self._hand_out(g, rd)
        g.core.advance(rd)
        if g.snapshot_due(self.config):
            self.applier.schedule(g)  # the apply task checks again whether to snapshot
        if g.reads_waiting:
            ReadRounds.release(g)
        cs = g.core.conf_state
        if cs != g.persisted_conf:
            if g.persisted_conf is not None and members(cs) - members(g.persisted_conf):
                g.want_compaction = True
            g.persisted_conf = cs
            self._note_peers(cs)
            self._pending_conf(g, cs)
            waiters, g.conf_waiters = g.conf_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        if g.want_compaction:
            if g.core.log.snapshot_index > 0:
                g.want_compaction = False
            else:
                self.applier.schedule(g)  # the apply task snapshots once the core caught up
        if g.core.has_ready():
            self._mark(g)
        elif g.quiesce_from != NO_NODE:
            if self._quiesce and follower_can_quiesce(g.core, g.quiesce_from):
                self._quiesced(g)
            g.quiesce_from = NO_NODE

    def _hand_out(self, g: Group, rd: Ready, *, wake: bool = True) -> bool:
        """Queue ``rd``'s committed entries; note its ReadIndex answers.

        With ``wake`` the apply task is woken for them; without, the caller dispatches
        them (``Applier.dispatch``). True when entries were queued.
        """
        for rs in rd.read_states:
            issued = g.reads_issued.pop(rs.request_ctx, None)
            if issued:
                for f in issued[1]:
                    g.reads_waiting.append(ReadWaiter(f, rs.index))
                if g.reads_pending:  # they waited for this round: the next one goes now
                    self._mark(g)
        if not rd.committed_entries:
            return False
        g.apply_queue.extend(rd.committed_entries)
        if wake:
            self.applier.schedule(g)
        return True

    def _pending_conf(self, g: Group, cs: ConfState) -> None:
        # Persist the membership in force with the next batch: recovery then starts
        # from the right voters even before the log is re-applied.
        self._pending_confs.append((g.id, g.core.applied_index, cs))
        self._wake.set()

    def _send(self, g: Group, m: Message) -> None:
        if m.type == MessageType.SNAP:
            self._send_snapshot(g, m)
            return
        self._transport.send(m.to, g.id, m)

    def _send_snapshot(self, g: Group, m: Message) -> None:
        # The file the core's SNAP names: after a restart a newer file whose record
        # the log lost may lie beside it, and the follower would refuse that one.
        info = (self._snapshots.find(g.id, m.snapshot.meta) if m.snapshot is not None
                else self._snapshots.latest(g.id))
        if info is None:
            g.core.report_snapshot(m.to, False)
            return
        source = FileSource(self._snapshots, g.id, str(info.path), info.size)
        peer = m.to

        def done(ok: bool) -> None:
            if ok:
                self._transport.send(peer, g.id, m)
                self._transport.flush()
            g.core.report_snapshot(peer, ok)
            self._mark(g)

        self._transport.start_snapshot(peer, g.id, info.meta, source, done)
