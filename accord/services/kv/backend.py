"""The backend protocol: what the etcd-compatible servicers need from whatever holds the data.

The servicers (``accord/services/kv/servicer.py`` and ``accord/services/cluster/servicer.py``)
only translate gRPC to calls on a :class:`Backend` and back; everything that decides
*where* a request runs lives behind this protocol. Two implementations are meant to
exist:

* :class:`accord.services.kv.local.LocalBackend` applies commands directly to one
  in-process :class:`~accord.services.kv.statemachine.KVStateMachine` (tests, embedding,
  ``python -m accord.node.grpc_server``);
* a Raft-replicated backend (the lead's) proposes the same command bytes to a Raft group
  and answers with the result of their apply.

:class:`StateMachineBackend` holds the part both share: validating a request against the
state machine, encoding it as a command, and reading. A subclass supplies only
:meth:`StateMachineBackend.commit` (propose command bytes, await the apply result),
:meth:`StateMachineBackend.read_barrier` (what makes a read linearizable) and the
cluster-level facts (identity, members, status).

Errors: every method raises :class:`~accord.services.kv.errors.EtcdError` for anything
the client should see (the servicers turn it into ``context.abort(code, message)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import grpc

from accord.proto import rpc_pb2
from accord.services.cluster.alarms import AlarmTable
from accord.services.kv import errors, fanout, sharding, txn, xlease, xtxn
from accord.services.kv.clockguard import ClockGuard, ClockUntrusted
from accord.services.kv.errors import EtcdError
from accord.services.kv.ranges import KeyRange
from accord.services.kv.revorder import RevisionOrder
from accord.services.kv.shardwatch import ShardedWatchHub as ShardedWatchHubType
from accord.services.kv.shardwatch import chase_floor
from accord.services.kv.txnplan import TxnPlan, all_ranges
from accord.services.kv.xcoord import Coordinator

if TYPE_CHECKING:
    from accord.services.kv.shardwatch import ShardedWatchHub
    from accord.services.kv.statemachine import KVStateMachine
    from accord.services.kv.watchhub import WatchHub

ETCD_COMPAT_VERSION = "3.5.13"
"""The etcd version accord reports in ``Status``: >= 3.5.13 so that Kubernetes enables
watch progress requests (its feature check refuses 3.5.0 to 3.5.12)."""


class HeaderInfo(NamedTuple):
    """Identity and Raft facts that go into every response header (a named tuple: built
    for every response, and four times cheaper to build than a frozen dataclass)."""

    cluster_id: int
    member_id: int
    raft_term: int
    leader: int
    """Member id of the leader this member knows of; 0 when it knows none."""


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One member of the cluster as etcd's ``Member`` message describes it."""

    id: int
    name: str
    peer_urls: tuple[str, ...] = ()
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False


@dataclass(frozen=True, slots=True)
class StatusInfo:
    """What ``Maintenance.Status`` reports about the answering member."""

    version: str
    db_size: int
    db_size_in_use: int
    leader: int
    raft_index: int
    raft_term: int
    raft_applied_index: int
    errors: tuple[str, ...] = ()
    is_learner: bool = False


@dataclass(frozen=True, slots=True)
class HashKVResult:
    """``Maintenance.HashKV``: the hash, the compaction revision, the revision hashed."""

    hash: int
    compact_revision: int
    revision: int


@runtime_checkable
class Backend(Protocol):
    """Everything the etcd-compatible servicers call. All I/O methods are coroutines."""

    # --- identity -------------------------------------------------------------------------
    def header_info(self) -> HeaderInfo:
        """Cluster id, member id, Raft term and known leader, for response headers."""

    @property
    def revision(self) -> int:
        """The latest revision applied on this member (for headers of non-KV responses)."""

    @property
    def watch_hub(self) -> WatchHub | ShardedWatchHub:
        """The hub that serves watchers on this member."""

    def latest_revision(self) -> int:
        """The store's current revision as a read starting now sees it: at or above every
        write acknowledged before (what a progress request is answered at)."""

    async def settle(self, revision: int) -> None:
        """Before an answer at ``revision``: the revision order's commit-wait, after which
        every write that starts lands above it (nothing to wait for on one shard)."""

    @property
    def formats_settled(self) -> bool:
        """Whether the command formats this member proposes are settled (see
        :meth:`settle_formats`); checked before every KV call, so a plain attribute."""

    async def settle_formats(self) -> None:
        """At startup, before the first KV call is served: wait (bounded) until every
        member advertised the command format this one applies, so that a new cluster's
        first writes already take ordered revisions and its reads answer at the store's
        revision, instead of the formats every older version applies."""

    # --- KV -------------------------------------------------------------------------------
    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """Read; linearizable unless ``req.serializable``."""

    async def put(self, req: rpc_pb2.PutRequest) -> rpc_pb2.PutResponse:
        """Write one key through consensus."""

    async def delete_range(self, req: rpc_pb2.DeleteRangeRequest) -> rpc_pb2.DeleteRangeResponse:
        """Delete a range through consensus."""

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """Apply a transaction through consensus (a read-only one may be served as a read)."""

    async def compact(self, req: rpc_pb2.CompactionRequest) -> rpc_pb2.CompactionResponse:
        """Compact history up to ``req.revision``."""

    # --- leases ---------------------------------------------------------------------------
    async def lease_grant(self, req: rpc_pb2.LeaseGrantRequest) -> rpc_pb2.LeaseGrantResponse:
        """Create a lease."""

    async def lease_revoke(self, req: rpc_pb2.LeaseRevokeRequest) -> rpc_pb2.LeaseRevokeResponse:
        """Revoke a lease and delete its keys."""

    async def lease_keepalive(self, lease_id: int) -> int:
        """Renew a lease; returns its TTL in seconds, 0 when the lease is unknown/expired."""

    async def lease_time_to_live(
        self, req: rpc_pb2.LeaseTimeToLiveRequest
    ) -> rpc_pb2.LeaseTimeToLiveResponse:
        """Remaining and granted TTL (``TTL=-1`` for an unknown lease), optionally the keys."""

    async def lease_leases(self) -> rpc_pb2.LeaseLeasesResponse:
        """Every live lease."""

    # --- cluster --------------------------------------------------------------------------
    async def members(self, linearizable: bool = False) -> list[MemberInfo]:
        """The cluster's members."""

    async def member_add(
        self, peer_urls: Sequence[str], is_learner: bool
    ) -> tuple[MemberInfo, list[MemberInfo]]:
        """Add a member (accord: a node joining); returns it and the new member list."""

    async def member_remove(self, member_id: int) -> list[MemberInfo]:
        """Remove a member (accord: a node leaving); returns the new member list."""

    async def member_update(self, member_id: int, peer_urls: Sequence[str]) -> list[MemberInfo]:
        """Change a member's peer URLs; returns the new member list."""

    async def member_promote(self, member_id: int) -> list[MemberInfo]:
        """Promote a learner to voter; returns the new member list."""

    # --- maintenance ----------------------------------------------------------------------
    async def status(self) -> StatusInfo:
        """This member's status."""

    async def alarm(self, req: rpc_pb2.AlarmRequest) -> list[tuple[int, int]]:
        """Get, raise or clear alarms; returns ``(member_id, AlarmType)`` pairs."""

    async def snapshot(self) -> tuple[int, bytes]:
        """``(revision, backup file)``: a consistent image of everything this member
        holds, in the format of ``accord/services/cluster/snapfile.py``."""

    async def defragment(self) -> None:
        """Reclaim storage space on this member."""

    async def hash(self) -> int:
        """A 32-bit hash of this member's whole store."""

    async def hash_kv(self, revision: int) -> HashKVResult:
        """A 32-bit hash of the MVCC keys up to ``revision`` (0 = current)."""

    async def move_leader(self, target_id: int) -> None:
        """Transfer leadership to ``target_id``."""


