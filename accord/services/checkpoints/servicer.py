"""The ``accord.checkpoints.v1.Checkpoints`` gRPC service over a :class:`CheckpointGroup`.

Mutating calls become commands committed through the checkpoint group (any member may
receive them: the host forwards proposals to the group's leader). Reads are served from
the local replica after a ReadIndex barrier, so they see every committed change.

Status codes: malformed input (a negative step, a malformed URL, a shard outside the
expected set, a checksum in the wrong shape) is INVALID_ARGUMENT; an unknown job or step
NOT_FOUND; a step begun twice, a commit of a committed step or a shard registered again
with another checksum ALREADY_EXISTS; a stale fencing token (naming the current one), a
commit with missing shards (naming them), an expired lease FAILED_PRECONDITION; an
oversized manifest RESOURCE_EXHAUSTED; a group without a leader UNAVAILABLE (retry with
the same ``request_id``). A refused call changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, NoReturn, TypeVar

import grpc

from accord.proto import checkpoints_pb2 as pb
from accord.proto import checkpoints_pb2_grpc
from accord.services.checkpoints.model import (
    TIERS,
    CheckpointError,
    Retention,
    Shard,
    Step,
    check_job,
    shard_cmd,
)
from accord.services.checkpoints.replicated import CheckpointGroup, GroupUnavailable
from accord.services.checkpoints.service import GCReport
from accord.services.checkpoints.state import Garbage, Job

T = TypeVar("T")
_grpc_mod: Any = checkpoints_pb2_grpc

CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "exists": grpc.StatusCode.ALREADY_EXISTS,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "stale": grpc.StatusCode.FAILED_PRECONDITION,
    "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_STATE = {"pending": pb.PENDING, "committed": pb.COMMITTED, "aborted": pb.ABORTED,
          "deleted": pb.DELETED}
_STATE_NAME = {v: k for k, v in _STATE.items()}


async def _call(context: grpc.aio.ServicerContext, call: Awaitable[T]) -> T:
    try:
        return await call
    except CheckpointError as e:
        await _abort(context, CODES.get(e.kind, grpc.StatusCode.INVALID_ARGUMENT), str(e))
    except GroupUnavailable as e:
        await _abort(context, grpc.StatusCode.UNAVAILABLE, str(e))


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("abort returned")  # pragma: no cover - abort always raises


# ----- protobuf <-> wire dicts -----------------------------------------------------------------


def tier_name(t: int) -> str:
    """A ``Tier`` enum value as the model's tier name ('' for unspecified)."""
    if t == pb.TIER_UNSPECIFIED:
        return ""
    if t not in (pb.HOST_MEMORY, pb.LOCAL_NVME, pb.SHARED_FS, pb.OBJECT_STORE):
        raise CheckpointError(f"tier {t} is unknown; use one of {', '.join(TIERS)}")
    return str(pb.Tier.Name(t)).lower()


def tier_value(name: str) -> str:
    """A model tier name as the ``Tier`` enum's name (protobuf takes enum names)."""
    return name.upper()


def shard_cmd_from_pb(s: pb.Shard) -> list[Any]:
    """A ``Shard`` message validated, in the compact form a register command carries (the
    checks of ``Shard.from_wire``, with no dict or object built: this runs once for each
    shard of every registration)."""
    locations = [[loc.uri, tier_name(loc.tier)] for loc in s.locations]
    if s.uri:
        locations.insert(0, [s.uri, tier_name(s.tier)])
    sum_ = s.checksum
    return shard_cmd(
        s.shard_id, s.rank, s.size, [sum_.algorithm, sum_.digest], locations,
        [[t.name, list(t.global_shape), list(t.offsets), list(t.sizes), t.dtype]
         for t in s.tensors])


def shard_to_pb(s: Shard) -> pb.Shard:
    """A registered shard as its message (every location, the primary first)."""
    return pb.Shard(
        shard_id=s.shard_id, rank=s.rank, uri=s.uri, tier=tier_value(s.locations[0].tier),
        size=s.size, checksum=pb.Checksum(algorithm=s.checksum.algorithm,
                                          digest=s.checksum.digest),
        tensors=[pb.TensorSlice(name=t.name, global_shape=t.global_shape, offsets=t.offsets,
                                sizes=t.sizes, dtype=t.dtype) for t in s.tensors],
        locations=[pb.Location(uri=loc.uri, tier=tier_value(loc.tier)) for loc in s.locations])


def layout_to_wire(lay: pb.Layout) -> dict[str, Any]:
    return {"world_size": lay.world_size, "dp": lay.dp or 1, "tp": lay.tp or 1,
            "pp": lay.pp or 1, "ep": lay.ep or 1, "cp": lay.cp or 1}


