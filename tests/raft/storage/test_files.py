"""Small files the node keeps outside the WAL survive a power cut whole (lossyfs).

``replace_durably`` (and what uses it: certificates the node writes, a member's identity,
the data directory's shard count) must leave the new content after a cut, and a
replacement never half-done. The broken variant — rename without fsyncing the
directory, as the certificate writer and the identity file did before — loses the
new file on the same cut, which is what these tests catch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.node import certs
from accord.raft.storage.files import fsync_dir, replace_durably
from accord.services.kv import local
from tests.tools.lossyfs.control import LossyFS


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LossyFS]:
    with LossyFS(tmp_path / "disk", tmp_path / "mnt") as fs:
        yield fs


def _rename_only(path: Path, data: bytes) -> None:
    """The broken variant: file fsynced, renamed, directory not fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@pytest.mark.parametrize("torn", [False, True])
def test_a_durable_replacement_survives_a_cut_whole(disk: LossyFS, torn: bool) -> None:
    path = disk.mountpoint / "state"
    replace_durably(path, b"old")
    replace_durably(path, b"new content " * 100)
    disk.power_cut(seed=7, torn=torn)
    assert path.read_bytes() == b"new content " * 100
    assert not path.with_name("state.tmp").exists()


def test_a_rename_without_the_directory_fsync_is_lost(disk: LossyFS) -> None:
    path = disk.mountpoint / "state"
    _rename_only(path, b"first")
    disk.power_cut(seed=1)
    assert not path.exists()  # what the tests above would catch in a broken writer


def test_a_private_key_is_never_readable_by_others(tmp_path: Path) -> None:
    key = certs.write_pem(tmp_path / "k.pem", b"-----BEGIN PRIVATE KEY-----\n", private=True)
    assert key.stat().st_mode & 0o077 == 0
    assert key.read_bytes().startswith(b"-----BEGIN")


def test_certificates_and_a_members_identity_survive_a_cut(disk: LossyFS) -> None:
    d = disk.mountpoint / "data"
    d.mkdir()
    fsync_dir(disk.mountpoint)  # the directory itself is kept once its parent is synced
    pem = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    certs.write_pem(d / "ca.pem", pem)
    ids = local._identity(d)
    disk.power_cut(seed=3)
    assert (d / "ca.pem").read_bytes() == pem
    stored = json.loads((d / local.MEMBER_NAME).read_text())
    assert (stored["cluster_id"], stored["member_id"]) == ids
    assert local._identity(d) == ids  # the same member after the cut, not a new one
