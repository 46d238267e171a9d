"""A real Prometheus server scrapes a 3-node cluster of real daemons.

The test writes a Prometheus config listing the three metrics listeners, starts Debian's
``prometheus`` on 127.0.0.1 with a 1 s scrape interval, and asks its HTTP API: every
node is up, etcd's series are there under their names, and killing the leader of KV
shard 0 shows up as a rise of ``etcd_server_leader_changes_seen_total`` on the
survivors. The shipped alert rules are loaded too (so a rule file Prometheus refuses
fails here), and ``promtool`` checks them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import HOST, ProcCluster, free_ports

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "ops" / "prometheus-alerts.yml"
DASHBOARD = ROOT / "docs" / "ops" / "grafana-dashboard.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Debian's prometheus package is not installed (scripts/test installs it as root)")


class Prometheus:
    """One ``prometheus`` process on 127.0.0.1 scraping ``targets`` every second."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        (self.port,) = free_ports(1)
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        rules = root / "rules.yml"
        shutil.copy(RULES, rules)
        (root / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n  - job_name: accord\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        self.log = root / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert PROMETHEUS is not None
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.root / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.root / 'data'}",
                 f"--web.listen-address={HOST}:{self.port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def api(self, path: str, **params: str) -> object:
        url = f"http://{HOST}:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[str, float]:
        """``expr`` now, as {instance: value}."""
        data = self.api("query", query=expr)
        assert isinstance(data, dict)
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in data["result"]}

    def wait(self, what: str, check: object, timeout: float = 60.0) -> object:
        """Poll ``check()`` until it returns something truthy."""
        assert callable(check)
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, OSError):
                last = check()
                if last:
                    return last
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout}s (last: {last!r}); "
                             f"prometheus log: {self.log.read_text()[-2000:]}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcCluster]:
    (tmp_path / "cluster").mkdir()
    c = ProcCluster(tmp_path / "cluster", 3)
    c.start_all()
    try:
        yield c
    finally:
        c.stop_all()


@needs_prometheus
def test_promtool_accepts_the_shipped_alert_rules() -> None:
    assert PROMTOOL is not None
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    for name in ("AccordNoLeader", "AccordHighFsyncDurations", "AccordApplyLagging",
                 "AccordDatabaseQuotaNearlyFull", "AccordClockDisagrees"):
        assert name in RULES.read_text()


def test_the_dashboard_queries_series_the_nodes_export() -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs
    for needed in ("etcd_server_has_leader", "etcd_disk_wal_fsync_duration_seconds_bucket",
                   "grpc_server_handled_total", "accord_raft_apply_lag_entries"):
        assert any(needed in e for e in exprs), needed


@needs_prometheus
def test_prometheus_scrapes_the_cluster_and_sees_a_leader_kill(
        cluster: ProcCluster, tmp_path: Path) -> None:
    targets = [f"{HOST}:{n.metrics_port}" for n in cluster.nodes]
    prom = Prometheus(tmp_path / "prometheus", targets)
    prom.start()
    try:
        up = prom.wait("every node scraped",
                       lambda: (lambda r: r if len(r) == 3 and all(r.values()) else None)(
                           prom.query("up")))
        assert set(up) == set(targets)  # type: ignore[arg-type]
        for i in range(5):
            cluster.put(f"/prom/k{i}".encode(), b"v")
        for series in ("etcd_server_has_leader", "etcd_server_proposals_committed_total",
                       "etcd_server_proposals_applied_total", "etcd_server_proposals_pending",
                       "etcd_server_proposals_failed_total",
                       "etcd_disk_wal_fsync_duration_seconds_bucket",
                       "etcd_mvcc_db_total_size_in_bytes", "etcd_debugging_mvcc_keys_total",
                       "accord_raft_apply_lag_entries", "accord_swim_members"):
            prom.wait(f"{series} from every node",
                      lambda s=series: len(prom.query(s)) >= 3)
        prom.wait("a leader everywhere",
                  lambda: (lambda r: len(r) == 3 and all(v == 1 for v in r.values()))(
                      prom.query("etcd_server_has_leader")))
        puts = prom.wait("the puts in grpc_server_handled_total", lambda: sum(prom.query(
            'grpc_server_handled_total{grpc_method="Put",grpc_code="OK"}').values()) >= 5)
        assert puts
        # The API lists the series by name, as dashboards find them.
        names = prom.api("label/__name__/values")
        assert isinstance(names, list)
        for n in ("etcd_network_peer_round_trip_time_seconds_bucket", "grpc_server_handling_seconds_bucket",
                  "etcd_server_leader_changes_seen_total", "accord_raft_groups"):
            assert n in names, n

        leader = cluster.leader()
        survivors = [n for n in cluster.nodes if n is not leader]
        survivor_targets = {f"{HOST}:{n.metrics_port}" for n in survivors}
        before = {k: v for k, v in prom.query("etcd_server_leader_changes_seen_total").items()
                  if k in survivor_targets}
        assert len(before) == 2
        cluster.kill(leader)
        cluster.leader(among=survivors)
        cluster.put(b"/prom/after", b"v", via=survivors)

        def risen() -> bool:
            now = prom.query("etcd_server_leader_changes_seen_total")
            return all(now.get(t, 0) > before[t] for t in survivor_targets)

        prom.wait("the leader kill in etcd_server_leader_changes_seen_total", risen)
        prom.wait("the dead node reported down",
                  lambda: prom.query(f'up{{instance="{HOST}:{leader.metrics_port}"}}')
                  .get(f"{HOST}:{leader.metrics_port}") == 0)
        rules = prom.api("rules")
        assert isinstance(rules, dict)
        loaded = {r["name"] for g in rules["groups"] for r in g["rules"]}
        assert "AccordNoLeader" in loaded
    finally:
        prom.stop()
