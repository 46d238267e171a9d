"""lossyfs's rules, each shown on a real mount: what a power cut keeps and what it loses.

A write survives a cut only once its file was fsynced (or fdatasynced); a create,
rename, unlink, mkdir or rmdir only once its directory was fsynced; a torn cut keeps
a seeded prefix of each file's unsynced bytes, cut at any byte, and the same seed
keeps the same prefix. A seeded random workload is checked against a reference
model of what is durable.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tools.lossyfs.control import LossyFS


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[LossyFS]:
    with LossyFS(tmp_path / "disk", tmp_path / "mnt") as f:
        yield f


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, sync: str = "fsync") -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync == "fsync":
            os.fsync(f.fileno())
        elif sync == "fdatasync":
            os.fdatasync(f.fileno())


@pytest.mark.parametrize("sync", ["fsync", "fdatasync"])
def test_a_synced_write_survives_a_cut_and_an_unsynced_one_does_not(fs: LossyFS,
                                                                    sync: str) -> None:
    m = fs.mountpoint
    write_file(m / "f", b"durable", sync=sync)
    fsync_dir(m)
    with open(m / "f", "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b" and then lost")
        f.flush()
        f.seek(0)
        f.write(b"D")  # an overwrite is undone too
    assert (m / "f").read_bytes() == b"Durable and then lost"  # the page cache's view
    report = fs.power_cut()
    assert (m / "f").read_bytes() == b"durable"
    assert report["files_rewound"] == 1 and report["bytes_dropped"] == 15
    assert fs.status()["unsynced_files"] == 0


def test_a_created_file_needs_its_directory_fsync_and_its_own(fs: LossyFS) -> None:
    m = fs.mountpoint
    write_file(m / "no-dir-sync", b"data")          # file synced, directory not
    fsync_dir(m)
    write_file(m / "later", b"data")                # created after the directory's fsync
    write_file(m / "no-file-sync", b"data", sync="none")
    write_file(m / "both", b"data")
    fsync_dir(m)
    write_file(m / "after", b"data")
    report = fs.power_cut()
    assert sorted(os.listdir(m)) == ["both", "later", "no-dir-sync", "no-file-sync"]
    # "later" was named by the second directory fsync; "after" by none.
    assert report["vanished"] == ["after"]
    assert (m / "both").read_bytes() == b"data"
    assert (m / "no-file-sync").read_bytes() == b""  # the name is durable, the data is not


def test_a_created_file_without_a_directory_fsync_vanishes(fs: LossyFS) -> None:
    m = fs.mountpoint
    write_file(m / "f", b"synced data, unsynced name")
    assert fs.power_cut()["vanished"] == ["f"]
    assert os.listdir(m) == []


def test_a_rename_without_a_directory_fsync_is_undone(fs: LossyFS) -> None:
    m = fs.mountpoint
    write_file(m / "a", b"first")
    write_file(m / "target", b"old target")
    fsync_dir(m)
    os.rename(m / "a", m / "b")
    write_file(m / "tmp", b"new target")
    os.replace(m / "tmp", m / "target")             # the atomic-replace idiom, unsynced
    assert (m / "target").read_bytes() == b"new target"
    report = fs.power_cut()
    assert sorted(os.listdir(m)) == ["a", "target"]
    assert (m / "a").read_bytes() == b"first"
    assert (m / "target").read_bytes() == b"old target"
    assert report["reappeared"] == ["a"] and report["vanished"] == ["b"]


def test_a_rename_with_a_directory_fsync_is_kept(fs: LossyFS) -> None:
    m = fs.mountpoint
    write_file(m / "target", b"old target")
    fsync_dir(m)
    write_file(m / "tmp", b"new target")
    os.replace(m / "tmp", m / "target")
    fsync_dir(m)
    fs.power_cut()
    assert os.listdir(m) == ["target"]
    assert (m / "target").read_bytes() == b"new target"


def test_an_unlink_without_a_directory_fsync_is_undone(fs: LossyFS) -> None:
    m = fs.mountpoint
    write_file(m / "keep", b"contents")
    write_file(m / "gone", b"gone for good")
    fsync_dir(m)
    os.unlink(m / "keep")
    os.unlink(m / "gone")
    fsync_dir(m)
    write_file(m / "keep", b"a new file of the same name")  # its name unsynced
    os.unlink(m / "keep")
    report = fs.power_cut()
    assert os.listdir(m) == []  # the synced unlinks hold
    assert report["vanished"] == [] and report["reappeared"] == []
    write_file(m / "x", b"x contents")
    fsync_dir(m)
    with open(m / "x", "ab") as f:
        f.write(b" plus unsynced")
    os.unlink(m / "x")
    assert fs.power_cut()["reappeared"] == ["x"]
    assert (m / "x").read_bytes() == b"x contents"  # back, as of its last fsync


def test_directories_follow_their_parent_fsync(fs: LossyFS) -> None:
    m = fs.mountpoint
    os.mkdir(m / "kept")
    os.mkdir(m / "gone")
    fsync_dir(m)
    write_file(m / "kept" / "inner", b"inner")
    fsync_dir(m / "kept")
    os.mkdir(m / "lost")
    write_file(m / "lost" / "inner", b"inner")
    fsync_dir(m / "lost")   # the directory's own entries, not its name in the parent
    os.rmdir(m / "gone")
    report = fs.power_cut()
    assert sorted(os.listdir(m)) == ["gone", "kept"]
    assert os.listdir(m / "gone") == []
    assert (m / "kept" / "inner").read_bytes() == b"inner"
    assert report["vanished"] == ["lost/", "lost/inner"]


def test_a_truncation_without_fsync_is_undone(fs: LossyFS) -> None:
    m = fs.mountpoint
    write_file(m / "f", b"0123456789")
    fsync_dir(m)
    os.truncate(m / "f", 3)
    with open(m / "f", "r+b") as f:
        f.truncate(20)
    assert (m / "f").read_bytes() == b"012" + bytes(17)
    fs.power_cut()
    assert (m / "f").read_bytes() == b"0123456789"
    with open(m / "f", "wb") as f:  # O_TRUNC, then synced
        f.write(b"new")
        f.flush()
        os.fsync(f.fileno())
    fs.power_cut()
    assert (m / "f").read_bytes() == b"new"


def _torn_run(fs: LossyFS, seed: int, stream: bytes) -> bytes:
    """A synced head, then ``stream`` appended in unsynced pieces, then a torn cut."""
    m = fs.mountpoint
    write_file(m / "log", b"HEAD")
    fsync_dir(m)
    with open(m / "log", "ab") as f:
        for i in range(0, len(stream), 100):
            f.write(stream[i:i + 100])
            f.flush()
    fs.power_cut(seed=seed, torn=True)
    return (m / "log").read_bytes()


def test_a_torn_cut_keeps_a_seeded_prefix_cut_at_any_byte(fs: LossyFS) -> None:
    rng = random.Random(23)
    stream = bytes(rng.randrange(1, 256) for _ in range(1000))
    kept: dict[int, int] = {}
    for seed in range(8):
        got = _torn_run(fs, seed, stream)
        assert got.startswith(b"HEAD"), seed
        tail = got[4:]
        assert stream.startswith(tail), f"seed {seed}: not a prefix of the unsynced writes"
        kept[seed] = len(tail)
    print("kept bytes per seed:", kept)
    assert len(set(kept.values())) > 4, kept
    assert any(k % 100 for k in kept.values()), f"never torn inside a write: {kept}"
    # The same seed keeps the same prefix.
    for seed in (2, 5):
        assert len(_torn_run(fs, seed, stream)) - 4 == kept[seed]


def test_seeded_random_file_operations_match_a_model_of_what_is_durable(fs: LossyFS) -> None:
    seed = int(os.environ.get("LOSSYFS_SEED", random.randrange(1 << 30)))
    print(f"LOSSYFS_SEED={seed}")
    rng = random.Random(seed)
    m = fs.mountpoint
    names = ["a", "b", "c"]
    current = {n: b"" for n in names}
    durable = dict(current)
    fds = {}
    for n in names:
        fds[n] = os.open(m / n, os.O_CREAT | os.O_RDWR, 0o644)
    fsync_dir(m)
    try:
        for round_ in range(3):
            for _ in range(150):
                n = rng.choice(names)
                fd, cur = fds[n], current[n]
                op = rng.random()
                if op < 0.6:
                    off = rng.randrange(0, len(cur) + 50)
                    data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
                    os.pwrite(fd, data, off)
                    if off > len(cur):
                        cur = cur + bytes(off - len(cur))
                    cur = cur[:off] + data + cur[off + len(data):]
                elif op < 0.75:
                    size = rng.randrange(0, len(cur) + 40)
                    os.ftruncate(fd, size)
                    cur = cur[:size] + bytes(max(0, size - len(cur)))
                else:
                    (os.fsync if rng.random() < 0.5 else os.fdatasync)(fd)
                    durable[n] = cur
                current[n] = cur
                assert os.pread(fd, len(cur) + 10, 0) == cur, (seed, round_)
            for fd in fds.values():
                os.close(fd)
            fds = {}
            fs.power_cut(seed=seed)
            for n in names:
                assert (m / n).read_bytes() == durable[n], f"seed {seed}, round {round_}, {n}"
                current[n] = durable[n]
                fds[n] = os.open(m / n, os.O_RDWR)
    finally:
        for fd in fds.values():
            os.close(fd)


def test_bad_commands_are_refused_and_change_nothing(fs: LossyFS) -> None:
    write_file(fs.mountpoint / "f", b"x", sync="none")
    with pytest.raises(RuntimeError, match="unknown command"):
        fs._call({"cmd": "explode"})
    assert fs.status()["unsynced_files"] == 1
    assert (fs.mountpoint / "f").read_bytes() == b"x"