def retention_to_pb(r: Retention) -> pb.Retention:
    return pb.Retention(keep_last=r.keep_last, keep_every=r.keep_every,
                        keep_within_s=r.keep_within_s)


def manifest_to_pb(job: Job, s: Step) -> pb.Manifest:
    """A step's full manifest."""
    lay = s.layout
    return pb.Manifest(
        job=job.name, step=s.step, state=_STATE[s.state], token=s.token,
        layout=pb.Layout(world_size=lay.world_size, dp=lay.dp, tp=lay.tp, pp=lay.pp, ep=lay.ep,
                         cp=lay.cp),
        expected=[pb.ExpectedShard(shard_id=k, rank=v) for k, v in s.expected.items()],
        shards=[shard_to_pb(sh) for sh in sorted(s.shards.values(),
                                                 key=lambda x: (x.rank, x.shard_id))],
        begun_at=s.begun_at, deadline=s.deadline, committed_at=s.committed_at,
        ended_at=s.ended_at, reason=s.reason, pinned=s.step in job.pinned,
        latest=s.step == job.latest, metadata=s.metadata, total_bytes=s.total_bytes)


def summary_to_pb(job: Job, s: Step) -> pb.StepSummary:
    return pb.StepSummary(step=s.step, state=_STATE[s.state], shards=len(s.shards),
                          expected=len(s.expected), total_bytes=s.total_bytes,
                          committed_at=s.committed_at, pinned=s.step in job.pinned,
                          latest=s.step == job.latest, reason=s.reason, token=s.token,
                          deadline=s.deadline)


def job_to_pb(job: Job, committed: int, pending: int) -> pb.JobSummary:
    out = pb.JobSummary(job=job.name, committed=committed, pending=pending, token=job.fence,
                        retention=retention_to_pb(job.retention), pinned=sorted(job.pinned))
    if job.latest is not None:
        out.latest = job.latest
    return out


def garbage_to_pb(g: Garbage) -> pb.Garbage:
    return pb.Garbage(uri=g.uri, job=g.job, step=g.step, size=g.size, since=g.since)


def gc_to_pb(r: GCReport) -> pb.GCResponse:
    return pb.GCResponse(deleted=[pb.StepRef(job=j, step=s) for j, s in r.deleted],
                         expired=[pb.StepRef(job=j, step=s) for j, s in r.expired],
                         deletable=[garbage_to_pb(g) for g in r.deletable],
                         deletable_total=r.deletable_total)


# ----- the servicer ------------------------------------------------------------------------------


