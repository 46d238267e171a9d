"""``client.checkpoints``: the asyncio client of the checkpoint manifest service.

::

    ckpt = client.checkpoints
    await ckpt.begin("llama-7b", 1000, token, layout={"world_size": 8}, expected=[...])
    await ckpt.register_shards("llama-7b", 1000, token, [shard, ...])   # from each host
    await ckpt.commit("llama-7b", 1000, token)
    manifest = await ckpt.manifest("llama-7b")            # the latest committed step
    async for latest in ckpt.watch_latest("llama-7b"): ...

Answers are the service's protobuf messages (``accord.proto.checkpoints_pb2``); refusals
raise :class:`~accord.client.errors.ClientError` with the status code and the server's
message (e.g. FAILED_PRECONDITION naming the missing shards or the current fencing token).
Every mutating call carries one request id across its retries, so a retry after a lost
answer applies once. Training code usually goes through
:mod:`accord.client.checkpoint_writer` instead, which writes, checksums and registers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from accord.client.errors import from_rpc_error
from accord.client.transport import EndpointPool
from accord.proto import checkpoints_pb2 as pb
from accord.proto import checkpoints_pb2_grpc
from accord.services.checkpoints.model import Checksum, Location, Shard
from accord.services.checkpoints.verify import ShardCheck, verify

_grpc: Any = checkpoints_pb2_grpc
T = TypeVar("T")

STATES = {"pending": pb.PENDING, "committed": pb.COMMITTED, "aborted": pb.ABORTED,
          "deleted": pb.DELETED}
TIERS = {"": pb.TIER_UNSPECIFIED, "host_memory": pb.HOST_MEMORY, "local_nvme": pb.LOCAL_NVME,
         "shared_fs": pb.SHARED_FS, "object_store": pb.OBJECT_STORE}


def _rid() -> str:
    return uuid.uuid4().hex


def shard_message(d: dict[str, Any]) -> pb.Shard:
    """A ``Shard`` message from a shard dict (the writer's ``shard_id, rank, uri, tier,
    size, checksum: [algorithm, digest], tensors: [[name, shape, offsets, sizes, dtype]],
    locations: [[uri, tier]]``)."""
    algo, digest = d["checksum"]
    return pb.Shard(
        shard_id=d["shard_id"], rank=d["rank"], uri=d.get("uri", ""),
        tier=TIERS[d.get("tier", "")], size=d["size"],
        checksum=pb.Checksum(algorithm=algo, digest=digest),
        tensors=[pb.TensorSlice(name=n, global_shape=g, offsets=o, sizes=s, dtype=t)
                 for n, g, o, s, t in d.get("tensors", [])],
        locations=[pb.Location(uri=u, tier=TIERS[t]) for u, t in d.get("locations", [])])


def shard_model(s: pb.Shard) -> Shard:
    """A manifest's ``Shard`` message as the verifier's model (every location, primary
    first; a shard registered without locations has its ``uri`` as the only one)."""
    locs = tuple(Location(loc.uri, str(pb.Tier.Name(loc.tier)).lower())
                 for loc in s.locations) or (Location(s.uri, ""),)
    return Shard(s.shard_id, s.rank, s.size, Checksum(s.checksum.algorithm, s.checksum.digest),
                 locs)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :meth:`Checkpoints.verify` found: the manifest, and a verdict per copy read."""

    manifest: pb.Manifest
    checks: tuple[ShardCheck, ...]
    """In shard order; ``status`` ok, missing, unreadable, size or checksum."""

    @property
    def bad(self) -> tuple[ShardCheck, ...]:
        """The copies that are not whole and unchanged."""
        return tuple(c for c in self.checks if not c.ok)

    @property
    def ok(self) -> bool:
        """Whether every copy read matched its registered size and checksum."""
        return not self.bad


