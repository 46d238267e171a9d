"""Real ``etcdctl`` against a real etcd and a real accord node, started the same way:
users, roles, prefix grants, ``auth enable``, then ``--user`` reads and writes allowed
and refused. Every step's exit status, output and error line must be the same on both
(as ``tests/compat/test_differential.py`` does for KV)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.etcdctl import TIMEOUT_S
from tests.compat.servers import etcd_server, require_binary
from tests.integration.cluster import ProcCluster

ALICE = ("--user", "alice:alice-pw-1")
ROOT = ("--user", "root:root-pw-1")

SCRIPT: list[tuple[str, ...]] = [
    ("user", "add", "root:root-pw-1"),
    ("role", "add", "app"),
    ("role", "grant-permission", "--prefix", "app", "readwrite", "/app/"),
    ("role", "grant-permission", "app", "read", "/pub"),
    ("role", "grant-permission", "app", "write", "/log/a", "/log/m"),
    ("user", "add", "alice:alice-pw-1"),
    ("user", "grant-role", "alice", "app"),
    ("auth", "enable"),  # refused: root has no root role yet
    ("user", "grant-role", "root", "root"),
    ("auth", "enable"),
    ("put", "/app/x", "1", *ALICE),
    ("get", "/app/x", *ALICE),
    ("get", "/app/", "--prefix", *ALICE),
    ("put", "/pub", "v", *ALICE),
    ("get", "/pub", *ALICE),
    ("put", "/log/b", "v", *ALICE),
    ("get", "/log/b", *ALICE),
    ("put", "/other", "1", *ALICE),
    ("get", "", "--from-key", *ALICE),
    ("get", "/app/x"),
    ("get", "/app/x", "--user", "alice:wrong"),
    ("get", "/app/x", "--user", "nobody:pw"),
    ("put", "/other", "2", *ROOT),
    ("get", "/other", *ROOT),
    ("txn", *ALICE),
    ("txn", "--user", "alice:alice-pw-1", "-i"),
    ("user", "list", *ALICE),
    ("user", "list", *ROOT),
    ("role", "list", *ROOT),
    ("role", "get", "app", *ROOT),
    ("role", "get", "app", *ALICE),
    ("user", "get", "alice", *ALICE),
    ("user", "get", "root", *ALICE),
    ("user", "add", "mallory:pw", *ALICE),
    ("user", "delete", "root", *ROOT),
    ("role", "delete", "root", *ROOT),
    ("user", "revoke-role", "root", "root", *ROOT),
    ("role", "revoke-permission", "app", "/app/", "--prefix", *ROOT),
    ("get", "/app/x", *ALICE),
    ("role", "revoke-permission", "app", "/nothing", *ROOT),
    ("user", "passwd", "alice", *ROOT),
    ("get", "/pub", *ALICE),
    ("get", "/pub", "--user", "alice:alice-pw-2"),
    ("get", "/app/x", "--user", "root:root-pw-1"),
    ("del", "/other", *ROOT),
    ("auth", "disable", *ALICE),
    ("auth", "disable", *ROOT),
    ("get", "/app/x"),
    ("user", "delete", "root"),
    ("auth", "enable"),
]
STDIN = {
    ("txn", *ALICE): 'mod("/app/x") > "0"\n\nput /app/y 2\n\nput /other 3\n\n',
    ("txn", "--user", "alice:alice-pw-1", "-i"): 'val("/app/x") = "1"\n\nput /app/x 2\n\nget /app/x\n\n',
    ("user", "passwd", "alice", *ROOT): "alice-pw-2\nalice-pw-2\n",
}


def run(endpoint: str, args: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """(exit status, stdout, the ``Error:`` lines of stderr) of one etcdctl call."""
    proc = subprocess.run(
        [require_binary("etcdctl"), f"--endpoints={endpoint}", "--command-timeout=10s", *args],
        input=STDIN.get(args), capture_output=True, text=True, timeout=TIMEOUT_S,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    return proc.returncode, proc.stdout, errors


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    root = tmp_path_factory.mktemp("auth-etcdctl")
    (root / "accord").mkdir()
    cluster = ProcCluster(root / "accord", 1)
    cluster.start_all()
    try:
        with etcd_server(root / "etcd") as etcd:
            yield etcd.endpoint, cluster.nodes[0].endpoint, cluster.nodes[0].log_path
    finally:
        cluster.stop_all()


def test_etcdctl_auth_session_matches_etcd(endpoints: tuple[str, str, Path]) -> None:
    etcd, accord, _ = endpoints
    differences = []
    for args in SCRIPT:
        want, got = run(etcd, args), run(accord, args)
        if want != got:
            differences.append(f"etcdctl {' '.join(args)}:\n  etcd:   {want}\n  accord: {got}")
    assert not differences, "\n".join(differences)


def test_passwords_stay_out_of_the_log(endpoints: tuple[str, str, Path]) -> None:
    *_, log_path = endpoints
    log = log_path.read_text(errors="replace")
    for secret in ("root-pw-1", "alice-pw-1", "alice-pw-2"):
        assert secret not in log
