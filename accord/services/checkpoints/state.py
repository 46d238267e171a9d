"""The checkpoint state machine: every job's manifests, fencing, leases, retention and garbage.

Pure and deterministic: ``apply(command)`` takes one committed command (a dict, or its
msgpack bytes) and returns its result; time comes only from the command's ``now`` (the
proposer's clock), so every replica computes the same state from the same log. A
refused command returns ``{"ok": False, "kind": ..., "error": ...}`` and changes nothing:
every check runs before the first mutation.

Commands (``op``): ``begin``, ``register`` (its shards as dicts, validated in the apply,
or ``packed`` by the proposing service, see ``model.shard_cmd``), ``commit``, ``abort``
(the job's protocol, fenced by the job incarnation's token), ``expire`` (the service's
lease clock), ``set_retention``, ``pin``, ``unpin``, ``gc``, ``confirm_deleted``,
``move_tier`` (operations on the job's records), and ``batch`` (several commands in one
entry). Every command carries an ``id``; a command applied again with the same id (a
client retry across a leader change) gets its first result and changes nothing.

Commit is O(1) in the number of ranks: a step counts its registered shards, so
``commit`` compares two integers and moves the latest pointer. Only a refused commit
walks the expected set, to name what is missing.

Garbage: ``refs`` counts, over all pending and committed manifests of all jobs, how
many shard locations name each URL. When a step is aborted, expired or deleted by
retention, or a tier move drops a location, each URL whose count drops to 0 enters
``garbage``; GC reports exactly those (so a URL any kept manifest references is never
reported), and ``confirm_deleted`` records that the storage object is gone.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from accord.services.checkpoints import retention
from accord.services.checkpoints.model import (
    ABORTED,
    COMMITTED,
    DEFAULT_LEASE_S,
    DELETED,
    MAX_LEASE_S,
    MAX_MANIFEST_BYTES,
    MAX_SHARDS_PER_CALL,
    PENDING,
    CheckpointError,
    Layout,
    Location,
    Retention,
    Shard,
    Step,
    check_expected,
    check_job,
    check_step,
    check_token,
    check_uri,
)

SNAPSHOT_VERSION = 1
MAX_REMEMBERED_COMMANDS = 20_000
"""Command ids whose results are kept to answer retries (oldest forgotten first)."""
MAX_METADATA = 64


@dataclass(slots=True)
class Job:
    """One training job's checkpoint records."""

    name: str
    fence: int = 0
    """The newest incarnation's fencing token seen; older tokens are refused."""
    steps: dict[int, Step] = field(default_factory=dict)
    latest: int | None = None
    """The latest committed step (the highest committed step number)."""
    pinned: set[int] = field(default_factory=set)
    retention: Retention = field(default_factory=Retention)
    latest_version: int = 0
    """Bumped whenever ``latest`` moves (watchers compare it)."""

    def committed(self) -> list[tuple[int, float]]:
        return [(s.step, s.committed_at) for s in self.steps.values() if s.state == COMMITTED]

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "fence": self.fence, "latest": self.latest,
                "pinned": sorted(self.pinned), "retention": self.retention.to_wire(),
                "latest_version": self.latest_version,
                "steps": [s.packed() for s in self.steps.values()]}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Job:
        steps = [Step.unpacked(bytes(s)) for s in d["steps"]]
        return cls(str(d["name"]), int(d["fence"]), {s.step: s for s in steps},
                   None if d["latest"] is None else int(d["latest"]),
                   {int(x) for x in d["pinned"]}, Retention.from_wire(d["retention"]),
                   int(d["latest_version"]))


@dataclass(slots=True, frozen=True)
class Garbage:
    """A storage object no kept manifest references: safe to delete."""

    uri: str
    job: str
    step: int
    size: int
    since: float

    def to_wire(self) -> list[Any]:
        return [self.uri, self.job, self.step, self.size, self.since]


def _ok(**fields: Any) -> dict[str, Any]:
    return {"ok": True, **fields}


