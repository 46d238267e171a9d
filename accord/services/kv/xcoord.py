"""The coordinator of multi-shard Txns, and the resolution of intents (``docs/txn.md``).

:class:`Coordinator` runs on the member that received the Txn: prepare on every
participant, the decision on the record shard (the lowest participant), the commit on
the others, then one merged answer at the Txn's revision. :meth:`Coordinator.wait_free`
is what a reader or a writer that met an intent calls: it waits until the intent is gone
from this member's replica and resolves it itself once its deadline has passed, through
the record (whose log decides: a COMMIT already there wins, else the resolver's ABORT).
:meth:`Coordinator.resolve_stale` is the recovery loop's pass over the shards this member
leads, so that an intent nobody touches is resolved too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from accord.proto import rpc_pb2
from accord.services.kv import sharding, xcommands, xtxn
from accord.services.kv.errors import EtcdError
from accord.services.kv.intents import COMMITTED, Intent
from accord.services.kv.limits import Limits
from accord.services.kv.ranges import KeyRange
from accord.services.kv.statemachine import KVStateMachine
from accord.services.kv.txnplan import TxnPlan, plan_of

TXN_TIMEOUT_MS = 5_000
"""An intent's deadline after its prepare: past it, anyone may resolve it."""
WAIT_TIMEOUT_S = 30.0
"""How long a request waits for intents in its way before it fails (UNAVAILABLE)."""
MAX_ATTEMPTS = 64
"""Prepares a Txn tries (each after an abort: a shard moved past the candidate revision,
or another Txn held a key) before it fails."""
FAILPOINT_ENV = "ACCORD_FAILPOINT_XTXN"
"""Environment variable of the coordinator failpoint (tests only, like etcd's gofail):
``after-prepare`` or ``after-decision``; read by ``accord serve`` at start."""
FAILPOINT_PREFIX = b"/failpoint/"
"""Only a Txn with a key under this prefix stops at the failpoint, so a cluster started
with it serves every other Txn normally."""
FAILPOINT_STEPS = ("after-prepare", "after-decision")


class Participants(Protocol):
    """What the coordinator needs of the backend it runs in."""

    machines: list[KVStateMachine]
    shards: int

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        """Replicate ``command`` on ``shard``; return what applying it returned."""

    def lease_clock(self) -> tuple[int, int]:
        """``(now_ms, term)``: this member's clock, for deadlines."""

    def leads(self, shard: int) -> bool:
        """Whether this member leads ``shard`` (the recovery loop resolves only there)."""

    def stamp(self) -> int:
        """An ordered stamp (negative) for a write proposed now, or 0 (``revorder.py``)."""

    async def settle(self, revision: int) -> None:
        """The commit-wait before answering at ``revision``."""

    @property
    def decided_commits(self) -> bool:
        """Whether every member applies ``PREPARE_DECIDE`` and ``DECIDE``
        (``xcommands.XDECIDE_GATE``)."""


