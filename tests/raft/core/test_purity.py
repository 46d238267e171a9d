"""The Raft core stays a pure state machine: nothing in its folder touches a clock,
a socket, a thread or the disk, and it imports nothing of accord outside the core.

The I/O edges (storage, transport, host) live in sibling folders; this test checks
the folder, so a new core module is covered without being listed anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "accord" / "raft" / "core"
FORBIDDEN = {"asyncio", "socket", "time", "os", "threading", "selectors", "subprocess",
             "pathlib", "io", "shutil", "signal", "concurrent", "multiprocessing"}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, absolute names (relative ones resolved to the core)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module if node.level == 0 else f"accord.raft.core.{node.module}")
    return names


def _core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_the_core_imports_no_clock_socket_thread_or_disk() -> None:
    offenders = {}
    for path in _core_files():
        bad = {n for n in _imports(path) if n.split(".")[0] in FORBIDDEN}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_core_imports_nothing_of_accord_outside_itself() -> None:
    offenders = {}
    for path in _core_files():
        bad = {n for n in _imports(path)
               if n.split(".")[0] == "accord" and not n.startswith("accord.raft.core")}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_check_sees_real_imports() -> None:
    # guard against a vacuous pass: the files are there, and imports are seen
    names = {p.name for p in _core_files()}
    assert {"raft.py", "log.py", "progress.py", "quorum.py", "types.py"} <= names
    assert "accord.raft.core.log" in _imports(CORE / "raft.py")
    host = CORE.parent / "host" / "multiraft.py"
    assert "asyncio" in _imports(host)
