"""The ``aetcd`` PyPI client (asyncio) against accord (and, for reference, real etcd).

aetcd bundles its own generated ``rpc.proto`` in package ``etcdserverpb``; importing it
next to accord's generated code fails ("duplicate symbol"), so the client runs in a child
interpreter (tests/compat/aetcd_roundtrip.py), once per server, and each scenario it
reports becomes one test here. aetcd 1.0 needs grpcio>1.66,<2 and protobuf>4,<8, which
accord's own pins satisfy: no special protobuf runtime is needed (unlike etcd3).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.servers import Server, accord_server, etcd_server

SCRIPT = Path(__file__).resolve().with_name("aetcd_roundtrip.py")
SCENARIOS = ["kv", "txn", "nested_txn", "lease", "lease_expiry", "watch", "status", "compaction"]


@pytest.fixture(scope="module", params=["accord", "etcd"])
def aetcd_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, dict[str, object]], str]]:
    """Run every aetcd scenario once against a fresh server; yield (kind, verdicts, log)."""
    if request.param == "accord":
        ctx = accord_server()
    else:
        ctx = etcd_server(tmp_path_factory.mktemp("etcd-aetcd"))
    with ctx as server:
        yield server.kind, *_run_script(server)


def _run_script(server: Server) -> tuple[dict[str, dict[str, object]], str]:
    host, port = server.endpoint.rsplit(":", 1)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), host, port],
        capture_output=True,
        text=True,
        timeout=90,
    )
    log = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    verdicts: dict[str, dict[str, object]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            verdicts[str(rec["scenario"])] = rec
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ALL DONE"), log
    return verdicts, log


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_aetcd_scenario(
    aetcd_report: tuple[str, dict[str, dict[str, object]], str], scenario: str
) -> None:
    kind, verdicts, log = aetcd_report
    assert scenario in verdicts, f"aetcd scenario {scenario!r} never reported on {kind}:\n{log}"
    rec = verdicts[scenario]
    assert rec["ok"] is True, f"aetcd scenario {scenario!r} failed on {kind}:\n{rec.get('error')}"


def test_aetcd_reports_exactly_the_listed_scenarios(
    aetcd_report: tuple[str, dict[str, dict[str, object]], str],
) -> None:
    """No scenario of the script goes unchecked here, and none listed here is missing there."""
    kind, verdicts, log = aetcd_report
    assert sorted(verdicts) == sorted(SCENARIOS), f"on {kind}:\n{log}"
