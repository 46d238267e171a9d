"""Real etcd clients' transaction tests against a 3-member accord with ``--shards 8``.

aetcd's ``test_nested_transactions`` (plus its kv and txn scenarios) and python-etcd3's
transaction tests (tests/compat/etcd3_txn.py) run against a sharded cluster, where their
keys (``/doot/txn1`` and ``/doot/txn2``, ``/key1`` and ``/key2``, a range compare over
``/doot/``) lie on different shards, and, for reference, against a real etcd. Before
issue 21 the sharded cluster refused these Txns ("a Txn must stay within one shard").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.services.kv.sharding import shard_of
from tests.compat.servers import etcd_server
from tests.integration.cluster import ProcCluster

HERE = Path(__file__).resolve().parent
SHARDS = 8
AETCD_SCENARIOS = ["kv", "txn", "nested_txn"]


@pytest.fixture(scope="module", params=["accord", "etcd"])
def endpoint(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(kind, host:port)``: a sharded 3-member accord, or a real etcd."""
    if request.param == "etcd":
        with etcd_server(tmp_path_factory.mktemp("etcd-xshard")) as s:
            yield "etcd", s.endpoint
        return
    c = ProcCluster(tmp_path_factory.mktemp("xshard-clients"), 3,
                    extra=("--shards", str(SHARDS)))
    try:
        c.start_all()
        c.wait_published()
        yield "accord", c.nodes[0].endpoint
    finally:
        c.stop_all()


def test_the_suites_keys_really_span_shards() -> None:
    for a, b in ((b"/doot/txn1", b"/doot/txn2"), (b"/key1", b"/key2")):
        assert shard_of(a, SHARDS) != shard_of(b, SHARDS), (a, b)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_aetcd_nested_transactions_and_txns(endpoint: tuple[str, str]) -> None:
    kind, ep = endpoint
    host, port = ep.rsplit(":", 1)
    proc = _run([sys.executable, str(HERE / "aetcd_roundtrip.py"), host, port,
                 ",".join(AETCD_SCENARIOS)])
    log = f"on {kind}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ALL DONE"), log
    for name in AETCD_SCENARIOS:
        assert f'{{"scenario": "{name}", "ok": true}}' in proc.stdout, log


def test_etcd3_transaction_tests(endpoint: tuple[str, str]) -> None:
    kind, ep = endpoint
    host, port = ep.rsplit(":", 1)
    proc = _run([sys.executable, str(HERE / "etcd3_txn.py"), host, port],
                env={**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ALL OK"), (
        f"on {kind}:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    for name in ("test_transaction_success", "test_transaction_failure",
                 "test_nested_transactions", "test_transaction_range_conditions",
                 "test_replace_success", "test_replace_fail"):
        assert f"{name} ok" in proc.stdout
