"""The ``etcd3`` PyPI client against accord (and, for reference, real etcd), in a subprocess.

python-etcd3's generated code only works with the pure-python protobuf runtime, and its
descriptors (``rpc.proto`` in package ``etcdserverpb``) clash with accord's in one
process, so the client runs in a child interpreter (tests/compat/etcd3_roundtrip.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.compat.servers import Server

SCRIPT = Path(__file__).resolve().with_name("etcd3_roundtrip.py")


def test_etcd3_client_round_trips(server: Server) -> None:
    host, port = server.endpoint.rsplit(":", 1)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), host, port],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"},
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ALL OK"), (
        f"etcd3 client against {server.kind} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    )
