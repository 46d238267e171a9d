"""A node's data directory and its first files survive a power cut right after the first
start (on lossyfs: only what was fsynced, and named by a fsynced directory, survives)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.node.server import (
    _read_member_file,
    check_shard_count,
    make_dir_durably,
    write_member_file,
)
from tests.tools.lossyfs.control import LossyFS


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LossyFS]:
    with LossyFS(tmp_path / "disk", tmp_path / "mnt") as fs:
        yield fs


def test_a_new_data_directory_and_its_member_files_survive_a_power_cut(disk: LossyFS) -> None:
    data = disk.mountpoint / "var" / "lib" / "accord"
    make_dir_durably(data)
    check_shard_count(data, 8)
    write_member_file(data, 0x1234, False)
    report = disk.power_cut()
    assert report["vanished"] == [], report
    assert _read_member_file(data) == (0x1234, False)
    assert check_shard_count(data, 8) == 8


def test_an_existing_data_directory_is_left_as_it_is(disk: LossyFS) -> None:
    data = disk.mountpoint / "d"
    data.mkdir()
    (data / "keep").write_bytes(b"x")
    make_dir_durably(data)  # nothing to create: nothing changes, nothing is synced
    assert disk.status()["dirty_dirs"] == 2