class Coordinator:
    """Multi-shard Txns over a backend's shards."""

    def __init__(self, parts: Participants, limits: Limits) -> None:
        self.parts = parts
        self.limits = limits
        self.broken_resolve_first = False
        """A deliberately broken variant for tests: the participants apply their writes
        before the record shard's decision, so a coordinator dying in between leaves a
        partial commit that recovery then aborts on the record. Never set outside tests."""
        self.broken_resolve_reserved = False
        """A deliberately broken variant for tests: a resolver commits a Txn decided by
        ``PREPARE_DECIDE`` on each participant at the revision that participant reserved,
        not at the one the record holds (its keys then land at several revisions). Never
        set outside tests."""
        self.stats = {"committed": 0, "aborted": 0, "retries": 0, "resolved": 0,
                      "reserve_rounds": 0}
        self._finishing: set[asyncio.Task[None]] = set()
        """Commits on the other participants still running after the answer (owned:
        :meth:`close` cancels and awaits them; recovery finishes what they leave)."""
        self.failpoint = ""
        """One of :data:`FAILPOINT_STEPS` (or empty): a Txn with a key under
        :data:`FAILPOINT_PREFIX` stops there for good, as if its coordinator had died
        (the test then kills it -9 and checks the recovery)."""

    def set_failpoint(self, step: str) -> None:
        """Arm the failpoint (tests only); an unknown step is refused."""
        if step not in ("", *FAILPOINT_STEPS):
            raise ValueError(f"{FAILPOINT_ENV} must be one of {FAILPOINT_STEPS}, not {step!r}")
        self.failpoint = step

    async def _stop_at(self, step: str, plan: TxnPlan) -> None:
        if self.failpoint == step and any(
                k.startswith(FAILPOINT_PREFIX) for k, _e in plan.ranges):
            await asyncio.Event().wait()

    def _now(self) -> int:
        return int(self.parts.lease_clock()[0])

    # --- the coordinator ------------------------------------------------------------------
    async def txn(self, req: rpc_pb2.TxnRequest, touched: Sequence[int]) -> rpc_pb2.TxnResponse:
        """Run ``req`` atomically over the shards ``touched`` (two or more).

        With ordered stamps (once every member applies format 7) the participants other
        than the record shard prepare, then the record shard prepares and decides in one
        entry (``PREPARE_DECIDE``) at a revision of its stripe at or above theirs: two
        rounds, no ``RESERVE``. Else every participant prepares, ``RESERVE`` rounds bring
        them to one revision, and the record shard decides (``COMMIT``)."""
        shards = sorted(set(touched))
        record, n = shards[0], self.parts.shards
        others = shards[1:]
        request = req.SerializeToString()
        plan = plan_of(request)  # kept: this member's applies of the Txn find it
        machines = self.parts.machines
        floor = 0
        loop = asyncio.get_running_loop()
        give_up = loop.time() + WAIT_TIMEOUT_S
        for attempt in range(MAX_ATTEMPTS):
            txn_id = random.getrandbits(62) | 1
            rev = max(max(machines[s].revision for s in shards) + 1, floor)
            stamp = self.parts.stamp()
            if stamp:  # ordered: the record shard's stripe, at or above the stamp and floor
                rev = -max(-stamp, floor)
            folded = bool(stamp) and self.parts.decided_commits
            now = self._now()
            deadline = now + TXN_TIMEOUT_MS
            first_round = others if folded else shards
            answers = await asyncio.gather(
                *(self.parts.commit(xcommands.encode_prepare(
                    txn_id, rev, record, s, n, deadline, now, request), s)
                  for s in first_round),
                return_exceptions=True,
            )
            failure = next((a for a in answers if isinstance(a, BaseException)), None)
            prepared = [a for a in answers if isinstance(a, xcommands.Prepared)]
            if failure is not None or len(prepared) != len(first_round) or not all(
                    a.ok for a in prepared):
                await self._abort(txn_id, shards)
                self.stats["retries"] += 1
                if failure is not None:
                    raise failure
                if any(a.reason == "conflict" for a in prepared):
                    await self._wait_out(plan, shards, attempt)
                if loop.time() > give_up:
                    break
                continue
            if folded:
                want = max(a.rev for a in prepared)
                await self._stop_at("after-prepare", plan)
                if self.broken_resolve_first:
                    # The broken variant: the participants' writes land before the decision
                    # (along the branch their own compares point to).
                    guess = xtxn.path_of(plan, xtxn.combine(plan, [a.compares for a in prepared]))
                    await asyncio.gather(*(self.parts.commit(
                        _commit(txn_id, guess, s, n, now, want), s) for s in others))
                checks: dict[int, str] = {}
                for a in prepared:
                    checks.update(a.checks)
                first = await self.parts.commit(xcommands.encode_prepare_decide(
                    txn_id, rev, record, n, deadline, now, request, want,
                    xtxn.fold_partials([a.compares for a in prepared]), checks,
                    max(a.compact_rev for a in prepared)), record)
                if isinstance(first, xcommands.Prepared):  # refused: nothing decided
                    await self._abort(txn_id, shards)
                    if first.error is not None:
                        raise first.error
                    self.stats["retries"] += 1
                    if first.reason == "conflict":
                        await self._wait_out(plan, [record], attempt)
                    if loop.time() > give_up:
                        break
                    continue
                if first.decision is None or first.decision.state != COMMITTED:
                    raise AssertionError(f"txn {txn_id}: a prepare-decide answered no commit")
                path = list(first.decision.path)
                at = rev = first.decision.rev
            else:
                settled = await self.settle_revision(txn_id, shards, prepared, bool(stamp))
                if settled is None:
                    floor = max(a.rev for a in prepared) + 1
                    continue
                rev, at = settled, 0
                await self._stop_at("after-prepare", plan)
                path = xtxn.path_of(plan, xtxn.combine(plan, [a.compares for a in prepared]))
                checks = {}
                for a in prepared:
                    checks.update(a.checks)
                err = xtxn.first_error(plan, path, checks, rev,
                                       max(a.compact_rev for a in prepared))
                if err is not None:
                    await self._abort(txn_id, shards)
                    raise err
                if self.broken_resolve_first:
                    # The broken variant: the participants' writes land before the decision.
                    await asyncio.gather(*(self.parts.commit(
                        _commit(txn_id, path, s, n, now, 0), s) for s in others))
                first = await self.parts.commit(
                    _commit(txn_id, path, record, n, now, 0), record)
                if first.decision is None or first.decision.state != COMMITTED:
                    # A resolver aborted the record first (this member was too slow).
                    await self._abort(txn_id, shards)
                    self.stats["retries"] += 1
                    continue
            await self._stop_at("after-decision", plan)
            rest_of = [] if self.broken_resolve_first else others
            if rest_of and not _needs_others(plan, path, record, n):
                # The answer holds nothing but the revision from the other shards: give
                # it now (the decision is durable) and finish them in the background; a
                # read or write that meets their intents meanwhile waits for the commit.
                self.finish_later(txn_id, path, rest_of, now, at)
                self.stats["committed"] += 1
                if first.error is not None:
                    raise first.error
                parts0 = {record: first.response} if first.response is not None else {}
                await self.parts.settle(rev)
                return xtxn.merge(req, path, parts0, rev, self.limits,
                                  lambda k: sharding.shard_of(k, n))
            rest = await asyncio.gather(*(self.parts.commit(
                _commit(txn_id, path, s, n, now, at), s) for s in rest_of))
            parts: dict[int, rpc_pb2.TxnResponse] = {}
            if first.response is not None:
                parts[record] = first.response
            for s, r in zip(rest_of, rest, strict=True):
                if r.response is not None:
                    parts[s] = r.response
            self.stats["committed"] += 1
            await self.parts.settle(rev)
            for r in (first, *rest):
                if r.error is not None:
                    raise r.error  # committed, but a range of it could not be answered
            return xtxn.merge(req, path, parts, rev, self.limits,
                              lambda k: sharding.shard_of(k, n))
        raise EtcdError(
            grpc.StatusCode.UNAVAILABLE,
            "accord: a cross-shard Txn kept meeting other transactions in progress on its "
            "keys and gave up; retry it",
        )

    async def _wait_out(self, plan: TxnPlan, shards: Sequence[int], attempt: int) -> None:
        """After a conflict: wait until no intent holds the Txn's keys on ``shards``, then
        a short random backoff (nobody waits while holding, so no deadlock)."""
        ranges = [KeyRange.of(k, e) for k, e in plan.ranges]
        await asyncio.gather(*(self.wait_free(s, ranges) for s in shards))
        await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))

    async def _finish(self, txn_id: int, path: list[bool], others: Sequence[int],
                      now: int, at: int = 0) -> None:
        """Commit a decided Txn on the participants other than the record shard (at the
        decided revision ``at``, or 0: at the one each reserved)."""
        try:
            await asyncio.gather(*(self.parts.commit(_commit(
                txn_id, path, s, self.parts.shards, now, at), s) for s in others))
        except EtcdError:
            pass  # the intents stay until a reader or the recovery pass resolves them

    def finish_later(self, txn_id: int, path: list[bool], others: Sequence[int],
                     now: int, at: int = 0) -> None:
        """Commit a decided transaction on ``others`` in a task this coordinator owns
        (:meth:`drain`, :meth:`close`), once its answer needs nothing from them: a reader
        or a writer meeting their intents meanwhile waits for the commit (``at``: the
        revision decided, or 0: at the one each reserved)."""
        task = asyncio.create_task(self._finish(txn_id, path, others, now, at),
                                   name=f"xtxn-finish-{txn_id:x}")
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def drain(self) -> None:
        """Wait for the background commits under way (tests; a settled store)."""
        while self._finishing:
            await asyncio.gather(*list(self._finishing), return_exceptions=True)

    async def close(self) -> None:
        """Cancel and await the background commits (node shutdown)."""
        tasks = list(self._finishing)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def settle_revision(self, txn_id: int, shards: Sequence[int],
                              prepared: list[xcommands.Prepared], ordered: bool) -> int | None:
        """The one revision every participant of a prepared transaction reserved: the
        highest of theirs, the others brought up to it (``_agree``). None when they could
        not agree: the transaction is then aborted (counted as a retry) and is to be
        prepared again above the highest revision met."""
        want = max(a.rev for a in prepared)
        if any(a.rev != want for a in prepared):
            self.stats["reserve_rounds"] += 1
        if any(a.rev != want for a in prepared) and not await self._agree(
                txn_id, shards, prepared, want, ordered):
            await self._abort(txn_id, shards)
            self.stats["retries"] += 1
            return None
        return max(a.rev for a in prepared)

    async def _agree(self, txn_id: int, shards: Sequence[int],
                     prepared: list[xcommands.Prepared], want: int,
                     ordered: bool = False) -> bool:
        """Bring every participant's reserved revision up to the highest (RESERVE rounds,
        a few at most); False if they could not agree (then the Txn is retried)."""
        for _ in range(4):
            lagging = [i for i, a in enumerate(prepared) if a.rev != want]
            if not lagging:
                return True
            answers = await asyncio.gather(*(self.parts.commit(
                xcommands.encode_reserve(txn_id, want), shards[i]) for i in lagging))
            for i, a in zip(lagging, answers, strict=True):
                if a.ok:
                    prepared[i].rev = a.rev
                elif a.reason == "behind":
                    want = max(want, a.rev)
                    if ordered:  # keep to the record shard's stripe (revorder.py)
                        want += (shards[0] - want) % self.parts.shards
                else:
                    return False
            want = max(want, *(a.rev for a in prepared))
        return all(a.rev == want for a in prepared)

    async def _abort(self, txn_id: int, shards: Sequence[int]) -> None:
        """Abort on the record shard first (the decision), then drop the other intents."""
        now = self._now()
        self.stats["aborted"] += 1
        decision = await self.parts.commit(
            xcommands.encode_abort(txn_id, True, now), shards[0])
        if decision.state == COMMITTED:  # cannot happen: only this member commits it
            raise AssertionError(f"txn {txn_id} committed while its coordinator aborts it")
        await asyncio.gather(*(self.parts.commit(
            xcommands.encode_abort(txn_id, False, now), s) for s in shards[1:]))

    # --- meeting an intent ----------------------------------------------------------------
    async def wait_free(
        self, shard: int, ranges: Sequence[KeyRange], *, txn_id: int = 0,
        below: int | None = None, timeout_s: float = WAIT_TIMEOUT_S,
    ) -> int:
        """Return once no open intent on ``shard`` (this member's replica) overlaps
        ``ranges`` (or is ``txn_id``'s), or, with ``below``, none of them reserved a
        revision at or below it; resolve those past their deadline.

        Returns the highest revision at which the intents it waited for committed on
        this shard (0: none waited for, or all aborted). A Txn decided by
        ``PREPARE_DECIDE`` may commit above the revision its intent reserved here, so a read at a revision
        of its own choosing that waited must read again at least there (real-time
        order: the Txn may have been answered before the read began)."""
        sm = self.parts.machines[shard]
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        pause = 0.0005
        waited: set[int] = set()
        while True:
            table = sm.intents
            found = table.in_way(ranges, below=below, txn_id=txn_id) if table else []
            if not found:
                return max((sm.settled_at.get(t, sm.revision) for t in waited), default=0)
            waited.update(i.txn_id for i in found)
            now = self._now()
            stale = [i for i in found if i.deadline_ms < now]
            for intent in stale:
                await self.resolve(shard, intent)
            if not stale:
                if loop.time() > give_up:
                    raise EtcdError(
                        grpc.StatusCode.UNAVAILABLE,
                        "accord: keys of this request stayed held by a cross-shard "
                        "transaction in progress; retry",
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.02)

    async def resolve(self, shard: int, intent: Intent) -> None:
        """Finish ``intent`` (on ``shard``) as its record decides; a PENDING or missing
        record is aborted first, so the decision is final either way."""
        now = self._now()
        decision = await self.parts.commit(
            xcommands.encode_abort(intent.txn_id, True, now), intent.record)
        self.stats["resolved"] += 1
        if shard == intent.record:
            return  # the record's own intent went with the decision
        if decision.state == COMMITTED:
            at = 0 if self.broken_resolve_reserved else decision.rev
            await self.parts.commit(_commit(
                intent.txn_id, list(decision.path), shard, self.parts.shards, now, at), shard)
        else:
            await self.parts.commit(xcommands.encode_abort(intent.txn_id, False, now), shard)

    async def resolve_stale(self) -> int:
        """The recovery pass: resolve every intent past its deadline on the shards this
        member leads; returns how many it resolved."""
        now = self._now()
        done = 0
        for shard, sm in enumerate(self.parts.machines):
            if not sm.intents or not self.parts.leads(shard):
                continue
            for intent in [i for i in sm.intents.intents.values() if i.deadline_ms < now]:
                await self.resolve(shard, intent)
                done += 1
        return done


def _commit(txn_id: int, path: list[bool], shard: int, shards: int, now: int,
            at: int) -> bytes:
    """The commit of a Txn on ``shard``: a ``DECIDE`` at the decided ``at``, or with
    ``at`` 0 a ``COMMIT`` (on the record shard: the decision) at the revision reserved."""
    if at:
        return xcommands.encode_decide(txn_id, path, shard, shards, now, at)
    return xcommands.encode_commit(txn_id, path, shard, shards, now)


def _needs_others(plan: TxnPlan, path: Sequence[bool], record: int, n: int) -> bool:
    """Whether the answer of ``req`` along ``path`` needs a shard other than ``record``:
    a range or a delete (their results), or a put with prev_kv of a key held elsewhere."""
    for _o, op in plan.taken(path):
        which = op.WhichOneof("request")
        if which in ("request_range", "request_delete_range"):
            return True
        if which == "request_put" and op.request_put.prev_kv and sharding.shard_of(
                op.request_put.key, n) != record:
            return True
    return False
