"""The checkpoint service's API over a replica and a way to commit commands.

``CheckpointService`` validates each request (raising :class:`CheckpointError` before
anything is proposed, so bad input costs no Raft round), turns it into a command with an
id and hands it to ``propose``, an async callable that commits it through the checkpoint
group and returns the state machine's result. A refused result is raised as the same
error. Reads are served from the local replica; the caller puts a ReadIndex barrier first.

Fencing, twice: the state machine refuses a token older than the newest it has seen for
the job (so once a new incarnation has spoken, the old one is refused for good), and,
when the service is given ``holder`` (on a node: a linearizable read of the job's
coordinator lock), ``begin``, ``commit`` and ``abort`` are refused unless their token is
the one the lock's holder has now, so a zombie whose lock passed to a new incarnation is
refused even before that incarnation's first call.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from accord.services.checkpoints import retention
from accord.services.checkpoints.model import (
    COMMITTED,
    MAX_SHARDS_PER_CALL,
    PENDING,
    STATES,
    CheckpointError,
    Layout,
    Location,
    Retention,
    Step,
    check_expected,
    check_job,
    check_step,
    check_token,
    check_uri,
    wire_shard_cmd,
)
from accord.services.checkpoints.state import CheckpointStateMachine, Garbage, Job

Propose = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
Holder = Callable[[str], Awaitable[int | None]]
"""``job -> the fencing token of its coordinator lock's holder now`` (None: not held)."""

LOCK_PREFIX = "/ckpt/"


def lock_name(job: str) -> str:
    """The fenced lock a job's coordinator holds; its token fences the job's calls."""
    return f"{LOCK_PREFIX}{check_job(job)}/coordinator"


@dataclass(slots=True, frozen=True)
class GCReport:
    """What a GC pass deleted, expired and reports as safe to delete."""

    deleted: list[tuple[str, int]]
    expired: list[tuple[str, int]]
    deletable: list[Garbage]
    deletable_total: int


