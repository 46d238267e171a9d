"""``etcdctl make-mirror`` both ways between accord and a real etcd: a real client that
combines a Range snapshot with a Watch resumed from its revision (ETCD_COMPAT.md lists
it as KV.Range 2, KV.Put 1, Watch 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.etcdctl import etcdctl
from tests.compat.servers import Server, accord_server, etcd_server, require_binary


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    with etcd_server(Path(tmp_path_factory.mktemp("etcd-mirror"))) as etcd, accord_server() as acc:
        yield acc, etcd


def _mirror(source: Server, dest: Server, prefix: str) -> None:
    etcdctl(source.endpoint, "put", f"{prefix}before", "1")
    proc = subprocess.Popen(
        [require_binary("etcdctl"), f"--endpoints={source.endpoint}", "make-mirror",
         f"--prefix={prefix}", dest.endpoint],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ETCDCTL_API": "3"},
    )  # fmt: skip
    try:
        time.sleep(0.5)
        etcdctl(source.endpoint, "put", f"{prefix}during", "2")
        etcdctl(source.endpoint, "del", f"{prefix}before")
        deadline = time.monotonic() + 15
        got: list[str] = []
        while time.monotonic() < deadline:
            got = etcdctl(dest.endpoint, "get", prefix, "--prefix").split()
            if got == [f"{prefix}during", "2"]:
                break
            time.sleep(0.2)
        assert got == [f"{prefix}during", "2"], f"{source.kind} -> {dest.kind}: {got}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)


def test_mirror_accord_to_etcd(both: tuple[Server, Server]) -> None:
    accord, etcd = both
    _mirror(accord, etcd, "/m1/")


def test_mirror_etcd_to_accord(both: tuple[Server, Server]) -> None:
    accord, etcd = both
    _mirror(etcd, accord, "/m2/")
