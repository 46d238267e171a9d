"""``python -m accord.node.grpc_server`` as a process: ready line, SIGTERM, --data-dir restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.compat.etcdctl import etcdctl, etcdctl_json
from tests.compat.servers import REPO, accord_server


def test_data_dir_survives_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with accord_server(data) as first:
        etcdctl(first.endpoint, "put", "/persist/k", "kept")
        lease = etcdctl(first.endpoint, "lease", "grant", "600").split()[1]
        rev = etcdctl_json(first.endpoint, "put", "/persist/l", "x", f"--lease={lease}")
        member = etcdctl_json(first.endpoint, "member", "list")["members"][0]["ID"]
    assert first.proc.returncode == 0  # SIGTERM is a clean shutdown
    with accord_server(data) as second:
        ep = second.endpoint
        assert etcdctl(ep, "get", "/persist/k", "--print-value-only").strip() == "kept"
        got = etcdctl_json(ep, "get", "/persist/l")
        assert got["header"]["revision"] == rev["header"]["revision"]
        assert etcdctl_json(ep, "member", "list")["members"][0]["ID"] == member
        assert lease in etcdctl(ep, "lease", "list")


def test_bad_listen_addresses_are_clear_errors() -> None:
    def run(listen: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "accord.node.grpc_server", "--listen", listen],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "GRPC_VERBOSITY": "NONE"},
        )

    bad = run("no-port")
    assert bad.returncode == 2 and "--listen must be HOST:PORT" in bad.stderr
    with accord_server() as running:
        taken = run(running.endpoint)
        assert taken.returncode == 1
        assert f"cannot listen on {running.endpoint}: address in use" in taken.stderr
