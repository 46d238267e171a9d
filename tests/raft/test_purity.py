"""The Raft core stays a pure state machine: only the I/O edges may touch clocks, sockets, disks."""

from __future__ import annotations

import ast
from pathlib import Path

RAFT = Path(__file__).resolve().parents[2] / "accord" / "raft"
FORBIDDEN = {"asyncio", "socket", "time", "os", "threading", "selectors", "random.SystemRandom"}
IO_EDGES = {
    "wal.py", "wal_threads.py", "storage_codec.py", "snapshot.py", "walcheck.py",  # storage
    "transport.py", "framing.py", "snapstream.py",  # transport
    "host.py", "hostgroup.py", "hostapply.py", "hostpropose.py",  # the Multi-Raft host
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_io_edges_import_clocks_sockets_or_the_os() -> None:
    offenders = {}
    for path in sorted(RAFT.rglob("*.py")):
        if path.name in IO_EDGES:
            continue
        bad = _imports(path) & FORBIDDEN
        if bad:
            offenders[str(path.relative_to(RAFT))] = sorted(bad)
    assert offenders == {}


def test_the_check_sees_real_imports() -> None:
    # guard against a vacuous pass: the host really does import asyncio
    assert "asyncio" in _imports(RAFT / "host.py")
    assert "accord" in _imports(RAFT / "core.py")
