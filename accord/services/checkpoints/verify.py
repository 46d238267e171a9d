"""The verifier: are a manifest's shards in storage, whole and unchanged?

Each shard's primary location (or every location, ``all_locations=True``) is opened
through ``fsspec`` (``file://`` here; ``s3://``, ``gs://`` and the rest wherever the
matching fsspec backend is installed), read once while hashing, and compared with the
registered size and checksum. The report names each bad shard and what is wrong with
it: missing, unreadable, too short, too long, or a checksum mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec

from accord.services.checkpoints.checksum import of_stream
from accord.services.checkpoints.model import Shard

OK, MISSING, UNREADABLE, SIZE, CHECKSUM = "ok", "missing", "unreadable", "size", "checksum"


@dataclass(slots=True, frozen=True)
class ShardCheck:
    """The verdict on one location of one shard."""

    shard_id: str
    rank: int
    uri: str
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


def check_location(shard: Shard, uri: str) -> ShardCheck:
    """Read ``uri`` and compare it with ``shard``'s size and checksum."""
    def verdict(status: str, detail: str = "") -> ShardCheck:
        return ShardCheck(shard.shard_id, shard.rank, uri, status, detail)

    try:
        with fsspec.open(uri, "rb") as f:
            got, n = of_stream(f, shard.checksum.algorithm, limit=shard.size)
    except FileNotFoundError:
        return verdict(MISSING, "no object at this URL")
    except (OSError, ValueError, ImportError) as e:
        return verdict(UNREADABLE, f"{type(e).__name__}: {e}")
    if n < shard.size:
        return verdict(SIZE, f"truncated: {n} bytes, registered {shard.size}")
    if n > shard.size:
        return verdict(SIZE, f"longer than the registered {shard.size} bytes")
    if got != shard.checksum:
        return verdict(CHECKSUM, f"{got.algorithm} {got.digest}, registered "
                                 f"{shard.checksum.digest}")
    return verdict(OK)


def verify(shards: Iterable[Shard], *, all_locations: bool = False, workers: int = 8,
           progress: Callable[[ShardCheck], None] | None = None) -> list[ShardCheck]:
    """Check every shard (reads run on ``workers`` threads); results in shard order."""
    jobs = [(sh, uri) for sh in shards for uri in (sh.uris() if all_locations else [sh.uri])]
    out: list[ShardCheck] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for check in pool.map(lambda j: check_location(*j), jobs):
            out.append(check)
            if progress is not None:
                progress(check)
    return out