class CheckpointService:
    """Checkpoint manifests: the job protocol, records, retention and reads."""

    def __init__(self, state: CheckpointStateMachine, propose: Propose, *,
                 holder: Holder | None = None, clock: Callable[[], float] = time.time,
                 origin: str | None = None) -> None:
        self.state = state
        self.propose = propose
        self.holder = holder
        self.clock = clock
        self._origin = origin or uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)

    async def _commit(self, op: str, request_id: str, **fields: Any) -> dict[str, Any]:
        cid = request_id or f"{self._origin}-{next(self._seq)}"
        result = await self.propose({"id": cid, "op": op, "now": self.clock(), **fields})
        if not result.get("ok", False):
            raise CheckpointError(str(result.get("error", "command refused")),
                                  str(result.get("kind", "invalid")),
                                  current=int(result.get("current", 0)),
                                  missing=list(result.get("missing", [])))
        return result

    async def _check_holder(self, job: str, token: int) -> None:
        if self.holder is None:
            return
        current = await self.holder(job)
        lock = lock_name(job)
        if current is None:
            raise CheckpointError(
                f"fencing token {token} is stale: nobody holds lock {lock!r} of job {job!r} "
                "(the incarnation lost it); nothing was changed", "stale",
                current=self.state.jobs[job].fence if job in self.state.jobs else 0)
        if token < current:
            raise CheckpointError(
                f"fencing token {token} is stale: lock {lock!r} of job {job!r} is held by the "
                f"incarnation with token {current}; nothing was changed", "stale", current=current)
        if token > current:
            raise CheckpointError(
                f"fencing token {token} is not a token of lock {lock!r} of job {job!r} (held "
                f"with token {current}); use the token of the lock you hold", "stale",
                current=current)

    # ----- the job's protocol --------------------------------------------------------------

    async def begin(self, job: str, step: int, token: int, layout: dict[str, Any],
                    expected: list[list[Any]], *, lease_s: float = 0.0,
                    retention_policy: dict[str, Any] | None = None,
                    metadata: dict[str, str] | None = None,
                    request_id: str = "") -> dict[str, Any]:
        """Start saving ``step``: its layout and the shard set that makes it complete."""
        check_job(job)
        check_step(step)
        check_token(token)
        check_expected(expected, Layout.from_wire(layout))
        if retention_policy is not None:
            Retention.from_wire(retention_policy)
        await self._check_holder(job, token)
        return await self._commit("begin", request_id, job=job, step=step, token=token,
                                  layout=layout, expected=expected, lease_s=lease_s,
                                  retention=retention_policy, metadata=metadata or {})

    async def register(self, job: str, step: int, token: int, shards: Sequence[Any],
                       request_id: str = "", *,
                       parse: Callable[[Any], list[Any]] = wire_shard_cmd) -> dict[str, Any]:
        """Record written shards (idempotent; a batch is all or nothing).

        ``parse`` validates one shard as given and returns its packed form (default: a
        shard dict; the servicer passes its reader of protobuf shards)."""
        check_job(job)
        check_step(step)
        check_token(token)
        if not shards:
            raise CheckpointError("register: give at least one shard")
        if len(shards) > MAX_SHARDS_PER_CALL:
            raise CheckpointError(f"register: {len(shards)} shards in one call; at most "
                                  f"{MAX_SHARDS_PER_CALL}", "too_large")
        # Validated once, here (bad input costs no Raft round); the command carries the
        # shards in the compact form every replica applies without checking them again.
        packed = [parse(w) for w in shards]
        return await self._commit("register", request_id, job=job, step=step, token=token,
                                  packed=packed)

    async def commit(self, job: str, step: int, token: int, request_id: str = ""
                     ) -> dict[str, Any]:
        """Commit ``step`` (every expected shard registered): the job's latest moves."""
        check_job(job)
        check_step(step)
        check_token(token)
        await self._check_holder(job, token)
        return await self._commit("commit", request_id, job=job, step=step, token=token)

    async def abort(self, job: str, step: int, token: int, reason: str = "",
                    request_id: str = "") -> dict[str, Any]:
        """Give up a pending step; its shards become garbage."""
        check_job(job)
        check_step(step)
        check_token(token)
        await self._check_holder(job, token)
        return await self._commit("abort", request_id, job=job, step=step, token=token,
                                  reason=reason)

    async def expire(self) -> list[list[Any]]:
        """Abort every pending step whose lease ran out (the group leader's duty)."""
        expired: list[list[Any]] = (await self._commit("expire", ""))["expired"]
        return expired

    # ----- records ---------------------------------------------------------------------------

    async def set_retention(self, job: str, policy: dict[str, Any], request_id: str = ""
                            ) -> dict[str, Any]:
        """Replace the job's retention policy (applied by the next GC pass)."""
        check_job(job)
        Retention.from_wire(policy)
        return await self._commit("set_retention", request_id, job=job, retention=policy)

    async def pin(self, job: str, step: int, request_id: str = "") -> bool:
        """Keep a committed step whatever the policy; True if it was not pinned yet."""
        check_job(job)
        check_step(step)
        return not (await self._commit("pin", request_id, job=job, step=step))["already"]

    async def unpin(self, job: str, step: int, request_id: str = "") -> bool:
        """Let retention decide about ``step`` again; True if it was pinned."""
        check_job(job)
        check_step(step)
        return bool((await self._commit("unpin", request_id, job=job, step=step))["was_pinned"])

    async def gc(self, jobs: list[str], *, dry_run: bool = False, limit: int = 10_000,
                 request_id: str = "") -> GCReport:
        """Apply retention and lease expiry; report the URLs now safe to delete."""
        for j in jobs:
            check_job(j)
        if dry_run:
            return self.plan_gc(jobs, limit)
        out = await self._commit("gc", request_id, jobs=jobs)
        garbage = self.state.garbage_of(jobs or None)
        return GCReport([(j, s) for j, s in out["deleted"]], [(j, s) for j, s in out["expired"]],
                        garbage[:limit], len(garbage))

    def plan_gc(self, jobs: list[str], limit: int = 10_000) -> GCReport:
        """What a GC pass would do now (changes nothing)."""
        sm, now = self.state, self.clock()
        chosen = [self._job(j) for j in jobs] if jobs else list(sm.jobs.values())
        ending: list[tuple[Job, Step]] = []
        expired, deleted = [], []
        for job in chosen:
            for s in job.steps.values():
                if s.state == PENDING and s.deadline < now:
                    ending.append((job, s))
                    expired.append((job.name, s.step))
            for step in retention.victims(job.committed(), job.retention, job.pinned,
                                          job.latest, now):
                ending.append((job, job.steps[step]))
                deleted.append((job.name, step))
        drops: dict[str, int] = {}
        freed: list[Garbage] = []
        for job, s in ending:
            for sh in s.shards.values():
                for u in sh.uris():
                    drops[u] = drops.get(u, 0) + 1
                    if drops[u] == sm.refs.get(u, 0):
                        freed.append(Garbage(u, job.name, s.step, sh.size, now))
        garbage = sm.garbage_of(jobs or None) + freed
        return GCReport(deleted, expired, garbage[:limit], len(garbage))

    async def confirm_deleted(self, uris: list[str], request_id: str = "") -> int:
        """Record that these reported URLs were deleted from storage."""
        if not uris:
            raise CheckpointError("confirm_deleted: give the URLs that were deleted")
        for u in uris:
            check_uri(u)
        return int((await self._commit("confirm_deleted", request_id, uris=uris))["confirmed"])

    async def move_tier(self, job: str, step: int, shard_id: str, *,
                        add: tuple[str, str] | None = None, drop: list[str] | None = None,
                        request_id: str = "") -> list[Location]:
        """Record a copy of a shard on another tier and/or copies removed."""
        check_job(job)
        check_step(step)
        if add is not None:
            Location.from_wire(list(add), f"shard {shard_id!r}")
        out = await self._commit("move_tier", request_id, job=job, step=step, shard_id=shard_id,
                                 add=list(add) if add else None, drop=drop or [])
        return [Location(u, t) for u, t in out["locations"]]

    # ----- reads (local replica) ----------------------------------------------------------------

    def _job(self, job: str) -> Job:
        check_job(job)
        j = self.state.jobs.get(job)
        if j is None:
            raise CheckpointError(f"job {job!r} is unknown: it has no checkpoints", "not_found")
        return j

    def manifest(self, job: str, step: int | None = None) -> tuple[Job, Step]:
        """A step's manifest (``None``: the latest committed one)."""
        if step is not None:
            check_step(step)
        return self.state.manifest(check_job(job), step)

    def steps(self, job: str, states: list[str] | None = None) -> tuple[Job, list[Step]]:
        """A job's steps in step order, optionally only those in ``states``."""
        j = self._job(job)
        for s in states or []:
            if s not in STATES:
                raise CheckpointError(f"state {s!r} is unknown; use one of {', '.join(STATES)}")
        want = set(states or STATES)
        return j, [s for _, s in sorted(j.steps.items()) if s.state in want]

    def jobs(self) -> list[Job]:
        """Every job with checkpoint records, by name."""
        return [self.state.jobs[k] for k in sorted(self.state.jobs)]

    @staticmethod
    def counts(job: Job) -> tuple[int, int]:
        """(committed, pending) steps of ``job``."""
        c = sum(1 for s in job.steps.values() if s.state == COMMITTED)
        p = sum(1 for s in job.steps.values() if s.state == PENDING)
        return c, p
