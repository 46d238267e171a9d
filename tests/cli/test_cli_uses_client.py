"""The `accord` command talks to the cluster only through ``accord.client``.

No module under ``accord/cli/`` may import gRPC, a generated ``*_pb2_grpc`` stub module
or the client's channel plumbing (``accord.client.transport``, ``accord.client.stubs``,
the channel makers of ``accord.client.tls``), nor name a channel maker or a ``*Stub``
class: a command that needs a call the client lacks gets it added to the client (typed
results, the client's errors, deadlines and retry policy) instead of dialing on its own.
Message modules (``*_pb2``) stay allowed: ``--json`` prints the wire messages and
``nodes register`` reads a ``NodeSpec``.
"""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "accord" / "cli"

FORBIDDEN_MODULES = ("grpc", "accord.client.transport", "accord.client.stubs")
"""Modules (and their submodules) a CLI module may not import."""
CHANNEL_MAKERS = frozenset({"insecure_channel", "secure_channel", "aio_channel",
                            "sync_channel", "intercept_channel", "unary_unary",
                            "unary_stream", "stream_unary", "stream_stream"})
"""Names that open a channel or a raw method on one."""


def _forbidden_module(name: str) -> bool:
    return (name.rsplit(".", 1)[-1].endswith("_pb2_grpc")
            or any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES))


def violations(source: str, filename: str = "<cli>") -> list[str]:
    """What in ``source`` dials the cluster without the client, one line per finding."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            out += [f"{where}: imports {a.name}" for a in node.names if _forbidden_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _forbidden_module(node.module):
                out.append(f"{where}: imports from {node.module}")
                continue
            out += [f"{where}: imports {node.module}.{a.name}" for a in node.names
                    if _forbidden_module(f"{node.module}.{a.name}") or a.name in CHANNEL_MAKERS]
        name = (node.id if isinstance(node, ast.Name)
                else node.attr if isinstance(node, ast.Attribute) else None)
        if name is not None and (name in CHANNEL_MAKERS or name.endswith("Stub")):
            out.append(f"{where}: uses {name}")
    return out


def test_no_cli_module_dials_the_cluster_itself() -> None:
    files = sorted(CLI.rglob("*.py"))
    assert {"jobs.py", "nodes.py", "logs.py", "snapshot.py", "ckpt.py", "kv.py"} <= {
        f.name for f in files}
    found = [v for f in files for v in violations(f.read_text(), str(f.relative_to(CLI.parent)))]
    assert found == [], "\n".join(found)


def test_the_check_catches_every_way_of_dialing() -> None:
    cases = {
        "import grpc": 1,
        "import grpc.aio": 1,
        "from grpc import aio": 1,
        "from accord.proto import scheduling_pb2_grpc": 1,
        "import accord.proto.rpc_pb2_grpc as r": 1,
        "from accord.client.tls import sync_channel": 1,
        "from accord.client.transport import EndpointPool": 1,
        "from accord.client import stubs": 1,
        "x = make.aio_channel('h:1', None)": 1,
        "s = mod.SchedulerStub(ch)": 1,
        "ch.unary_stream('/accord.agent.v1.Agent/ReadLog')": 1,
    }
    for source, n in cases.items():
        assert len(violations(source)) == n, (source, violations(source))
    clean = ("from accord.proto import scheduling_pb2 as pb\n"
             "from accord.client.sync import SyncClient\n"
             "from accord.client.tls import TLSOptions\n"
             "c = SyncClient(['127.0.0.1:2379'])\n")
    assert violations(clean) == []
