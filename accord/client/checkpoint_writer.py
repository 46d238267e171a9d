"""Checkpoint writing for training code: a per-rank shard writer and the job's coordinator.

::

    # the coordinator (one per job incarnation, e.g. on rank 0's host)
    async with CheckpointCoordinator(client, "llama-7b") as coord:     # holds the job's lock
        await coord.begin(step, layout={"world_size": 8, "dp": 8},
                          expected=[(f"rank-{r}", r) for r in range(8)])
        ...  # hand coord.token to the ranks with the step number
        await coord.commit(step, wait_s=60)       # waits for the last shards, then commits

    # each rank (or each host, for its ranks)
    writer = ShardWriter(client.checkpoints, "llama-7b", step, token, base_url="file:///ckpt")
    shard = await writer.write_arrays(f"rank-{rank}", rank, {"w": array})  # safetensors
    await writer.register([shard])

Storage objects are immutable: a shard's URL names the job, step, shard and the writing
incarnation's token, so a restarted job never overwrites what an older incarnation
wrote, and GC can delete an aborted attempt without touching the new one. The checksum
is computed over the bytes as they are written (one pass, through ``fsspec``); nothing
depends on the storage's atomicity: the manifest commit is the commit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import fsspec
import grpc

from accord.client.base import ClientCalls
from accord.client.checkpoints import Checkpoints
from accord.client.errors import ClientError
from accord.client.lock import Lock
from accord.services.checkpoints.checksum import Hasher, hasher
from accord.services.checkpoints.model import default_tier
from accord.services.checkpoints.service import lock_name


class HashingFile:
    """A writable file that hashes and counts what passes through it to ``inner``."""

    def __init__(self, inner: BinaryIO, h: Hasher) -> None:
        self.inner = inner
        self.hasher = h
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        b = bytes(data)
        self.inner.write(b)
        self.hasher.update(b)
        self.size += len(b)
        return len(b)

    def flush(self) -> None:
        self.inner.flush()


def tensor_index(arrays: Mapping[str, Any],
                 slices: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None
                 ) -> list[list[Any]]:
    """Tensor entries ``[name, global_shape, offsets, sizes, dtype]`` for arrays (anything
    with ``.shape`` and ``.dtype``); ``slices[name] = (global_shape, offsets)`` places a
    local slice in its global tensor (default: the whole tensor)."""
    out: list[list[Any]] = []
    for name, a in arrays.items():
        sizes = [int(x) for x in a.shape]
        shape, offsets = (slices or {}).get(name, (sizes, [0] * len(sizes)))
        out.append([name, [int(x) for x in shape], [int(x) for x in offsets], sizes,
                    str(a.dtype)])
    return out


class ShardWriter:
    """Writes one rank's (or one host's) shards of a step and registers them."""

    def __init__(self, checkpoints: Checkpoints, job: str, step: int, token: int, *,
                 base_url: str, algorithm: str = "crc32c", tier: str = "") -> None:
        hasher(algorithm)  # refuse an unknown algorithm now, not after writing
        self.ckpt = checkpoints
        self.job, self.step, self.token = job, step, token
        self.base_url = base_url.rstrip("/")
        self.algorithm = algorithm
        self.tier = tier or default_tier(self.base_url)

    def url_for(self, shard_id: str, suffix: str = "") -> str:
        """Where ``shard_id`` goes: unique per job, step, shard and incarnation."""
        return (f"{self.base_url}/{self.job}/step-{self.step:010d}/"
                f"{shard_id}.t{self.token}{suffix}")

    def _write_sync(self, url: str, body: bytes | Callable[[BinaryIO], None]
                    ) -> tuple[str, int]:
        h = hasher(self.algorithm)
        with fsspec.open(url, "wb", auto_mkdir=True) as f:
            out = HashingFile(f, h)
            if isinstance(body, (bytes, bytearray, memoryview)):
                out.write(body)
            else:
                body(out)  # type: ignore[arg-type]
        return h.hexdigest(), out.size

    async def write(self, shard_id: str, rank: int, body: bytes | Callable[[BinaryIO], None],
                    *, tensors: Sequence[Sequence[Any]] = (), suffix: str = ".bin"
                    ) -> dict[str, Any]:
        """Write a shard (bytes, or a function writing to a file) while hashing it; its
        description for :meth:`register` (nothing is registered yet)."""
        url = self.url_for(shard_id, suffix)
        digest, size = await asyncio.to_thread(self._write_sync, url, body)
        return {"shard_id": shard_id, "rank": rank, "uri": url, "tier": self.tier,
                "size": size, "checksum": [self.algorithm, digest],
                "tensors": [list(t) for t in tensors]}

    async def write_arrays(self, shard_id: str, rank: int, arrays: Mapping[str, Any], *,
                           slices: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None
                           ) -> dict[str, Any]:
        """Write numpy arrays as one safetensors file, with their tensor index."""
        try:
            from safetensors.numpy import save
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise RuntimeError("write_arrays needs the safetensors and numpy packages") from e
        body = save(dict(arrays))
        return await self.write(shard_id, rank, body, tensors=tensor_index(arrays, slices),
                                suffix=".safetensors")

    async def register(self, shards: Sequence[dict[str, Any]]) -> int:
        """Register written shards in one call; how many remain unregistered in the step."""
        resp = await self.ckpt.register_shards(self.job, self.step, self.token, shards)
        return int(resp.remaining)


class CheckpointCoordinator:
    """The job incarnation's coordinator: holds the job's fenced lock, begins and commits.

    Its lock (``/ckpt/<job>/coordinator``) is what makes it *the* incarnation: its token
    fences every call, and a restarted job's new coordinator gets a larger token, after
    which this one's calls are refused."""

    def __init__(self, client: ClientCalls, job: str, *, checkpoints: Checkpoints | None = None,
                 ttl: int = 10) -> None:
        self.job = job
        self.ckpt = checkpoints or Checkpoints(client.pool)
        self.lock = Lock(client, lock_name(job), ttl=ttl)

    @property
    def token(self) -> int:
        """The fencing token of this incarnation."""
        return self.lock.token

    async def __aenter__(self) -> CheckpointCoordinator:
        await self.lock.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.lock.release()

    async def begin(self, step: int, *, layout: dict[str, int],
                    expected: Sequence[tuple[str, int]], lease_s: float = 0.0,
                    retention: dict[str, Any] | None = None,
                    metadata: dict[str, str] | None = None) -> list[int]:
        """Begin ``step``; the older incarnations' pending steps it aborted."""
        resp = await self.ckpt.begin(self.job, step, self.token, layout=layout,
                                     expected=expected, lease_s=lease_s, retention=retention,
                                     metadata=metadata)
        return list(resp.superseded)

    async def commit(self, step: int, *, wait_s: float = 0.0, poll_s: float = 0.05) -> int:
        """Commit ``step``; with ``wait_s``, first wait (bounded) for the last shards to be
        registered. Returns the job's latest committed step."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return int((await self.ckpt.commit(self.job, step, self.token)).latest)
            except ClientError as e:
                if (e.code != grpc.StatusCode.FAILED_PRECONDITION or "not registered"
                        not in e.message or time.monotonic() >= deadline):
                    raise
            await asyncio.sleep(poll_s)

    async def abort(self, step: int, reason: str = "") -> None:
        """Abort ``step``."""
        await self.ckpt.abort(self.job, step, self.token, reason)