class CheckpointsServicer:
    """``accord.checkpoints.v1.Checkpoints`` on one member."""

    def __init__(self, group: CheckpointGroup) -> None:
        self.group = group
        self.service = group.service

    async def Begin(self, request: pb.BeginRequest, context: grpc.aio.ServicerContext
                    ) -> pb.BeginResponse:
        async def run() -> pb.BeginResponse:
            r = request.retention if request.HasField("retention") else None
            out = await self.service.begin(
                request.job, request.step, request.token, layout_to_wire(request.layout),
                [[e.shard_id, e.rank] for e in request.expected], lease_s=request.lease_s,
                retention_policy=None if r is None else {
                    "keep_last": r.keep_last, "keep_every": r.keep_every,
                    "keep_within_s": r.keep_within_s},
                metadata=dict(request.metadata), request_id=request.request_id)
            return pb.BeginResponse(superseded=out["superseded"], deadline=out["deadline"])
        return await _call(context, run())

    async def RegisterShards(self, request: pb.RegisterShardsRequest,
                             context: grpc.aio.ServicerContext) -> pb.RegisterShardsResponse:
        async def run() -> pb.RegisterShardsResponse:
            out = await self.service.register(
                request.job, request.step, request.token,
                request.shards, request_id=request.request_id, parse=shard_cmd_from_pb)
            return pb.RegisterShardsResponse(registered=out["registered"],
                                             duplicates=out["duplicates"],
                                             remaining=out["remaining"])
        return await _call(context, run())

    async def Commit(self, request: pb.CommitRequest, context: grpc.aio.ServicerContext
                     ) -> pb.CommitResponse:
        async def run() -> pb.CommitResponse:
            out = await self.service.commit(request.job, request.step, request.token,
                                            request_id=request.request_id)
            return pb.CommitResponse(latest=out["latest"], latest_changed=out["latest_changed"])
        return await _call(context, run())

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
                    ) -> pb.AbortResponse:
        async def run() -> pb.AbortResponse:
            out = await self.service.abort(request.job, request.step, request.token,
                                           request.reason, request_id=request.request_id)
            return pb.AbortResponse(already=out["already"], superseded=out["superseded"])
        return await _call(context, run())

    async def GetManifest(self, request: pb.GetManifestRequest,
                          context: grpc.aio.ServicerContext) -> pb.Manifest:
        async def run() -> pb.Manifest:
            await self.group.barrier()
            step = request.step if request.HasField("step") else None
            return manifest_to_pb(*self.service.manifest(request.job, step))
        return await _call(context, run())

    async def ListSteps(self, request: pb.ListStepsRequest,
                        context: grpc.aio.ServicerContext) -> pb.ListStepsResponse:
        async def run() -> pb.ListStepsResponse:
            await self.group.barrier()
            states = []
            for s in request.states:
                if s not in _STATE_NAME:
                    raise CheckpointError(f"state {s} is unknown: use PENDING, COMMITTED, "
                                          "ABORTED or DELETED")
                states.append(_STATE_NAME[s])
            job, steps = self.service.steps(request.job, states)
            return pb.ListStepsResponse(job=job_to_pb(job, *self.service.counts(job)),
                                        steps=[summary_to_pb(job, s) for s in steps])
        return await _call(context, run())

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
                       ) -> pb.ListJobsResponse:
        async def run() -> pb.ListJobsResponse:
            await self.group.barrier()
            return pb.ListJobsResponse(jobs=[job_to_pb(j, *self.service.counts(j))
                                             for j in self.service.jobs()])
        return await _call(context, run())

    async def WatchLatest(self, request: pb.WatchLatestRequest,
                          context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[pb.WatchLatestResponse]:
        try:
            check_job(request.job)
            await self.group.barrier()
        except CheckpointError as e:
            await _abort(context, CODES.get(e.kind, grpc.StatusCode.INVALID_ARGUMENT), str(e))
        except GroupUnavailable as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        async for latest, version in self.group.watchers.watch(
                request.job, lambda: self.group.latest(request.job)):
            out = pb.WatchLatestResponse(job=request.job, version=version)
            if latest is not None:
                out.latest = latest
            yield out

    async def SetRetention(self, request: pb.SetRetentionRequest,
                           context: grpc.aio.ServicerContext) -> pb.SetRetentionResponse:
        async def run() -> pb.SetRetentionResponse:
            r = request.retention
            await self.service.set_retention(
                request.job, {"keep_last": r.keep_last, "keep_every": r.keep_every,
                              "keep_within_s": r.keep_within_s}, request_id=request.request_id)
            return pb.SetRetentionResponse(retention=r)
        return await _call(context, run())

    async def Pin(self, request: pb.PinRequest, context: grpc.aio.ServicerContext
                  ) -> pb.PinResponse:
        async def run() -> pb.PinResponse:
            changed = await self.service.pin(request.job, request.step, request.request_id)
            return pb.PinResponse(changed=changed)
        return await _call(context, run())

    async def Unpin(self, request: pb.PinRequest, context: grpc.aio.ServicerContext
                    ) -> pb.PinResponse:
        async def run() -> pb.PinResponse:
            changed = await self.service.unpin(request.job, request.step, request.request_id)
            return pb.PinResponse(changed=changed)
        return await _call(context, run())

    async def GC(self, request: pb.GCRequest, context: grpc.aio.ServicerContext
                 ) -> pb.GCResponse:
        async def run() -> pb.GCResponse:
            if request.dry_run:
                await self.group.barrier()
            report = await self.service.gc(list(request.jobs), dry_run=request.dry_run,
                                           limit=request.limit or 10_000,
                                           request_id=request.request_id)
            return gc_to_pb(report)
        return await _call(context, run())

    async def ConfirmDeleted(self, request: pb.ConfirmDeletedRequest,
                             context: grpc.aio.ServicerContext) -> pb.ConfirmDeletedResponse:
        async def run() -> pb.ConfirmDeletedResponse:
            n = await self.service.confirm_deleted(list(request.uris), request.request_id)
            return pb.ConfirmDeletedResponse(confirmed=n)
        return await _call(context, run())

    async def MoveTier(self, request: pb.MoveTierRequest, context: grpc.aio.ServicerContext
                       ) -> pb.MoveTierResponse:
        async def run() -> pb.MoveTierResponse:
            add = ((request.add.uri, tier_name(request.add.tier))
                   if request.HasField("add") else None)
            locs = await self.service.move_tier(request.job, request.step, request.shard_id,
                                                add=add, drop=list(request.drop),
                                                request_id=request.request_id)
            return pb.MoveTierResponse(locations=[pb.Location(uri=loc.uri,
                                                              tier=tier_value(loc.tier))
                                                  for loc in locs])
        return await _call(context, run())


def add_checkpoints_service(server: grpc.aio.Server, group: CheckpointGroup
                            ) -> CheckpointsServicer:
    """Register the checkpoint service on ``server``; returns the servicer."""
    servicer = CheckpointsServicer(group)
    _grpc_mod.add_CheckpointsServicer_to_server(servicer, server)
    return servicer
