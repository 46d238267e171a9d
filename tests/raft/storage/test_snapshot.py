"""Snapshot files: chunked write, atomic install, old ones dropped, resumable CRC-checked transfer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from accord.raft.core.types import ConfState, SnapshotMeta
from accord.raft.storage.snapshot import SnapshotCorruptError, SnapshotInfo, SnapshotStore

CS = ConfState(voters=(1, 2, 3), learners=(4,))


def _chunks(seed: int, n: int, size: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(0, size)) for _ in range(n)]


def _write(
    store: SnapshotStore, group: int, meta: SnapshotMeta, chunks: list[bytes]
) -> SnapshotInfo:
    with store.writer(group, meta) as w:
        for c in chunks:
            w.write(c)
        return w.finish()


def test_write_read_and_replace(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snap")
    assert store.latest(1) is None
    chunks = _chunks(1, 20, 5000)
    m1 = SnapshotMeta(10, 2, CS)
    info = _write(store, 1, m1, chunks)
    assert info.path.name == f"{2:016x}-{10:016x}.snap"
    assert store.latest(1) == info
    store.verify(info)
    assert b"".join(store.data_chunks(info, chunk_size=777)) == b"".join(chunks)
    m2 = SnapshotMeta(25, 3, CS)
    info2 = _write(store, 1, m2, _chunks(2, 3, 100))
    assert store.latest(1) == info2
    # The older one stays until the WAL recorded the newer one (the log may still name it).
    assert store.find(1, m1) == info and store.find(1, m2) == info2
    assert store.find(1, SnapshotMeta(25, 2, CS)) is None, "a term that does not match"
    assert store.prune(1, m2) == 1
    assert not info.path.exists(), "an older snapshot goes once the newer one is recorded"
    assert [s.meta for s in store.snapshots(1)] == [m2] and store.find(1, m1) is None
    # Another group is independent.
    _write(store, 7, SnapshotMeta(3, 1), [b"x"])
    assert store.groups() == [1, 7]
    store.remove_group(7)
    assert store.groups() == [1] and store.latest(7) is None


def test_unfinished_writes_leave_nothing(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    with pytest.raises(RuntimeError):
        with store.writer(1, SnapshotMeta(5, 1)) as w:
            w.write(b"partial")
            raise RuntimeError("state machine failed")
    assert store.latest(1) is None
    # A crash mid-write leaves a .tmp file; reopening the store removes it.
    w = store.writer(1, SnapshotMeta(6, 1))
    w.write(b"abc")
    tmp = next((tmp_path / "1").glob("*.tmp"))
    store2 = SnapshotStore(tmp_path)
    assert not tmp.exists() and store2.latest(1) is None
    w.abort()


def test_corrupt_file_is_detected(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    info = _write(store, 1, SnapshotMeta(10, 2, CS), _chunks(3, 10, 3000))
    raw = bytearray(info.path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    info.path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotCorruptError, match="CRC"):
        store.verify(info)
    with pytest.raises(SnapshotCorruptError, match="CRC"):
        for _ in store.data_chunks(info):
            pass
    info.path.write_bytes(bytes(raw[:-5]))
    with pytest.raises(SnapshotCorruptError):
        store.verify(store.latest(1))  # type: ignore[arg-type]


def test_resumable_transfer_verifies_before_install(tmp_path: Path) -> None:
    leader = SnapshotStore(tmp_path / "leader")
    follower_root = tmp_path / "follower"
    meta = SnapshotMeta(40, 5, CS)
    data = _chunks(4, 30, 4000)
    info = _write(leader, 3, meta, data)
    follower = SnapshotStore(follower_root)
    rx = follower.receiver(3, meta)
    assert rx.offset == 0
    pieces = list(leader.file_chunks(info, chunk_size=1000))
    for off, chunk in pieces[:17]:
        rx.write(off, chunk)
    rx.close()  # connection lost (or the follower restarted): the partial file stays
    follower = SnapshotStore(follower_root)
    rx = follower.receiver(3, meta)
    resume = rx.offset
    assert resume == pieces[17][0]
    with pytest.raises(ValueError, match="resend from offset"):
        rx.write(resume + 1000, b"gap")
    # A resent earlier piece is accepted (it overwrites from its offset).
    rx.write(*pieces[16])
    for off, chunk in leader.file_chunks(info, offset=rx.offset, chunk_size=1500):
        rx.write(off, chunk)
    assert follower.latest(3) is None, "nothing is installed before finish()"
    installed = rx.finish()
    assert installed.meta == meta
    assert b"".join(follower.data_chunks(installed)) == b"".join(data)
    assert not list((follower_root / "3").glob("*.part"))


def test_damaged_transfer_is_refused_and_discarded(tmp_path: Path) -> None:
    leader = SnapshotStore(tmp_path / "leader")
    follower = SnapshotStore(tmp_path / "follower")
    meta = SnapshotMeta(8, 2, CS)
    info = _write(leader, 1, meta, _chunks(5, 8, 2000))
    rx = follower.receiver(1, meta)
    for off, chunk in leader.file_chunks(info, chunk_size=512):
        if off == 1024:
            chunk = bytes([chunk[0] ^ 1]) + chunk[1:]
        rx.write(off, chunk)
    with pytest.raises(SnapshotCorruptError, match="CRC"):
        rx.finish()
    assert follower.latest(1) is None
    assert not list((tmp_path / "follower" / "1").iterdir())
    # A file for another snapshot than announced is refused too.
    rx = follower.receiver(1, SnapshotMeta(9, 2, CS))
    for off, chunk in leader.file_chunks(info):
        rx.write(off, chunk)
    with pytest.raises(SnapshotCorruptError, match="expected group 1"):
        rx.finish()
    assert follower.latest(1) is None