def now_ms() -> int:
    """Wall-clock milliseconds, the leader clock that lease commands carry."""
    return time.time_ns() // 1_000_000


class StateMachineBackend(ABC):
    """The KV and lease half of :class:`Backend`, on top of one ``KVStateMachine`` per shard.

    Writes are validated first (so bad input, including a request over the size limit, is
    refused before it is proposed and changes nothing), encoded with the state machine's
    static encoders and handed to :meth:`commit` for the shard of their key. Reads call
    :meth:`read_barrier` first unless they are serializable. While a NOSPACE alarm is
    raised, requests that would add data (Put, a Txn with a Put, LeaseGrant) fail with
    etcd's "database space exceeded"; reads and deletions still work, as in etcd.

    With several shards (``accord/services/kv/sharding.py`` says which key is where):

    * a linearizable range over several shards passes a ReadIndex barrier on each, picks
      R = the highest of their revisions (or the requested revision), floors every shard
      that is behind at R (a Raft entry that raises its revision without a change, so no
      shard ever writes at or below R afterwards), then reads each shard at R and merges:
      one consistent snapshot at R, and a watch from R+1 misses nothing;
    * a DeleteRange over several shards is a multi-shard Txn of that one delete: atomic,
      at one revision on every shard;
    * a Txn over several shards commits atomically at one revision through intents and
      a record on its lowest shard (:class:`~accord.services.kv.xcoord.Coordinator`,
      ``docs/txn.md``); a write that meets an intent is refused in apply and proposed
      again once it is resolved, a linearizable read that meets one waits for it;
    * leases live on shard 0 (their clock, TTL, keepalives and expiry); a grant and a
      revocation are also applied on every other shard, which keeps the set of live lease
      ids and the keys attached there, so a Put with a lease is checked where it applies,
      and a revocation deletes the lease's keys on every shard: it is revoked (or
      expired) at one revision on all of them through intents that also hold the lease
      id (``xlease.py``), so a Put with it on any shard is before or after, as on one
      etcd (until every member applies that command: shard 0 first, then each other);
    * Compact(R) floors and compacts every shard at R.
    """

    def __init__(self, machines: KVStateMachine | Sequence[KVStateMachine]) -> None:
        from accord.services.kv.statemachine import KVStateMachine

        self.machines: list[KVStateMachine] = (
            [machines] if isinstance(machines, KVStateMachine) else list(machines)
        )
        if not self.machines:
            raise ValueError("a backend needs at least one shard")
        self.sm = self.machines[0]
        """Shard 0: the home of leases, and the only shard of a one-shard store."""
        self.shards = len(self.machines)
        if self.shards > 1:
            for i, m in enumerate(self.machines):
                if m.stripe == (1, 0):
                    m.set_stripe((self.shards, i))
                elif m.stripe != (self.shards, i):
                    raise ValueError(f"shard {i} is built as {m.stripe}, not ({self.shards}, {i})")
        self.alarms = AlarmTable()
        self._hub: WatchHub | ShardedWatchHub = self.sm.watch_hub
        if self.shards > 1:
            from accord.services.kv.shardwatch import ShardedWatchHub

            n = self.shards
            self._hub = ShardedWatchHub(
                [m.watch_hub for m in self.machines],
                lambda key, end: sharding.shards_of_range(key, end, n),
                self._advance_watch,
                self.floor,
            )
        self._floor_want: dict[int, int] = {}
        """Per shard: the revision merged watchers wait for it to close (``_advance_watch``)."""
        self._floor_tasks: set[asyncio.Task[None]] = set()
        self._floors_in_flight: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        """Per shard: the highest floor proposed and not yet applied, and its commit
        (:meth:`floor` shares it with every caller that wants that revision or less)."""
        self.xcoord = Coordinator(self, self.sm.limits)
        """Multi-shard Txns, and the resolution of the intents they leave."""
        self.order = RevisionOrder(self.shards) if self.shards > 1 else None
        """Ordered stamps and commit-waits (``revorder.py``); None with one shard, whose
        revisions are etcd's own counter."""
        self.broken_floors_unshared = False
        """A variant for tests: every floor proposes its own entries (before sharing)."""
        self.broken_read_below_decided = False
        """A deliberately broken variant for tests: a multi-shard read that waited for a
        Txn decided above the revision it chose reads at that revision anyway (and misses
        a Txn answered before it began). Never set outside tests."""
        self.broken_lease_own_revisions = False
        """A deliberately broken variant for tests: a lease revoke across shards decided
        on shard 0 and then deleted on each other shard at its own revision (``xlease``).
        Never set outside tests."""
        self.broken_read_waits_once = False
        """A deliberately broken variant for tests (the behaviour before 7d332df): a
        one-shard read waits for the intents in its way once, and then answers at the
        shard's revision even if an intent prepared meanwhile raised it to its
        reservation. Never set outside tests."""
        self.broken_lease_plain_path = False
        """A deliberately broken variant for tests (the behaviour before every revoke took
        ``xlease``): a lease whose keys lie on one shard or none, seen after a barrier on
        each, is revoked on shard 0 and then dropped by each other shard, so a Put with
        it racing the revoke on another shard lands and its key goes at that shard's own
        revision. Never set outside tests."""

    def set_clock_drift(self, max_drift_ms: float, guard: ClockGuard | None = None) -> None:
        """The bound on the members' clock difference the commit-wait allows for
        (``--max-clock-offset``; ``revorder.py``), and the guard that refuses to stamp
        while this member's clock disagrees with the cluster's (``clockguard.py``; its
        wall clock is the one stamped); nothing to do with one shard."""
        if self.order is not None:
            clock = guard.wall_ns if guard is not None else time.time_ns
            self.order = RevisionOrder(self.shards, max_drift_ms, clock, guard)
        elif max_drift_ms < 0:
            raise ValueError("max_drift_ms must be >= 0")

    # --- what a subclass supplies ---------------------------------------------------------
    @abstractmethod
    async def commit(self, command: bytes, shard: int = 0) -> Any:
        """Replicate ``command`` on ``shard``; return what applying it returned (or raise)."""

    @abstractmethod
    async def read_barrier(self, shard: int = 0) -> None:
        """Return once this member has applied everything ``shard`` committed before."""

    def leads(self, shard: int) -> bool:
        """Whether this member leads ``shard`` (the recovery of stale intents runs on a
        shard's leader; a single process leads every shard)."""
        return True

    async def commit_free(self, command: bytes, shard: int) -> Any:
        """:meth:`commit`, proposed again (after the intent is resolved) while the apply
        answers that it met a multi-shard Txn's intent."""
        for _ in range(1000):
            try:
                return await self.commit(command, shard)
            except errors.Locked as e:
                await self.xcoord.wait_free(shard, (), txn_id=e.txn_id)
        raise errors.TIMEOUT

    def below_unapplied(self, shards: Sequence[int], rev: int,
                        revisions: Mapping[int, int] | None = None) -> int:
        """``rev``, or just below the lowest multi-shard commit at or below it that one of
        ``shards`` (applied here) applied and another shard the read covers (a
        participant too) has not yet: on one member the replicas of a Txn's shards
        apply at their own pace, and a serializable read must not show the share of one
        without the other's. ``revisions``: every covered shard's revision (a read over
        several workers' shards); else the covered shards are ``shards``, all here.
        Commits every known participant applied are forgotten (``recent_commits``)."""
        machines, local = self.machines, self.local
        known = revisions if revisions is not None else {
            s: machines[s].revision for s in shards}

        def revision(p: int) -> int | None:
            if p in known:
                return known[p]
            return machines[p].revision if local is None or p in local else None

        for s in shards:
            recent = machines[s].recent_commits
            while recent and all((r := revision(p)) is not None and r >= recent[0][0]
                                 for p in recent[0][1]):
                recent.popleft()
            for r, parts in recent:
                if r <= rev and any(p != s and p in known and known[p] < r for p in parts):
                    rev = r - 1
        return rev

    async def wait_intents(self, shard: int, ranges: Sequence[KeyRange], rev: int) -> int:
        """Before a linearizable read at ``rev`` on ``shard``: wait out the intents in its
        way (no-op when the shard has none, the common case); returns the highest
        revision at which those it waited for committed here (``Coordinator.wait_free``)."""
        if self.machines[shard].intents.intents:
            return await self.xcoord.wait_free(shard, ranges, below=rev)
        return 0

    async def _wait_one_shard_read(self, shard: int, ranges: Sequence[KeyRange],
                                   revision: int, start: int) -> None:
        """Before a linearizable read of one shard: wait out the intents over ``ranges`` at
        or below the revision it answers at (``revision``, or the shard's latest and the
        read's ``start``), again while one is still in the way: an intent prepared while
        the read waited raised the shard to its reservation, and a read answering there
        must not miss the Txn that commits there."""
        sm = self.machines[shard]
        for _ in range(1000):
            below = revision if revision > 0 else max(sm.revision, start)
            if not sm.intents.in_way(ranges, below=below):
                return
            await self.wait_intents(shard, ranges, below)
            if self.broken_read_waits_once:
                return
        raise errors.TIMEOUT

    async def _read_revision(
        self, shards: Sequence[int], ranges: Sequence[KeyRange], rev: int, chosen: bool,
        fenced: int = 0,
    ) -> int:
        """The revision of a linearizable read over several shards: ``rev`` floored on
        every shard (unless the shards' read fences already hold it: ``rev <= fenced``,
        the read's :meth:`read_start`) and the intents in the way waited out. A read at
        a revision it chose itself (``chosen``: the client gave none) that waited for a
        Txn which then committed above ``rev`` reads again at that revision, so that it
        sees a Txn answered before it began (``PREPARE_DECIDE`` may decide above a
        participant's reserved revision); a read at the client's revision reads there."""
        while True:
            if rev > fenced:
                await self.floor(shards, rev)
            met = await self._each(shards, lambda s, r=rev: self.wait_intents(s, ranges, r))
            top = max(met)
            if not chosen or top <= rev or self.broken_read_below_decided:
                return rev
            rev = top

    @property
    def fenced_reads(self) -> bool:
        """Whether every shard's leader fences reads (:meth:`read_fence`), so that a
        linearizable read may answer at its :meth:`read_start`; a replicated backend
        says so once every member advertised ``revorder.READ_FENCE_GATE``."""
        return False

    def read_fence(self) -> bytes | None:
        """What a shard's leader appends before anything it appends after answering
        reads (``MultiRaftHost.fence_reads``): a floor at ``RevisionOrder.fence``, above
        every revision those reads answered; None with one shard. Raises
        ``ClockUntrusted`` while the guard refuses this member's clock."""
        order = self.order
        if order is None:
            return None
        return self.sm.encode_floor(order.fence())

    def read_start(self) -> int:
        """The revision a linearizable read that starts now answers at, at least
        (``RevisionOrder.read_revision``): above every write acknowledged before, on any
        shard, as one etcd's current revision is. 0 where reads are not fenced (one
        shard, the gate closed) or the guard refuses this member's clock: the read then
        answers at the revision of the shards it reads."""
        order = self.order
        if order is None or not self.fenced_reads:
            return 0
        try:
            return order.read_revision()
        except ClockUntrusted:
            return 0

    def latest_revision(self) -> int:
        """The highest revision a request may name now (above it: etcd's future-revision
        error): the highest this member applied on any shard, or, with fenced reads, the
        revision a read starting now answers at, if higher."""
        return max(self.revision, self.read_start())

    async def resolve_stale_intents(self) -> int:
        """The recovery pass over the shards this member leads (``docs/txn.md``)."""
        if self.shards == 1:
            return 0
        return await self.xcoord.resolve_stale()

    def lease_clock(self) -> tuple[int, int]:
        """``(now_ms, term)`` stamped on lease commands.

        The default is wall-clock milliseconds with term 0 (what a single process needs);
        a replicated backend returns its own clock and its Raft term (see STORE_API.md).
        """
        return now_ms(), 0

    async def _reach(self, shard: int, revision: int) -> None:
        """Before a linearizable read of one shard at a ``revision`` above that shard's
        own: a revision of the store (some shard has it, after barriers on all) is
        readable on every shard, as on one etcd, once this shard is floored there;
        above every shard's it stays etcd's future-revision error."""
        await self._each(range(self.shards), self.read_barrier)
        if revision <= self.latest_revision():
            await self.floor([shard], revision)

    def _advance_watch(self, shards: list[int], revision: int) -> None:
        """A merged watcher holds events at ``revision`` until ``shards`` close it: floor
        them there (one task per shard at a time, taking the highest wanted), then wake
        the merged watchers (``shardwatch.Advance``)."""
        for s in shards:
            if revision <= self._floor_want.get(s, 0):
                continue
            start = s not in self._floor_want
            self._floor_want[s] = revision
            if start:
                task = asyncio.get_running_loop().create_task(
                    self._floor_loop(s), name=f"watch-floor-{s}")
                self._floor_tasks.add(task)
                task.add_done_callback(self._floor_tasks.discard)

    async def _floor_loop(self, shard: int) -> None:
        def woke() -> None:
            if isinstance(self._hub, ShardedWatchHubType):
                self._hub.wake()

        try:
            await chase_floor(lambda: self._floor_want[shard],
                              lambda want: self.floor([shard], want), woke)
        finally:
            del self._floor_want[shard]

    # --- shared ---------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        """The highest revision applied on this member over all shards."""
        return max(int(m.revision) for m in self.machines)

    @property
    def watch_hub(self) -> WatchHub | ShardedWatchHub:
        """The watch hub over every shard (one shard: that shard's own hub)."""
        return self._hub

    def shard_of(self, key: bytes) -> int:
        """The shard that holds ``key``."""
        return sharding.shard_of(key, self.shards)

    def _check_space(self) -> None:
        if self.alarms.has(rpc_pb2.NOSPACE):
            raise errors.NO_SPACE

    async def _each(self, shards: Sequence[int], make: Any) -> list[Any]:
        """Run ``make(shard)`` for every shard at once; the first error is raised."""
        if len(shards) == 1:
            return [await make(shards[0])]
        return list(await asyncio.gather(*(make(s) for s in shards)))

    async def cut_revision(self) -> int:
        """The revision of a consistent cut of every shard (a backup over several
        shards): a ReadIndex barrier on each, R = the highest revision, every shard
        floored at R (none writes at or below R afterwards) and the intents at or below
        R waited out, so that no multi-shard Txn is half in the cut (its record shard's
        share decided at R, another's still to commit); R moves up to a Txn that decided
        above it meanwhile, as a read at a revision of its own does."""
        every = list(range(self.shards))
        await self._each(every, self.read_barrier)
        return await self._read_revision(every, [KeyRange(b"", None, False)], self.revision,
                                         True)

    async def floor(self, shards: Sequence[int], revision: int) -> None:
        """Raise every given shard that is behind ``revision`` to it, through its log.

        Floors wanted at once share their entries: a shard with a floor at ``revision``
        or above in flight gets no other, its callers wait for that one (progress
        requests of many watch streams and multi-shard reads all floor the member's idle
        shards at the store's current revision, so under load they would otherwise
        propose one entry each per shard)."""
        behind = [s for s in shards if self.machines[s].revision < revision]
        if behind:
            await self._each(behind, lambda s: self._floor_shard(s, revision))

    async def _floor_shard(self, shard: int, revision: int) -> None:
        flight = self._floors_in_flight.get(shard)
        if flight is None or flight[0] < revision or self.broken_floors_unshared:
            commit = asyncio.ensure_future(self.commit(self.sm.encode_floor(revision), shard))
            commit.add_done_callback(_retrieve)
            flight = (revision, commit)
            self._floors_in_flight[shard] = flight

            def landed(_: object, shard: int = shard, flight: tuple[int, Any] = flight) -> None:
                if self._floors_in_flight.get(shard) is flight:
                    del self._floors_in_flight[shard]

            commit.add_done_callback(landed)
        # Shielded: a caller that gives up (a bounded wait) leaves the entry to the others.
        await asyncio.shield(flight[1])

    async def range(self, req: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """Linearizable (or, with ``serializable``, local) range read. A starting
        member's linearizable reads wait for the formats to settle (the server's
        interceptor holds every other key-space call); a serializable one answers from
        this replica at once, as etcd's does."""
        if not self.formats_settled and not req.serializable:
            await self.settle_formats()
        self.sm.validate_range(req)
        shards = sharding.shards_of_range(req.key, req.range_end, self.shards)
        if len(shards) == 1:
            shard = shards[0]
            sm = self.machines[shard]
            if req.serializable:
                if req.revision > sm.revision and self.shards > 1:
                    # Local and possibly stale, as the multi-shard serializable read
                    # below: at the shard's latest, for a revision of the store.
                    if req.revision > self.latest_revision():
                        raise errors.FUTURE_REV
                    part = sm.range(fanout.per_shard_request(req, sm.revision), validated=True)
                    return fanout.merge_ranges(req, [part], req.revision, self.sm.limits)
                return sm.range(req, validated=True)
            start = self.read_start()
            await self.read_barrier(shard)
            if req.revision > max(sm.revision, start) and self.shards > 1:
                await self._reach(shard, req.revision)
            if sm.intents.intents:
                await self._wait_one_shard_read(shard, [KeyRange.of(req.key, req.range_end)],
                                                req.revision, start)
            if sm.revision < req.revision <= start:
                # At or below the read's start: the fence keeps everything after the
                # shard's latest above it, so the shard's latest is the state there.
                part = sm.range(fanout.per_shard_request(req, sm.revision), validated=True)
                resp = fanout.merge_ranges(req, [part], sm.revision, self.sm.limits)
            else:
                resp = sm.range(req, validated=True)
            if start > resp.header.revision:
                resp.header.revision = start
            if self.order is not None:
                await self.settle(resp.header.revision)
            return resp
        if req.serializable:
            # Local and possibly stale, as etcd's serializable reads: each shard as of the
            # requested revision or its own latest, whichever is lower; never a part of
            # a multi-shard Txn without the rest (``serializable_revision``).
            top = max(self.machines[s].revision for s in shards)
            rev = req.revision if req.revision > 0 else top
            if rev > top and rev > self.latest_revision():
                raise errors.FUTURE_REV
            kr = [KeyRange.of(req.key, req.range_end)]
            read_at = rev
            if req.revision > 0:
                await self._each(shards, lambda s: self.wait_intents(s, kr, rev))
            elif not self.broken_serializable_parts:
                read_at = rev = fanout.serializable_revision(
                    rev, (self.machines[s].intents.lowest_in_way(kr) for s in shards))
            if not self.broken_serializable_parts:
                read_at = self.below_unapplied(shards, read_at)
                if req.revision <= 0:
                    rev = read_at
            parts = [
                self.machines[s].range(
                    fanout.per_shard_request(req, min(read_at, self.machines[s].revision)))
                for s in shards
            ]
            return fanout.merge_ranges(req, parts, rev, self.sm.limits)
        start = self.read_start()
        await self._each(shards, self.read_barrier)
        top = max(self.machines[s].revision for s in shards)
        rev = req.revision if req.revision > 0 else (start or top)
        if rev > top and rev > start and rev > self.latest_revision():
            raise errors.FUTURE_REV
        kr = [KeyRange.of(req.key, req.range_end)]
        rev = await self._read_revision(shards, kr, rev, req.revision <= 0, start)
        # A shard behind ``rev`` is fenced or floored there: its latest is its state at
        # rev; a shard ahead of it is read at rev (writes above the read's start are
        # concurrent with it, and a fence or a floor can stand above the start).
        parts = [self.machines[s].range(
            fanout.per_shard_request(req, min(rev, self.machines[s].revision)))
            for s in shards]
        await self.settle(rev)
        return fanout.merge_ranges(req, parts, rev, self.sm.limits)

    formats_settled = True
    """Nothing to settle in one process; a replicated backend settles at startup."""

    local: frozenset[int] | None = None
    """The shards this process applies (None: all; a worker of a node applies some)."""

    broken_serializable_parts = False
    """A deliberately broken variant for tests: a serializable read over several shards
    answers at their highest revision whatever intents and unapplied shares lie below it,
    as it did before, and so can show part of a multi-shard Txn. Never set outside
    tests."""

    async def settle_formats(self) -> None:
        """Nothing to wait for in one process (every format is this one's)."""
        return

    @property
    def compact_commands(self) -> bool:
        """Whether every member applies format-2 (compact) commands, so a proposer may
        send them; a replicated backend says so once every member advertised it."""
        return True

    @property
    def ordered_commands(self) -> bool:
        """Whether every member applies ordered stamps (``revorder.ORDER_GATE``); a
        replicated backend says so once every member advertised it."""
        return True

    def stamp(self, noop_floor: bool = False) -> int:
        """The ``min_revision`` of a write proposed now: an ordered stamp with several
        shards (once the gate is open), else 0 (the shard's own next revision);
        ``noop_floor`` (a Txn, a DeleteRange: writes that may write nothing) marks it
        once reads are fenced (``RevisionOrder.stamp``)."""
        order = self.order
        if order is None or not self.ordered_commands:
            return 0
        try:
            return order.stamp(noop_floor and self.fenced_reads)
        except ClockUntrusted as e:
            raise EtcdError(grpc.StatusCode.UNAVAILABLE, str(e)) from None

    async def settle(self, revision: int) -> None:
        """Before answering at ``revision``: the commit-wait of the revision order."""
        order = self.order
        if order is not None and not order.ready(revision) and self.ordered_commands:
            await order.settle(revision)

    @property
    def multi_shard_txns(self) -> bool:
        """Whether a Txn over several shards may run (a replicated backend: once every
        member applies its commands); else it is refused naming the shards."""
        return True

    @property
    def multi_shard_leases(self) -> bool:
        """Whether a lease revoke may run across shards at one revision (a replicated
        backend: once every member applies its command, ``xcommands.XLEASE_GATE``)."""
        return True

    @property
    def decided_commits(self) -> bool:
        """Whether a multi-shard Txn with ordered stamps may prepare and decide on its
        record shard in one entry (``PREPARE_DECIDE``, its revision taken there) instead
        of ``RESERVE`` rounds (a replicated backend: once every member applies it,
        ``xcommands.XDECIDE_GATE``)."""
        return True

    async def _multi_shard_txn(
        self, req: rpc_pb2.TxnRequest, touched: dict[int, bytes]
    ) -> rpc_pb2.TxnResponse:
        if not self.multi_shard_txns:
            raise sharding.txn_spans_shards(touched)
        return await self.xcoord.txn(req, list(touched))

    async def put(self, req: rpc_pb2.PutRequest) -> rpc_pb2.PutResponse:
        """Validate, encode and commit a Put on its key's shard."""
        self._check_space()
        if self.shards == 1:
            if self.compact_commands:
                command = self.sm.validate_and_encode_put(req)
            else:
                command = self.sm.validate_and_encode_put_v1(req)
            try:
                result: rpc_pb2.PutResponse = await self.commit(command, 0)
            except errors.Locked:
                result = await self.commit_free(command, 0)
            return result
        if self.compact_commands:
            command = self.sm.validate_and_encode_put(req, self.stamp())
        else:
            command = self.sm.validate_and_encode_put_v1(req)
        shard = self.shard_of(req.key)
        try:
            result = await self.commit(command, shard)
        except errors.Locked:
            result = await self.commit_free(command, shard)
        await self.settle(result.header.revision)
        return result

    async def delete_range(self, req: rpc_pb2.DeleteRangeRequest) -> rpc_pb2.DeleteRangeResponse:
        """Validate, encode and commit a DeleteRange on every shard it may touch."""
        self.sm.validate_delete_range(req)
        shards = sharding.shards_of_range(req.key, req.range_end, self.shards)
        if len(shards) > 1 and self.multi_shard_txns:
            # Atomic at one revision on every shard: a Txn of this one delete.
            whole = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_delete_range=req)])
            done = await self.xcoord.txn(whole, shards)
            gone: rpc_pb2.DeleteRangeResponse = done.responses[0].response_delete_range
            gone.header.revision = done.header.revision
            return gone
        enc = self.sm.encode_delete_range(req, min_revision=self.stamp(noop_floor=True))
        parts = await self._each(shards, lambda s: self.commit_free(enc, s))
        if len(parts) == 1:
            result: rpc_pb2.DeleteRangeResponse = parts[0]
        else:
            result = fanout.merge_deletes(parts)
        await self.settle(result.header.revision)
        return result

    async def txn(self, req: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """Validate, then serve a read-only Txn as a read, or encode and commit it.

        A Txn whose keys lie on several shards goes to the multi-shard protocol."""
        compact = self.compact_commands
        items = self.sm.plain_puts(req) if compact else None
        if items is not None:
            return await self._txn_puts(req, items)
        self.sm.validate_txn(req)
        shard = 0
        if self.shards > 1:
            touched = sharding.shards_of_txn(req, self.shards)
            if len(touched) > 1:
                if self.sm.is_read_only_txn(req):
                    return await self._read_txn_across(req, sorted(touched))
                if self.alarms.has(rpc_pb2.NOSPACE) and _txn_puts(req):
                    self._check_space()
                return await self._multi_shard_txn(req, touched)
            shard = next(iter(touched), 0)
        sm = self.machines[shard]
        if sm.is_read_only_txn(req):
            # As etcd does: a Txn that cannot write is a read, linearizable through
            # ReadIndex, with no log entry.
            start = self.read_start()
            await self.read_barrier(shard)
            top = 0
            if self.shards > 1:
                # A range may name any revision of the store, as on one etcd; above the
                # shard's own, as a Range does (``range``): its latest is its state there
                # up to the read's start (the fence), above it once floored there.
                want = _range_revision(req)
                if want > max(sm.revision, start):
                    await self._reach(shard, want)
                top = max(sm.revision, start)
            if sm.intents.intents:
                ranges = [KeyRange.of(k, e) for k, e in all_ranges(req)]
                await self._wait_one_shard_read(shard, ranges, 0, start)
            read: rpc_pb2.TxnResponse = sm.read_txn(req, top)
            if start > read.header.revision:
                txn.answer_at(read, start)  # the store's revision, as the Range's
            await self.settle(read.header.revision)
            return read
        if self.alarms.has(rpc_pb2.NOSPACE) and _txn_puts(req):
            self._check_space()
        if self.shards > 1:
            want = _range_revision(req)
            if want > sm.revision:
                # A revision another shard made: floor this one there first, so that
                # every member applies the Txn with the shard at or above it (one etcd
                # reads any revision up to its current one; the apply refuses a range
                # above the shard's latest as a future revision).
                await self._reach(shard, want)
        command = self.sm.encode_txn(req, compact=compact,
                                     min_revision=self.stamp(noop_floor=True))
        try:
            result: rpc_pb2.TxnResponse = await self.commit(command, shard)
        except errors.Locked:
            result = await self.commit_free(command, shard)
        if self.shards > 1:
            # Every part at the revision one etcd gives it: its reads before its first
            # change at the one just below the Txn's, not the shard's own latest (a lower
            # name for the same state on this shard, not for the store); a Txn that wrote
            # nothing, raised to its stamp by the apply, at that one throughout.
            txn.answer_at(result, result.header.revision)
        await self.settle(result.header.revision)
        return result

    async def _read_txn_across(
        self, req: rpc_pb2.TxnRequest, shards: list[int]
    ) -> rpc_pb2.TxnResponse:
        """A read-only Txn over several shards, served as a multi-shard range is: barriers,
        R = the read's start (or the highest revision), every shard floored at R unless
        the read fences hold it, the intents in the way waited out, then the compares and
        ranges of every shard at R (no revision of its own, as etcd gives a read-only Txn
        none)."""
        start = self.read_start()
        await self._each(shards, self.read_barrier)
        rev = start or max(self.machines[s].revision for s in shards)
        plan = TxnPlan(req)
        ranges = [KeyRange.of(k, e) for k, e in plan.ranges]
        rev = await self._read_revision(shards, ranges, rev, True, start)
        # A shard behind ``rev`` is fenced or floored there: its latest is its state at rev.
        shares = [self.machines[s].read_share(plan, min(rev, self.machines[s].revision))
                  for s in shards]
        path = xtxn.path_of(plan, xtxn.combine(plan, [c for c, _read in shares]))
        err = xtxn.first_error(plan, path, {}, rev + 1,
                               max(self.machines[s].first_revision for s in shards))
        if err is not None:
            raise err
        parts = {s: read(path) for s, (_c, read) in zip(shards, shares, strict=True)}
        await self.settle(rev)
        return xtxn.merge(req, path, parts, rev, self.sm.limits, self.shard_of)

    async def _txn_puts(self, req: rpc_pb2.TxnRequest, items: list[Any]) -> rpc_pb2.TxnResponse:
        """:meth:`txn` of a Txn of plain puts (a batch): the same checks in the same order,
        each key read from the message once, and the compact command."""
        size = req.ByteSize()
        self.sm.validate_puts(items, size)
        shard = 0
        if self.shards > 1:
            found = _shard_of_keys(items[0::3], self.shards)
            if found is None:
                self._check_space()
                return await self._multi_shard_txn(
                    req, sharding.shards_of_txn(req, self.shards))
            shard = found
        self._check_space()
        command = self.sm.encode_puts(items, size, min_revision=self.stamp())
        try:
            result: rpc_pb2.TxnResponse = await self.commit(command, shard)
        except errors.Locked:
            result = await self.commit_free(command, shard)
        await self.settle(result.header.revision)
        return result

    async def compact(self, req: rpc_pb2.CompactionRequest) -> rpc_pb2.CompactionResponse:
        """Validate, encode and commit a compaction on every shard (floored at it first)."""
        if self.shards == 1:
            self.sm.validate_compact(req)
            result: rpc_pb2.CompactionResponse = await self.commit(self.sm.encode_compact(req))
            return result
        every = range(self.shards)
        check_compaction(req.revision, *self.revision_state(every))
        resp = rpc_pb2.CompactionResponse()
        resp.header.revision = await self.compact_shards(req, every)
        return resp

    def revision_writes_ago(self, n: int) -> int:
        """The revision ``n`` writes below the store's latest on this replica: etcd's
        ``rev - n`` on one shard. Several shards' revisions are clock stamps, not a
        counter: there it is the (n+1)-th highest revision any shard wrote at (a write on
        several shards counted once), so a Compact there keeps the last ``n`` writes'
        revisions readable. 0 when the history holds no more than ``n``. A replica that
        lags answers lower (keeps more), never higher."""
        if self.shards == 1:
            return max(0, self.sm.revision - n)
        return nth_latest(self.revisions_written(range(self.shards), n + 1), n)

    def revisions_written(self, shards: Iterable[int], n: int) -> set[int]:
        """The ``n`` highest revisions each of ``shards`` wrote at on this replica, all
        together (a write on several shards counted once): what
        :func:`nth_latest` picks from, here or gathered over a node's workers."""
        return {r for s in shards for r in self.machines[s].recent_revisions(n)}

    def revision_state(self, shards: Iterable[int]) -> tuple[int, int]:
        """``(highest revision, highest compaction)`` of ``shards`` on this replica: what
        a Compact over them is checked against (:func:`check_compaction`)."""
        ms = [self.machines[s] for s in shards]
        top = max(max(int(m.revision) for m in ms), self.read_start())
        return top, max(int(m.compact_revision) for m in ms)

    async def compact_shards(self, req: rpc_pb2.CompactionRequest, shards: Iterable[int]) -> int:
        """Compact ``shards`` at ``req.revision``, each floored there first and the intents
        below it waited out; the highest revision their answers carry."""
        chosen = list(shards)
        for s in chosen:
            if self.machines[s].intents:
                await self.xcoord.wait_free(s, (), below=req.revision)
        enc = self.sm.encode_compact(req, min_revision=req.revision)
        parts = await self._each(chosen, lambda s: self.commit_free(enc, s))
        return max(int(p.header.revision) for p in parts)

    # --- leases ---------------------------------------------------------------------------
    async def _on_other_shards(self, command: bytes, tolerate: tuple[EtcdError, ...]) -> None:
        """Apply a lease command on shards 1..N-1; the tolerated errors count as done."""

        async def one(s: int) -> None:
            try:
                await self.commit_free(command, s)
            except EtcdError as e:
                if not any(e.message == t.message for t in tolerate):
                    raise

        await self._each(range(1, self.shards), one)

    async def lease_grant(self, req: rpc_pb2.LeaseGrantRequest) -> rpc_pb2.LeaseGrantResponse:
        """Validate, encode and commit a lease grant stamped with this leader's clock."""
        self._check_space()
        self.sm.validate_lease_grant(req)
        result: rpc_pb2.LeaseGrantResponse = await self.commit(
            self.sm.encode_lease_grant(req, *self.lease_clock())
        )
        if self.shards > 1:
            everywhere = rpc_pb2.LeaseGrantRequest(TTL=req.TTL, ID=result.ID)
            try:
                await self._on_other_shards(
                    self.sm.encode_lease_grant(everywhere, *self.lease_clock()),
                    (errors.LEASE_EXISTS,),
                )
            except EtcdError:
                # Not usable on every shard: take it back (best effort: the lease loop
                # reaps what is left) and let the client retry.
                with contextlib.suppress(EtcdError):
                    await self.lease_revoke(rpc_pb2.LeaseRevokeRequest(ID=result.ID))
                raise
        return result

    async def _spread(self, lease_id: int) -> bool:
        """Whether ``lease_id``'s keys lie on several shards (after a barrier on each):
        only the broken variant :attr:`broken_lease_plain_path` asks."""
        await self._each(range(self.shards), self.read_barrier)
        return sum(1 for m in self.machines if m.lease_keys(lease_id)) > 1

    async def _atomic_revoke(self, lease_id: int) -> bool:
        """Whether revoking ``lease_id`` runs ``xlease`` (one revision, Puts with it held
        back on every shard until the decision): always with several shards once every
        member applies its command; else the older path (shard 0, then each other)."""
        if self.shards == 1 or not self.multi_shard_leases:
            return False
        if self.broken_lease_plain_path:
            return await self._spread(lease_id)
        return True

    async def lease_revoke(self, req: rpc_pb2.LeaseRevokeRequest) -> rpc_pb2.LeaseRevokeResponse:
        """Revoke a lease: its keys go on every shard, at one revision, and a Put with it
        on any shard is either before (its key goes at that revision) or after (it fails
        with lease-not-found), as on one etcd (``xlease.py``)."""
        if await self._atomic_revoke(req.ID):
            rev = await xlease.revoke(self.xcoord, req.ID,
                                      broken=self.broken_lease_own_revisions)
            resp = rpc_pb2.LeaseRevokeResponse()
            resp.header.revision = int(rev or self.revision)
            return resp
        enc = self.sm.encode_lease_revoke(req, min_revision=self.stamp())
        result: rpc_pb2.LeaseRevokeResponse = await self.commit_free(enc, 0)
        if self.shards > 1:
            await self._on_other_shards(enc, (errors.LEASE_NOT_FOUND,))
            result.header.revision = self.revision
        await self.settle(result.header.revision)
        return result

    async def lease_keepalive(self, lease_id: int) -> int:
        """Commit a renewal; the TTL granted, 0 for an unknown or expired lease."""
        result = await self.commit(self.sm.encode_lease_keepalive(lease_id, *self.lease_clock()))
        if isinstance(result, rpc_pb2.LeaseKeepAliveResponse):
            return int(result.TTL)
        return int(result)

    async def lease_time_to_live(
        self, req: rpc_pb2.LeaseTimeToLiveRequest
    ) -> rpc_pb2.LeaseTimeToLiveResponse:
        """Linearizable lease read (with ``keys``: the lease's keys on every shard)."""
        await self.read_barrier()
        resp = self.sm.lease_time_to_live(req, self.lease_clock()[0])
        if req.keys and self.shards > 1 and resp.TTL != -1:
            keys = list(resp.keys)
            keys.extend(await self.lease_keys_on(list(range(1, self.shards)), req.ID))
            del resp.keys[:]
            resp.keys.extend(sorted(keys))
        return resp

    async def lease_keys_on(self, shards: Sequence[int], lease_id: int) -> list[bytes]:
        """The keys attached to ``lease_id`` on ``shards`` (after a barrier on each)."""
        await self._each(list(shards), self.read_barrier)
        return [k for s in shards for k in self.machines[s].lease_keys(lease_id)]

    async def lease_leases(self) -> rpc_pb2.LeaseLeasesResponse:
        """Linearizable list of leases."""
        await self.read_barrier()
        return self.sm.lease_leases()

    async def expire_leases(self, limit: int = 1000) -> list[int]:
        """Leader duty: propose the expiry of every overdue lease; returns the ids revoked.

        Call it periodically on shard 0's leader (a replicated backend passes its term
        through :meth:`lease_clock`, so a new leader expires nothing before its first
        lease command rebased the deadlines). With several shards each overdue lease is
        expired at one revision on all of them (``xlease.py``), re-checked on shard 0 at
        its decision; until every member applies that command, shard 0 expires them in one
        command and the other shards then drop them."""
        now, term = self.lease_clock()
        ids = self.sm.expired_leases(now, term if term else None, limit)
        if not ids:
            return []
        if self.shards > 1 and self.multi_shard_leases:
            atomic = ids
            if self.broken_lease_plain_path:
                await self._each(range(self.shards), self.read_barrier)
                atomic = [i for i in ids if sum(1 for m in self.machines if m.lease_keys(i)) > 1]
            if atomic:
                done = await asyncio.gather(*(xlease.revoke(
                    self.xcoord, i, expire=True, broken=self.broken_lease_own_revisions)
                    for i in atomic), return_exceptions=True)
                failed = next((d for d in done if isinstance(d, BaseException)), None)
                if failed is not None:
                    raise failed
                gone = [i for i, d in zip(atomic, done, strict=True) if d is not None]
                taken = set(atomic)
                rest = [i for i in ids if i not in taken]
                return gone + (await self._expire_plain(rest, now, term) if rest else [])
        return await self._expire_plain(ids, now, term)

    async def _expire_plain(self, ids: list[int], now: int, term: int) -> list[int]:
        """Expire ``ids`` on shard 0 in one command, then drop them on the other shards."""
        result = await self.commit(
            self.sm.encode_lease_expire(ids, now, term, min_revision=self.stamp()))
        revoked = [int(i) for i in getattr(result, "revoked", ids)]
        # All at once: one round of proposals per shard, not one per lease.
        await asyncio.gather(*(self._drop_elsewhere(i) for i in revoked))
        return revoked

    async def _drop_elsewhere(self, lease_id: int) -> None:
        if self.shards > 1:
            enc = self.sm.encode_lease_revoke(rpc_pb2.LeaseRevokeRequest(ID=lease_id),
                                              min_revision=self.stamp())
            await self._on_other_shards(enc, (errors.LEASE_NOT_FOUND,))

    def stray_leases(self) -> set[int]:
        """Lease ids some shard other than 0 still holds although shard 0 does not: left
        behind by a revocation or an expiry interrupted between shards (or a grant that
        has not reached shard 0's replica here yet: only reap ids seen twice, apart)."""
        home = self.sm.leases.leases
        return {i for m in self.machines[1:] for i in m.leases.leases if i not in home}

    async def reap_stray_leases(self, ids: set[int]) -> None:
        """Revoke the given stray lease ids on the shards that still hold them."""
        for lease_id in sorted(ids):
            if lease_id not in self.sm.leases.leases:
                await self._drop_elsewhere(lease_id)

    async def alarm(self, req: rpc_pb2.AlarmRequest) -> list[tuple[int, int]]:
        """Alarms on this member's table."""
        return self.alarms.apply(req)

    async def hash_kv(self, revision: int) -> HashKVResult:
        """Hash of the MVCC keys up to ``revision`` (every shard's, combined)."""
        if self.shards == 1:
            h, compact_rev = self.sm.hash_kv(revision)
            return HashKVResult(int(h), int(compact_rev), self.revision)
        every = range(self.shards)
        check_hash_revision(revision, *self.revision_state(every))
        parts = self.shard_hashes(revision, every)
        return HashKVResult(fanout.combine_hashes([h for h, _c in parts]),
                            max(c for _h, c in parts), self.revision)

    def shard_hashes(self, revision: int, shards: Iterable[int]) -> list[tuple[int, int]]:
        """``(hash, compaction)`` of each of ``shards`` up to ``revision`` (0: its latest),
        combined in shard order by :meth:`hash_kv` (and across a node's workers the same
        way). A shard at or behind ``revision`` is hashed as it stands: it has nothing
        between (a shard written nothing since a compaction stands at the compaction's
        revision, which etcd would refuse to hash *at*, though nothing there changed)."""
        out = []
        for s in shards:
            m = self.machines[s]
            h, c = m.hash_kv(revision if 0 < revision < m.revision else 0)
            out.append((int(h), int(c)))
        return out

    @abstractmethod
    def header_info(self) -> HeaderInfo:
        """Identity and Raft facts for headers."""


def nth_latest(written: set[int], n: int) -> int:
    """The revision ``n`` writes below the latest of ``written`` (its ``n+1``-th
    highest): a Compact there keeps the last ``n`` writes' revisions readable. 0 when
    ``written`` holds no more than ``n``."""
    if len(written) <= n:
        return 0
    return heapq.nlargest(n + 1, written)[-1]


def check_compaction(revision: int, top: int, compacted: int) -> None:
    """etcd's refusals of a Compact at ``revision`` over shards whose highest revision is
    ``top`` and highest compaction ``compacted``."""
    if revision <= compacted:
        raise errors.COMPACTED
    if revision > top:
        raise errors.FUTURE_REV


def check_hash_revision(revision: int, top: int, compacted: int) -> None:
    """etcd 3.4's refusals of a HashKV at ``revision`` (0: the latest) over shards whose
    highest revision is ``top`` and highest compaction ``compacted``."""
    if 0 < revision <= compacted:
        raise errors.COMPACTED
    if revision > top:
        raise errors.FUTURE_REV


def _range_revision(req: rpc_pb2.TxnRequest) -> int:
    """The highest revision a range of ``req`` names, in any branch, nested Txns
    included (0: none). On the path of every one-shard Txn: one pass, no list built."""
    top = 0
    for branch in (req.success, req.failure):
        for op in branch:
            which = op.WhichOneof("request")
            if which == "request_range":
                r = op.request_range.revision
            elif which == "request_txn":
                r = _range_revision(op.request_txn)
            else:
                continue
            if r > top:
                top = r
    return top


def _txn_puts(req: rpc_pb2.TxnRequest) -> bool:
    """Whether any branch of the txn (nested included) holds a Put (etcd's quota cost)."""
    for op in list(req.success) + list(req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put":
            return True
        if kind == "request_txn" and _txn_puts(op.request_txn):
            return True
    return False


def _shard_of_keys(keys: list[bytes], shards: int) -> int | None:
    """The one shard holding all of ``keys`` (a batch's), else None (several shards).

    The common batch shares one closed prefix (``/a/b/``: one partition), which C-level
    ``startswith`` confirms without computing every key's partition."""
    first = keys[0]
    c = sharding.closed_prefix(first)
    if (
        c is not None
        and c != sharding.LOCK_GRANT_PREFIX
        and sum(map(bytes.startswith, keys, repeat(c))) == len(keys)
    ):
        return sharding.shard_of(first, shards)
    touched: dict[int, bytes] = {}
    seen: set[bytes] = set()
    for key in keys:
        part = sharding.partition_key(key)
        if part not in seen:
            seen.add(part)
            touched.setdefault(sharding.shard_of(key, shards), key)
    if len(touched) > 1:
        return None
    return next(iter(touched))


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a shared floor's failure as seen when every caller gave up waiting for it
    (asyncio would log it as never retrieved)."""
    if not fut.cancelled():
        fut.exception()