class Checkpoints:
    """The checkpoint service through an :class:`EndpointPool` (failover, deadlines)."""

    def __init__(self, pool: EndpointPool) -> None:
        self.pool = pool
        self._stubs: dict[grpc.aio.Channel, Any] = {}
        """One stub per channel (a stub builds a callable for each of the service's
        methods: per call, that cost as much as the call's own Python work)."""

    def _stub(self, ch: grpc.aio.Channel) -> Any:
        stub = self._stubs.get(ch)
        if stub is None:
            if len(self._stubs) >= 64:  # channels the pool closed and opened again
                self._stubs.clear()
            stub = self._stubs[ch] = _grpc.CheckpointsStub(ch)
        return stub

    async def _unary(self, method: str, request: Any, answer: type[T],
                     timeout: float | None = None) -> T:
        async def call(ch: grpc.aio.Channel, t: float) -> T:
            out: T = await getattr(self._stub(ch), method)(request, timeout=timeout or t)
            if not isinstance(out, answer):
                raise TypeError(f"{method} answered {type(out).__name__}, not {answer.__name__}")
            return out
        # reads are idempotent; every mutation carries a request id the service applies once
        return await self.pool.call(call, idempotent=True)

    # ----- the job's protocol --------------------------------------------------------------

    async def begin(self, job: str, step: int, token: int, *, layout: dict[str, int],
                    expected: Sequence[tuple[str, int]], lease_s: float = 0.0,
                    retention: dict[str, Any] | None = None,
                    metadata: dict[str, str] | None = None) -> pb.BeginResponse:
        """Start saving ``step``: ``layout`` (world_size, dp, tp, pp, ep, cp) and the
        expected ``(shard_id, rank)`` set."""
        req = pb.BeginRequest(job=job, step=step, token=token, layout=pb.Layout(**layout),
                              expected=[pb.ExpectedShard(shard_id=s, rank=r) for s, r in expected],
                              lease_s=lease_s, metadata=metadata or {}, request_id=_rid())
        if retention is not None:
            req.retention.CopyFrom(pb.Retention(**retention))
        return await self._unary("Begin", req, pb.BeginResponse)

    async def register_shards(self, job: str, step: int, token: int,
                              shards: Sequence[dict[str, Any] | pb.Shard]
                              ) -> pb.RegisterShardsResponse:
        """Register written shards (one call for a host's shards; idempotent)."""
        msgs = [s if isinstance(s, pb.Shard) else shard_message(s) for s in shards]
        return await self._unary("RegisterShards", pb.RegisterShardsRequest(
            job=job, step=step, token=token, shards=msgs, request_id=_rid()), pb.RegisterShardsResponse)

    async def commit(self, job: str, step: int, token: int) -> pb.CommitResponse:
        """Commit ``step``; refused (naming the missing shards) unless all are registered."""
        return await self._unary("Commit", pb.CommitRequest(job=job, step=step, token=token,
                                                            request_id=_rid()), pb.CommitResponse)

    async def abort(self, job: str, step: int, token: int, reason: str = "") -> pb.AbortResponse:
        """Give up a pending step."""
        return await self._unary("Abort", pb.AbortRequest(job=job, step=step, token=token,
                                                          reason=reason, request_id=_rid()), pb.AbortResponse)

    # ----- reads -----------------------------------------------------------------------------

    async def manifest(self, job: str, step: int | None = None) -> pb.Manifest:
        """A step's manifest (default: the latest committed step)."""
        req = pb.GetManifestRequest(job=job)
        if step is not None:
            req.step = step
        return await self._unary("GetManifest", req, pb.Manifest)

    async def latest(self, job: str) -> int | None:
        """The job's latest committed step, or None."""
        resp = await self.steps(job, states=["committed"])
        return resp.job.latest if resp.job.HasField("latest") else None

    async def verify(self, job: str, step: int | None = None, *, all_locations: bool = False,
                     workers: int = 8,
                     progress: Callable[[ShardCheck, int, int], None] | None = None
                     ) -> VerifyReport:
        """Read a step's shards back from storage (through fsspec, on ``workers`` threads)
        and compare each with its registered size and checksum (default step: the latest
        committed). ``all_locations`` checks every copy, not only the primary;
        ``progress(check, done, total)`` is called after each copy (from a worker
        thread). Nothing is changed, on the cluster or in storage."""
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        m = await self.manifest(job, step)
        shards = [shard_model(s) for s in m.shards]
        total = sum(len(s.locations) if all_locations else 1 for s in shards)
        done = 0

        def one(check: ShardCheck) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(check, done, total)
        checks = await asyncio.to_thread(verify, shards, all_locations=all_locations,
                                         workers=workers, progress=one)
        return VerifyReport(m, tuple(checks))

    async def steps(self, job: str, states: Sequence[str] = ()) -> pb.ListStepsResponse:
        """The job's summary and its steps (optionally only those in ``states``)."""
        return await self._unary("ListSteps", pb.ListStepsRequest(
            job=job, states=[STATES[s] for s in states]), pb.ListStepsResponse)

    async def jobs(self) -> list[pb.JobSummary]:
        """Every job with checkpoint records."""
        return list((await self._unary("ListJobs", pb.ListJobsRequest(), pb.ListJobsResponse)).jobs)

    async def watch_latest(self, job: str, *, timeout: float | None = None
                           ) -> AsyncIterator[int | None]:
        """The job's latest committed step now, then each time it moves.

        One stream to one member, ended after ``timeout`` seconds if given (a restarting
        job waits on it: ``async for step in watch_latest(job): if step is not None``)."""
        ch = self.pool.channel()
        call = self._stub(ch).WatchLatest(pb.WatchLatestRequest(job=job), timeout=timeout)
        try:
            async for msg in call:
                yield msg.latest if msg.HasField("latest") else None
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    # ----- records ---------------------------------------------------------------------------

    async def set_retention(self, job: str, *, keep_last: int = 0, keep_every: int = 0,
                            keep_within_s: float = 0.0) -> None:
        """Set the job's retention policy (all 0: keep everything)."""
        await self._unary("SetRetention", pb.SetRetentionRequest(
            job=job, retention=pb.Retention(keep_last=keep_last, keep_every=keep_every,
                                            keep_within_s=keep_within_s), request_id=_rid()), pb.SetRetentionResponse)

    async def pin(self, job: str, step: int) -> bool:
        """Keep ``step`` whatever the policy; True if it was not pinned before."""
        return bool((await self._unary("Pin", pb.PinRequest(job=job, step=step,
                                                            request_id=_rid()), pb.PinResponse)).changed)

    async def unpin(self, job: str, step: int) -> bool:
        """Unpin ``step``; True if it was pinned."""
        return bool((await self._unary("Unpin", pb.PinRequest(job=job, step=step,
                                                              request_id=_rid()), pb.PinResponse)).changed)

    async def gc(self, jobs: Sequence[str] = (), *, dry_run: bool = False, limit: int = 0,
                 timeout: float | None = None) -> pb.GCResponse:
        """Apply retention and lease expiry (``dry_run``: only report); the URLs to delete."""
        return await self._unary("GC", pb.GCRequest(jobs=list(jobs), dry_run=dry_run,
                                                    limit=limit, request_id=_rid()), pb.GCResponse, timeout)

    async def confirm_deleted(self, uris: Sequence[str]) -> int:
        """Record that reported URLs were deleted."""
        return int((await self._unary("ConfirmDeleted", pb.ConfirmDeletedRequest(
            uris=list(uris), request_id=_rid()), pb.ConfirmDeletedResponse)).confirmed)

    async def move_tier(self, job: str, step: int, shard_id: str, *,
                        add: tuple[str, str] | None = None, drop: Sequence[str] = ()
                        ) -> list[pb.Location]:
        """Record a copy on another tier (``(uri, tier)``, the new primary) and/or copies
        removed."""
        req = pb.MoveTierRequest(job=job, step=step, shard_id=shard_id, drop=list(drop),
                                 request_id=_rid())
        if add is not None:
            req.add.CopyFrom(pb.Location(uri=add[0], tier=TIERS[add[1]]))
        return list((await self._unary("MoveTier", req, pb.MoveTierResponse)).locations)
