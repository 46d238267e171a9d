"""Blocking twins of :mod:`accord.client.checkpoints` and the checkpoint writer.

For threaded training code, in the shape of :mod:`accord.client.sync`: every method
submits the async call to the ``SyncClient``'s loop thread and waits::

    with SyncClient(endpoints) as client:
        writer = client.checkpoints.writer("llama-7b", step, token, base_url="file:///ckpt")
        writer.register([writer.write_arrays(f"rank-{rank}", rank, {"w": array})])
        print(client.checkpoints.manifest("llama-7b").step)
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, BinaryIO, TypeVar

from accord.client.checkpoint_writer import ShardWriter
from accord.client.checkpoints import Checkpoints, VerifyReport
from accord.proto import checkpoints_pb2 as pb
from accord.services.checkpoints.verify import ShardCheck

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]


class SyncShardWriter:
    """A :class:`ShardWriter` with blocking methods."""

    def __init__(self, run: Runner[Any], writer: ShardWriter) -> None:
        self._run = run
        self.writer = writer

    def write(self, shard_id: str, rank: int, body: bytes | Callable[[BinaryIO], None], *,
              tensors: Sequence[Sequence[Any]] = (), suffix: str = ".bin") -> dict[str, Any]:
        """See :meth:`ShardWriter.write`."""
        out: dict[str, Any] = self._run(self.writer.write(shard_id, rank, body, tensors=tensors,
                                                          suffix=suffix))
        return out

    def write_arrays(self, shard_id: str, rank: int, arrays: Mapping[str, Any], *,
                     slices: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None
                     ) -> dict[str, Any]:
        """See :meth:`ShardWriter.write_arrays`."""
        out: dict[str, Any] = self._run(self.writer.write_arrays(shard_id, rank, arrays,
                                                                 slices=slices))
        return out

    def register(self, shards: Sequence[dict[str, Any]]) -> int:
        """See :meth:`ShardWriter.register`."""
        return int(self._run(self.writer.register(shards)))


class SyncCheckpoints:
    """Blocking access to the checkpoint service (``SyncClient.checkpoints``)."""

    def __init__(self, run: Runner[Any], checkpoints: Checkpoints) -> None:
        self._run = run
        self.async_ = checkpoints

    def writer(self, job: str, step: int, token: int, *, base_url: str,
               algorithm: str = "crc32c", tier: str = "") -> SyncShardWriter:
        """A blocking :class:`ShardWriter` for one step."""
        return SyncShardWriter(self._run, ShardWriter(self.async_, job, step, token,
                                                      base_url=base_url, algorithm=algorithm,
                                                      tier=tier))

    def begin(self, job: str, step: int, token: int, *, layout: dict[str, int],
              expected: Sequence[tuple[str, int]], lease_s: float = 0.0,
              retention: dict[str, Any] | None = None) -> pb.BeginResponse:
        """See :meth:`Checkpoints.begin`."""
        out: pb.BeginResponse = self._run(self.async_.begin(
            job, step, token, layout=layout, expected=expected, lease_s=lease_s,
            retention=retention))
        return out

    def register_shards(self, job: str, step: int, token: int,
                        shards: Sequence[dict[str, Any]]) -> pb.RegisterShardsResponse:
        """See :meth:`Checkpoints.register_shards`."""
        out: pb.RegisterShardsResponse = self._run(self.async_.register_shards(job, step, token,
                                                                               shards))
        return out

    def commit(self, job: str, step: int, token: int) -> pb.CommitResponse:
        """See :meth:`Checkpoints.commit`."""
        out: pb.CommitResponse = self._run(self.async_.commit(job, step, token))
        return out

    def abort(self, job: str, step: int, token: int, reason: str = "") -> pb.AbortResponse:
        """See :meth:`Checkpoints.abort`."""
        out: pb.AbortResponse = self._run(self.async_.abort(job, step, token, reason))
        return out

    def manifest(self, job: str, step: int | None = None) -> pb.Manifest:
        """See :meth:`Checkpoints.manifest`."""
        out: pb.Manifest = self._run(self.async_.manifest(job, step))
        return out

    def latest(self, job: str) -> int | None:
        """See :meth:`Checkpoints.latest`."""
        out: int | None = self._run(self.async_.latest(job))
        return out

    def verify(self, job: str, step: int | None = None, *, all_locations: bool = False,
               workers: int = 8,
               progress: Callable[[ShardCheck, int, int], None] | None = None) -> VerifyReport:
        """See :meth:`Checkpoints.verify`."""
        out: VerifyReport = self._run(self.async_.verify(
            job, step, all_locations=all_locations, workers=workers, progress=progress))
        return out

    def steps(self, job: str, states: Sequence[str] = ()) -> pb.ListStepsResponse:
        """See :meth:`Checkpoints.steps`."""
        out: pb.ListStepsResponse = self._run(self.async_.steps(job, states))
        return out

    def jobs(self) -> list[pb.JobSummary]:
        """See :meth:`Checkpoints.jobs`."""
        out: list[pb.JobSummary] = self._run(self.async_.jobs())
        return out

    def wait_latest(self, job: str, *, after: int | None = None, timeout: float = 30.0
                    ) -> int | None:
        """Block until the job's latest committed step is not ``after`` (or ``timeout``
        passes); the latest step then."""
        async def wait() -> int | None:
            last: int | None = after
            async for step in self.async_.watch_latest(job, timeout=timeout):
                last = step
                if step != after:
                    break
            return last
        out: int | None = self._run(wait())
        return out

    def pin(self, job: str, step: int) -> bool:
        """See :meth:`Checkpoints.pin`."""
        return bool(self._run(self.async_.pin(job, step)))

    def unpin(self, job: str, step: int) -> bool:
        """See :meth:`Checkpoints.unpin`."""
        return bool(self._run(self.async_.unpin(job, step)))

    def gc(self, jobs: Sequence[str] = (), *, dry_run: bool = False) -> pb.GCResponse:
        """See :meth:`Checkpoints.gc`."""
        out: pb.GCResponse = self._run(self.async_.gc(jobs, dry_run=dry_run))
        return out

    def confirm_deleted(self, uris: Sequence[str]) -> int:
        """See :meth:`Checkpoints.confirm_deleted`."""
        return int(self._run(self.async_.confirm_deleted(uris)))
