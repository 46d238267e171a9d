"""The verifier reads shards through fsspec and names exactly which one is bad."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.services.checkpoints.checksum import of_bytes
from accord.services.checkpoints.model import Location, Shard
from accord.services.checkpoints.verify import CHECKSUM, MISSING, OK, SIZE, verify


def _shard(tmp: Path, rank: int, data: bytes, algorithm: str) -> Shard:
    path = tmp / f"rank-{rank}.bin"
    path.write_bytes(data)
    return Shard(f"rank-{rank}", rank, len(data), of_bytes(data, algorithm),
                 (Location(path.as_uri(), "shared_fs"),))


@pytest.mark.parametrize("algorithm", ["crc32c", "sha256"])
def test_truncated_flipped_and_missing_shards_are_named(tmp_path: Path, algorithm: str) -> None:
    shards = [_shard(tmp_path, r, bytes(range(256)) * (r + 5), algorithm) for r in range(5)]
    p1 = Path(shards[1].uri[len("file://"):])
    p1.write_bytes(p1.read_bytes()[:-7])                      # truncated
    p2 = Path(shards[2].uri[len("file://"):])
    data = bytearray(p2.read_bytes())
    data[100] ^= 0x01                                          # one flipped bit
    p2.write_bytes(bytes(data))
    Path(shards[3].uri[len("file://"):]).unlink()              # missing
    p4 = Path(shards[4].uri[len("file://"):])
    p4.write_bytes(p4.read_bytes() + b"x")                     # too long
    seen: list[str] = []
    out = verify(shards, progress=lambda c: seen.append(c.shard_id))
    assert [(c.shard_id, c.status) for c in out] == [
        ("rank-0", OK), ("rank-1", SIZE), ("rank-2", CHECKSUM), ("rank-3", MISSING),
        ("rank-4", SIZE)]
    assert "truncated" in out[1].detail and "longer" in out[4].detail
    assert sorted(seen) == [f"rank-{r}" for r in range(5)]


def test_every_location_is_checked_on_request(tmp_path: Path) -> None:
    good = _shard(tmp_path, 0, b"payload" * 100, "crc32c")
    copy = tmp_path / "copy.bin"
    copy.write_bytes(b"payload" * 99 + b"paylaod")
    both = Shard(good.shard_id, 0, good.size, good.checksum,
                 (*good.locations, Location(copy.as_uri(), "object_store")))
    assert [c.status for c in verify([both])] == [OK]
    assert [c.status for c in verify([both], all_locations=True)] == [OK, CHECKSUM]