class CheckpointStateMachine:
    """All checkpoint records of a cluster (one replica)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.refs: dict[str, int] = {}
        self.garbage: dict[str, Garbage] = {}
        self.pending: dict[tuple[str, int], None] = {}
        """Every pending step, so lease expiry needs no scan of all steps."""
        self.stats: Counter[str] = Counter()
        """What this replica applied since it started (``commits``, ``aborts``, ``expired``,
        ``gc_runs``, ``gc_deleted_steps``, ``deletions_confirmed``): the node's metrics.
        Not part of the replicated state: a restore or restart leaves it as it is."""
        self.applied: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.clock = 0.0
        self._ops: dict[str, Callable[[dict[str, Any], float], dict[str, Any]]] = {
            "begin": self._begin, "register": self._register, "commit": self._commit,
            "abort": self._abort, "expire": self._expire, "set_retention": self._set_retention,
            "pin": self._pin, "unpin": self._unpin, "gc": self._gc,
            "confirm_deleted": self._confirm_deleted, "move_tier": self._move_tier,
        }

    # ----- the state-machine interface -----------------------------------------------------

    def apply(self, command: dict[str, Any] | bytes) -> dict[str, Any]:
        """Apply one committed command; a refused one changes nothing.

        A ``batch`` (``{"op": "batch", "cmds": [command, ...]}``, no id of its own) applies
        each of its commands in order, as if each were an entry of its own (each with its
        own id, result and refusal), and answers ``{"ok": True, "results": [...]}``."""
        if isinstance(command, (bytes, bytearray)):
            try:
                command = msgpack.unpackb(command, raw=False, strict_map_key=False)
            except Exception as e:
                return CheckpointError(f"command is not valid msgpack: {e}").to_result()
        if not isinstance(command, dict):
            return CheckpointError("command must be a mapping").to_result()
        if command.get("op") == "batch":
            cmds = command.get("cmds")
            if not isinstance(cmds, list) or not cmds:
                return CheckpointError("batch: 'cmds' must be a non-empty list of "
                                       "commands").to_result()
            return _ok(results=[
                CheckpointError("a batch holds commands, not batches").to_result()
                if isinstance(c, dict) and c.get("op") == "batch" else self.apply(c)
                for c in cmds])
        cid = command.get("id")
        if not isinstance(cid, str) or not cid:
            return CheckpointError("command needs a non-empty string 'id'").to_result()
        seen = self.applied.get(cid)
        if seen is not None:
            return {**seen, "duplicate": True}
        op = self._ops.get(str(command.get("op", "")))
        now = command.get("now")
        if op is None:
            result = CheckpointError(f"unknown op {command.get('op')!r}; known: "
                                     f"{', '.join(self._ops)}").to_result()
        elif isinstance(now, bool) or not isinstance(now, (int, float)):
            result = CheckpointError("command needs a number 'now'").to_result()
        else:
            try:
                result = op(command, float(now))
            except CheckpointError as e:
                result = e.to_result()
            else:
                self.clock = max(self.clock, float(now))
        self.applied[cid] = result
        while len(self.applied) > MAX_REMEMBERED_COMMANDS:
            self.applied.popitem(last=False)
        return result

    # ----- helpers -------------------------------------------------------------------------

    def _job(self, name: Any) -> Job:
        job = self.jobs.get(check_job(name))
        if job is None:
            raise CheckpointError(f"job {name!r} is unknown: it has no checkpoints (begin a "
                                  "step first)", "not_found")
        return job

    def _step(self, job: Job, step: Any) -> Step:
        s = job.steps.get(check_step(step))
        if s is None:
            raise CheckpointError(f"job {job.name!r} has no step {step}", "not_found")
        return s

    @staticmethod
    def _fence(job: Job | None, token: Any, name: str) -> int:
        """Refuse a token older than the job's current incarnation; returns the token."""
        t = check_token(token)
        if job is not None and t < job.fence:
            raise CheckpointError(
                f"fencing token {t} is stale: job {name!r} now belongs to the incarnation "
                f"with token {job.fence}; nothing was changed", "stale", current=job.fence)
        return t

    def _new_incarnation(self, job: Job, token: int, now: float) -> list[int]:
        """Adopt ``token`` as the job's incarnation: abort the older one's pending steps."""
        aborted = []
        if token > job.fence:
            for s in list(job.steps.values()):
                if s.state == PENDING and s.token < token:
                    self._end(job, s, ABORTED, f"superseded by the incarnation with token {token}",
                              now)
                    aborted.append(s.step)
            job.fence = token
        return aborted

    def _hold(self, uri: str) -> None:
        self.refs[uri] = self.refs.get(uri, 0) + 1
        self.garbage.pop(uri, None)

    def _release(self, uri: str, job: str, step: int, size: int, now: float) -> None:
        n = self.refs.get(uri, 0) - 1
        if n > 0:
            self.refs[uri] = n
            return
        self.refs.pop(uri, None)
        self.garbage[uri] = Garbage(uri, job, step, size, now)

    def _end(self, job: Job, s: Step, state: str, reason: str, now: float) -> None:
        """Move a pending or committed step to aborted/deleted and release its URLs."""
        if s.state == COMMITTED and job.latest == s.step:  # pragma: no cover - an invariant
            raise AssertionError("the latest committed step is never aborted or deleted")
        s.state, s.reason, s.ended_at = state, reason, now
        s.cache = None
        self.pending.pop((job.name, s.step), None)
        for sh in s.shards.values():
            for uri in sh.uris():
                self._release(uri, job.name, s.step, sh.size, now)
        job.pinned.discard(s.step)

    # ----- the job's protocol ----------------------------------------------------------------

    def _begin(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        name = check_job(c.get("job"))
        job = self.jobs.get(name)
        token = self._fence(job, c.get("token"), name)
        step_no = check_step(c.get("step"))
        layout = Layout.from_wire(c.get("layout"))
        expected = check_expected(c.get("expected"), layout)
        lease_s = c.get("lease_s") or DEFAULT_LEASE_S
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not (
                0 < lease_s <= MAX_LEASE_S):
            raise CheckpointError(f"lease_s {lease_s!r} must be a number of seconds in "
                                  f"(0, {MAX_LEASE_S:.0f}]")
        policy = Retention.from_wire(c["retention"]) if c.get("retention") else None
        meta = c.get("metadata") or {}
        if not isinstance(meta, dict) or len(meta) > MAX_METADATA or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) + len(v) <= 4096
                for k, v in meta.items()):
            raise CheckpointError(f"metadata must map at most {MAX_METADATA} strings to strings "
                                  "(4 KiB each)")
        existing = job.steps.get(step_no) if job is not None else None
        if existing is not None:
            superseded = existing.state == PENDING and existing.token < token
            if existing.state in (COMMITTED, DELETED) or (existing.state == PENDING
                                                          and not superseded):
                raise CheckpointError(f"job {name!r} step {step_no} already exists "
                                      f"({existing.state}); a step is begun once", "exists")
        if job is None:
            job = self.jobs[name] = Job(name)
        aborted = self._new_incarnation(job, token, now)
        if existing is not None:  # aborted before (or just now, superseded): a fresh attempt
            del job.steps[step_no]
        job.steps[step_no] = Step(step_no, PENDING, token, layout, expected, now,
                                  now + float(lease_s), float(lease_s), metadata=dict(meta))
        self.pending[(name, step_no)] = None
        if policy is not None:
            job.retention = policy
        return _ok(superseded=aborted, deadline=now + float(lease_s))

    def _fenced_step(self, c: dict[str, Any]) -> tuple[Job, Step, int]:
        """The job, its pending step and the token, for register/commit (fenced, leased)."""
        job = self._job(c.get("job"))
        token = self._fence(job, c.get("token"), job.name)
        s = self._step(job, c.get("step"))
        if s.state != PENDING:
            kind = "exists" if s.state == COMMITTED else "precondition"
            raise CheckpointError(f"job {job.name!r} step {s.step} is {s.state}"
                                  + (f" ({s.reason})" if s.reason else "")
                                  + ("; it was committed once and cannot change"
                                     if s.state == COMMITTED else ""), kind)
        if s.token != token:
            raise CheckpointError(f"job {job.name!r} step {s.step} was begun by the incarnation "
                                  f"with token {s.token}, not {token}: begin it again with your "
                                  "token", "precondition", current=job.fence)
        return job, s, token

    def _check_lease(self, job: Job, s: Step, now: float) -> None:
        if now > s.deadline:
            raise CheckpointError(f"job {job.name!r} step {s.step}: its lease ran out at "
                                  f"{s.deadline:.3f} (now {now:.3f}); the service aborts it, "
                                  "begin the step again", "precondition")

    def _register(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        packed = c.get("packed")
        raw = c.get("shards") if packed is None else packed
        if not isinstance(raw, (list, tuple)) or not raw:
            raise CheckpointError("register: give at least one shard")
        if len(raw) > MAX_SHARDS_PER_CALL:
            raise CheckpointError(f"register: {len(raw)} shards in one call; at most "
                                  f"{MAX_SHARDS_PER_CALL}", "too_large")
        # ``shards`` (dicts) are validated here, malformed input named first; ``packed``
        # shards were validated by the proposing service (``model.shard_cmd``).
        shards = ([Shard.from_wire(w) for w in raw] if packed is None
                  else [Shard.from_cmd(w) for w in raw])
        job, s, _ = self._fenced_step(c)
        self._check_lease(job, s, now)
        fresh: dict[str, Shard] = {}
        duplicates = 0
        added = 0
        expected, registered = s.expected, s.shards
        for sh in shards:
            rank = expected.get(sh.shard_id)
            if rank is None:
                raise CheckpointError(f"shard {sh.shard_id!r} is not in the expected shard set "
                                      f"of job {job.name!r} step {s.step}")
            if rank != sh.rank:
                raise CheckpointError(f"shard {sh.shard_id!r} is expected from rank {rank}, "
                                      f"not rank {sh.rank}")
            old = registered.get(sh.shard_id) or fresh.get(sh.shard_id)
            if old is not None:
                if old.checksum != sh.checksum:
                    raise CheckpointError(
                        f"shard {sh.shard_id!r} is already registered with checksum "
                        f"{old.checksum.algorithm}:{old.checksum.digest}, not "
                        f"{sh.checksum.algorithm}:{sh.checksum.digest}; nothing was changed",
                        "exists")
                duplicates += 1
                continue
            fresh[sh.shard_id] = sh
            added += sh.wire_bytes()
        if s.size_estimate + added > MAX_MANIFEST_BYTES:
            raise CheckpointError(f"job {job.name!r} step {s.step}: the manifest would grow to "
                                  f"about {s.size_estimate + added} bytes; at most "
                                  f"{MAX_MANIFEST_BYTES}", "too_large")
        s.shards.update(fresh)
        refs, garbage = self.refs, self.garbage
        for sh in fresh.values():
            for loc in sh.locations:  # self._hold, inlined: this runs for every shard
                refs[loc.uri] = refs.get(loc.uri, 0) + 1
                if garbage:
                    garbage.pop(loc.uri, None)
        s.cache = None
        s.size_estimate += added
        s.deadline = max(s.deadline, now + s.lease_s)
        return _ok(registered=len(fresh), duplicates=duplicates,
                   remaining=len(s.expected) - len(s.shards))

    def _commit(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        job, s, _ = self._fenced_step(c)
        self._check_lease(job, s, now)
        if len(s.shards) != len(s.expected):  # O(1); naming the missing ones is O(ranks)
            missing = s.missing
            shown = ", ".join(f"{m} (rank {s.expected[m]})" for m in missing[:20])
            more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
            raise CheckpointError(f"job {job.name!r} step {s.step} cannot commit: "
                                  f"{len(missing)} of {len(s.expected)} expected shards are not "
                                  f"registered: {shown}{more}", "precondition", missing=missing)
        s.state, s.committed_at = COMMITTED, now
        s.cache = None
        self.pending.pop((job.name, s.step), None)
        moved = job.latest is None or s.step > job.latest
        if moved:
            job.latest = s.step
            job.latest_version += 1
        self.stats["commits"] += 1
        return _ok(latest=job.latest, latest_changed=moved)

    def _abort(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._job(c.get("job"))
        token = self._fence(job, c.get("token"), job.name)
        s = self._step(job, c.get("step"))
        if s.state == COMMITTED or s.state == DELETED:
            raise CheckpointError(f"job {job.name!r} step {s.step} is {s.state}: a committed "
                                  "manifest never changes (retention deletes it)", "precondition")
        if s.state == ABORTED:
            return _ok(already=True, superseded=[])
        aborted = self._new_incarnation(job, token, now)
        if s.state == PENDING:
            reason = c.get("reason") if isinstance(c.get("reason"), str) else ""
            self._end(job, s, ABORTED, str(reason)[:256] or "aborted by the job", now)
            self.stats["aborts"] += 1
        return _ok(already=False, superseded=aborted)

    def _expire(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        out = self._expire_until(now)
        return _ok(expired=[[j, s] for j, s in out])

    def _expire_until(self, now: float, jobs: set[str] | None = None) -> list[tuple[str, int]]:
        out = []
        for name, step in list(self.pending):
            if jobs is not None and name not in jobs:
                continue
            job = self.jobs[name]
            s = job.steps[step]
            if s.deadline < now:
                self._end(job, s, ABORTED, f"lease expired at {s.deadline:.3f}", now)
                out.append((name, step))
        self.stats["expired"] += len(out)
        return out

    # ----- records ------------------------------------------------------------------------------

    def _set_retention(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._job(c.get("job"))
        job.retention = Retention.from_wire(c.get("retention") or {})
        return _ok(retention=job.retention.to_wire())

    def _pin(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._job(c.get("job"))
        s = self._step(job, c.get("step"))
        if s.state != COMMITTED:
            raise CheckpointError(f"job {job.name!r} step {s.step} is {s.state}: only committed "
                                  "steps can be pinned", "precondition")
        already = s.step in job.pinned
        job.pinned.add(s.step)
        return _ok(already=already)

    def _unpin(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._job(c.get("job"))
        s = self._step(job, c.get("step"))
        was = s.step in job.pinned
        job.pinned.discard(s.step)
        return _ok(was_pinned=was)

    def _gc(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        names = c.get("jobs") or []
        if not isinstance(names, (list, tuple)):
            raise CheckpointError("gc: 'jobs' must be a list of job names (empty: every job)")
        jobs = [self._job(n) for n in names] if names else list(self.jobs.values())
        expired = self._expire_until(now, {j.name for j in jobs})
        deleted: list[list[Any]] = []
        for job in jobs:
            for step in retention.victims(job.committed(), job.retention, job.pinned,
                                          job.latest, now):
                self._end(job, job.steps[step], DELETED, "deleted by retention", now)
                deleted.append([job.name, step])
        self.stats["gc_runs"] += 1
        self.stats["gc_deleted_steps"] += len(deleted)
        return _ok(deleted=deleted, expired=[[j, s] for j, s in expired])

    def _confirm_deleted(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        uris = c.get("uris")
        if not isinstance(uris, (list, tuple)) or not uris:
            raise CheckpointError("confirm_deleted: give the URLs that were deleted")
        for u in uris:
            check_uri(u)
            if u not in self.garbage:
                if u in self.refs:
                    raise CheckpointError(f"{u} is referenced by a kept manifest: it was never "
                                          "reported as safe to delete; nothing was changed",
                                          "precondition")
                raise CheckpointError(f"{u} is not awaiting deletion (unknown, or already "
                                      "confirmed); nothing was changed", "not_found")
        for u in uris:
            del self.garbage[u]
        self.stats["deletions_confirmed"] += len(uris)
        return _ok(confirmed=len(uris))

    def _move_tier(self, c: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._job(c.get("job"))
        s = self._step(job, c.get("step"))
        if s.state not in (PENDING, COMMITTED):
            raise CheckpointError(f"job {job.name!r} step {s.step} is {s.state}: no tier moves",
                                  "precondition")
        sid = c.get("shard_id")
        sh = s.shards.get(sid) if isinstance(sid, str) else None
        if sh is None:
            raise CheckpointError(f"job {job.name!r} step {s.step} has no registered shard "
                                  f"{sid!r}", "not_found")
        add = Location.from_wire(c["add"], f"shard {sid!r}") if c.get("add") else None
        drop = c.get("drop") or []
        if not isinstance(drop, (list, tuple)) or not all(isinstance(u, str) for u in drop):
            raise CheckpointError("move_tier: 'drop' must be a list of URLs")
        current = sh.uris()
        for u in drop:
            if u not in current:
                raise CheckpointError(f"shard {sid!r} has no location {u!r}")
        if add is not None and add.uri in drop:
            raise CheckpointError(f"move_tier: {add.uri} is both added and dropped")
        if add is None and not drop:
            raise CheckpointError("move_tier: give a location to add or URLs to drop")
        locs = [loc for loc in sh.locations if loc.uri not in drop]
        if add is not None:
            locs = [loc for loc in locs if loc.uri != add.uri]
            locs.insert(0, add)  # the newest copy is the primary
        if not locs:
            raise CheckpointError(f"shard {sid!r}: dropping {', '.join(drop)} would leave it "
                                  "without a location")
        if add is not None and add.uri not in current:
            self._hold(add.uri)
        s.shards[sh.shard_id] = replace(sh, locations=tuple(locs))
        s.cache = None
        for u in drop:
            self._release(u, job.name, s.step, sh.size, now)
        return _ok(locations=[loc.to_wire() for loc in locs])

    # ----- reads -------------------------------------------------------------------------------------

    def manifest(self, job_name: str, step: int | None = None) -> tuple[Job, Step]:
        """A job and its step (``None``: the latest committed); raises if there is none."""
        job = self._job(job_name)
        if step is None:
            if job.latest is None:
                raise CheckpointError(f"job {job.name!r} has no committed step yet", "not_found")
            step = job.latest
        return job, self._step(job, step)

    def garbage_of(self, jobs: list[str] | None = None) -> list[Garbage]:
        """URLs safe to delete (no kept manifest references them), oldest first."""
        want = set(jobs) if jobs else None
        return [g for g in self.garbage.values() if want is None or g.job in want]

    def expired_pending(self, now: float) -> bool:
        """Is some pending step past its lease (for the leader's expiry loop)?"""
        return any(self.jobs[j].steps[s].deadline < now for j, s in self.pending)

    # ----- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state, msgpack-encoded, versioned."""
        data: bytes = msgpack.packb({
            "version": SNAPSHOT_VERSION, "clock": self.clock,
            "jobs": [j.to_wire() for j in self.jobs.values()],
            "garbage": [g.to_wire() for g in self.garbage.values()],
            "applied": list(self.applied.items()),
        }, use_bin_type=True)
        return data

    def restore(self, data: bytes) -> None:
        """Replace the state by a snapshot's."""
        try:
            doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as e:
            raise CheckpointError(f"snapshot is not valid msgpack: {e}") from e
        if not isinstance(doc, dict) or doc.get("version") != SNAPSHOT_VERSION:
            raise CheckpointError(f"checkpoint snapshot version {doc.get('version')!r} is not "
                                  f"{SNAPSHOT_VERSION}")
        fresh = CheckpointStateMachine()
        fresh.clock = float(doc["clock"])
        for jw in doc["jobs"]:
            job = Job.from_wire(jw)
            fresh.jobs[job.name] = job
            for s in job.steps.values():
                if s.state == PENDING:
                    fresh.pending[(job.name, s.step)] = None
                if s.state in (PENDING, COMMITTED):
                    for sh in s.shards.values():
                        for uri in sh.uris():
                            fresh.refs[uri] = fresh.refs.get(uri, 0) + 1
        for uri, job_name, step, size, since in doc["garbage"]:
            fresh.garbage[uri] = Garbage(uri, job_name, int(step), int(size), float(since))
        for cid, result in doc["applied"]:
            fresh.applied[cid] = result
        self.jobs, self.refs, self.garbage = fresh.jobs, fresh.refs, fresh.garbage
        self.pending, self.applied, self.clock = fresh.pending, fresh.applied, fresh.clock
