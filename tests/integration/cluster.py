"""A real accord cluster for tests: `accord serve` subprocesses on 127.0.0.1.

Each node is started by PID and ended by PID (SIGTERM, then SIGKILL); the tests
pause (SIGSTOP), resume (SIGCONT), kill -9 and restart them. Clients are the
etcd v3 gRPC stubs generated from accord's own protos.

``ProcCluster(..., tls=ClusterTLS.make(folder, names))`` runs every port under mutual
TLS with etcd's flags (``https://`` URLs, one certificate per node from one CA); the
helpers' channels then present the client certificate. ``tls.certs[name]`` may be
replaced before a node starts (a node with another CA's certificate).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from accord.client.tls import TLSOptions, sync_channel
from accord.node.certs import CertFiles, CertificateAuthority, make_cluster_pki
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.testing import HOST, free_port_blocks, free_ports

DEFAULT_WORKERS = int(os.environ.get("ACCORD_TEST_WORKERS", "1"))
"""``--workers`` of the clusters a test does not give a count: 1 (a node of one process)
unless ``ACCORD_TEST_WORKERS`` says otherwise, so that the integration tests can be run
on nodes of several workers as a whole (``docs/workers.md``, step 4)."""


@dataclass
class ClusterTLS:
    """Certificates for a cluster under mutual TLS (see the module docstring)."""

    ca: CertificateAuthority
    certs: dict[str, CertFiles]
    client: CertFiles
    folder: Path
    client_cert_auth: bool = True
    """False: clients need no certificate (the client port trusts no CA)."""

    @classmethod
    def make(cls, folder: Path, names: list[str], *, client_cert_auth: bool = True) -> ClusterTLS:
        ca, files = make_cluster_pki(folder, names)
        client = files.pop("client")
        return cls(ca, files, client, folder, client_cert_auth)

    @property
    def client_options(self) -> TLSOptions:
        return TLSOptions(cacert=str(self.client.ca), cert=str(self.client.cert),
                          key=str(self.client.key))

    def etcdctl_flags(self) -> list[str]:
        """etcdctl's ``--cacert --cert --key`` for the client certificate."""
        c = self.client
        return [f"--cacert={c.ca}", f"--cert={c.cert}", f"--key={c.key}"]

    def serve_flags(self, name: str) -> list[str]:
        """etcd's TLS flags for member ``name``: its certificate both ways, certificates
        required of clients and peers."""
        f = self.certs[name]
        client_auth = ["--trusted-ca-file", str(f.ca), "--client-cert-auth"]
        return ["--cert-file", str(f.cert), "--key-file", str(f.key),
                *(client_auth if self.client_cert_auth else ()),
                "--peer-cert-file", str(f.cert), "--peer-key-file", str(f.key),
                "--peer-trusted-ca-file", str(f.ca), "--peer-client-cert-auth"]


@dataclass
class ProcNode:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    gossip_port: int = 0
    """SWIM membership's UDP+TCP port (``--gossip-listen``)."""
    tls: TLSOptions | None = None
    """The client certificate the helpers dial this node with (a TLS cluster)."""
    metrics_port: int = 0
    """The HTTP port of /metrics and the health endpoints (``--listen-metrics-urls``)."""
    _channel: grpc.Channel | None = field(default=None, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.peer_port}"

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = sync_channel(self.client_url, self.tls)
        return self._channel

    def kv(self) -> rpc_pb2_grpc.KVStub:
        return rpc_pb2_grpc.KVStub(self.channel())

    def maintenance(self) -> rpc_pb2_grpc.MaintenanceStub:
        return rpc_pb2_grpc.MaintenanceStub(self.channel())

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class ProcCluster:
    """N `accord serve` processes forming one cluster."""

    def __init__(self, root: Path, n: int = 3, *, heartbeat_ms: int = 50,
                 election_ms: int = 500, extra: tuple[str, ...] = (),
                 tls: ClusterTLS | None = None, workers: int | None = None) -> None:
        if workers is None:  # the suite's default kind of node (one process unless asked)
            shards = int(extra[extra.index("--shards") + 1]) if "--shards" in extra else 8
            workers = min(DEFAULT_WORKERS, shards)
        ports = free_ports(4 * n)
        if workers > 1:
            # Worker k of a node listens on its peer port + k: a free block per node.
            peers = free_port_blocks(n, workers, avoid=ports)
            ports[1:2 * n:2] = peers
        self.workers = workers
        """``--workers`` of every member (docs/workers.md; 1: one process per node)."""
        self.tls = tls
        client_tls = tls.client_options if tls is not None else None
        self.nodes = [
            ProcNode(f"n{i + 1}", ports[2 * i], ports[2 * i + 1], root / f"n{i + 1}",
                     root / f"n{i + 1}.log", gossip_port=ports[2 * n + i], tls=client_tls,
                     metrics_port=ports[3 * n + i])
            for i in range(n)
        ]
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.extra = extra
        self.initial = ",".join(f"{x.name}={x.peer_url}" for x in self.nodes)
        self.initial_for: dict[str, str] = {}
        """Per-node ``--initial-cluster`` overrides (peer URLs through proxies)."""

    @property
    def endpoints(self) -> str:
        """Every node's client endpoint, comma-separated (for ``--endpoints``)."""
        return ",".join(n.client_url if self.tls else n.endpoint for n in self.nodes)

    def new_node(self, name: str) -> ProcNode:
        """A node for a member added at runtime (start it with ``start(node, existing=True)``)."""
        client, peer, gossip, metrics = ports = free_ports(4)
        if self.workers > 1:  # worker k listens on the peer port + k: a free block
            peer = free_port_blocks(1, self.workers, avoid=ports)[0]
        root = self.nodes[0].data_dir.parent
        node = ProcNode(name, client, peer, root / name, root / f"{name}.log", gossip_port=gossip,
                        tls=self.tls.client_options if self.tls is not None else None,
                        metrics_port=metrics)
        self.nodes.append(node)
        return node

    def start(self, node: ProcNode, *, existing: bool = False,
              initial_cluster: str | None = None) -> None:
        """Start ``node``; ``existing`` joins a running cluster (after MemberAdd) with
        ``initial_cluster`` (the members it can reach, itself included)."""
        join = ("--initial-cluster-state", "existing") if existing else ()
        args = [
            sys.executable, "-m", "accord", "serve",
            "--name", node.name, "--data-dir", str(node.data_dir),
            "--listen-client-urls", node.client_url,
            "--listen-peer-urls", node.peer_url,
            "--initial-cluster", initial_cluster or self.initial_for.get(node.name, self.initial),
            *join,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--gossip-listen", f"{HOST}:{node.gossip_port}",
            "--gossip-seeds", ",".join(f"{HOST}:{x.gossip_port}" for x in self.nodes if x is not node),
            *(self.tls.serve_flags(node.name) if self.tls is not None else ()),
            "--listen-metrics-urls", f"http://{HOST}:{node.metrics_port}",
            *(("--workers", str(self.workers)) if self.workers > 1 else ()),
            *self.extra,
        ]
        log = open(node.log_path, "ab")
        node.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        node.paused = False

    def start_all(self) -> None:
        for node in self.nodes:
            self.start(node)
        for node in self.nodes:
            self.wait_serving(node)
        self.wait_published()

    def wait_published(self, timeout: float = 60.0) -> None:
        """Wait until every member has published its client URLs (through the meta group).

        A member that exits meanwhile fails the wait at once with its log; a timeout
        (a start on a machine busy enough to delay the meta group's first elections)
        says what the members last answered and ends with every member's log."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while time.monotonic() < deadline:
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise AssertionError(f"{n.name} exited with {n.proc.returncode} before the "
                                         f"members published; log:\n{self.log(n)}")
                if n.proc is None or n.paused:
                    continue
                try:
                    members = rpc_pb2_grpc.ClusterStub(n.channel()).MemberList(
                        rpc_pb2.MemberListRequest(), timeout=1.0).members
                except grpc.RpcError as e:
                    last[n.name] = f"{e.code().name}: {e.details()}"
                    continue
                if len(members) == len(self.nodes) and all(m.clientURLs for m in members):
                    return
                last[n.name] = ", ".join(f"{m.name or m.ID}={list(m.clientURLs)}" for m in members)
            time.sleep(0.05)
        logs = "\n".join(f"--- {n.name}:\n{self.log(n)[-1500:]}" for n in self.nodes)
        raise AssertionError(f"members did not publish their client URLs within {timeout}s; "
                             f"last answers: {last}\n{logs}")

    def wait_serving(self, node: ProcNode, timeout: float = 30.0) -> None:
        timeout *= self.workers  # as many processes to start on the same cores
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert node.proc is not None
            if node.proc.poll() is not None:
                raise AssertionError(f"{node.name} exited with {node.proc.returncode}; "
                                     f"log:\n{self.log(node)}")
            with contextlib.suppress(OSError), socket.create_connection((HOST, node.client_port), 0.2):
                if self._every_worker_serves(node):
                    return
            time.sleep(0.05)
        raise AssertionError(f"{node.name} did not serve within {timeout}s; log:\n{self.log(node)}")

    def _every_worker_serves(self, node: ProcNode) -> bool:
        """With ``--workers``: every worker of the node's latest start says it serves
        (the port answers as soon as the first one listens)."""
        if self.workers == 1:
            return True
        text = node.log_path.read_text(errors="replace")
        latest = text[text.rfind("supervising"):]
        return all(f"worker {k} of {self.workers} " in latest and "serving clients" in latest
                   for k in range(self.workers))

    def worker_pids(self, node: ProcNode) -> dict[int, int]:
        """Worker index -> pid of ``node``'s live worker processes (``--workers`` > 1):
        the supervisor's children, by the index in their environment."""
        assert node.proc is not None
        out: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) != node.proc.pid:
                    continue
                env = (entry / "environ").read_bytes().split(b"\0")
                for var in env:
                    if var.startswith(b"ACCORD_WORKER_INDEX="):
                        out[int(var.split(b"=", 1)[1])] = int(entry.name)
        return out

    def log(self, node: ProcNode) -> str:
        try:
            return node.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def signal(self, node: ProcNode, sig: signal.Signals) -> None:
        """Signal ``node``: its process, and with ``--workers`` its worker processes too
        (a paused node is all of them paused)."""
        assert node.proc is not None
        workers = self.worker_pids(node) if self.workers > 1 else {}
        os.kill(node.proc.pid, sig)
        for pid in workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            node.paused = True
        elif sig == signal.SIGCONT:
            node.paused = False

    def kill(self, node: ProcNode, *, keep_channel: bool = False) -> None:
        """kill -9 and reap; ``keep_channel`` leaves the node's client channel open for
        threads still using it (it reconnects once the node is back)."""
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(10)
        if not keep_channel:
            node.close_channel()

    def stop(self, node: ProcNode, timeout: float = 10.0) -> int | None:
        """SIGTERM (graceful), SIGKILL after ``timeout``; returns the exit status."""
        if node.proc is None or node.proc.poll() is not None:
            return node.proc.returncode if node.proc else None
        if node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
        os.kill(node.proc.pid, signal.SIGTERM)
        try:
            return node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(10)
            return None
        finally:
            node.close_channel()

    def stop_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.stop(node)

    def __enter__(self) -> ProcCluster:
        """Start every member (``start_all``); the ``with`` block's end stops them all,
        as does a failed start."""
        try:
            self.start_all()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    # --- client helpers --------------------------------------------------------------
    def status(self, node: ProcNode, timeout: float = 1.0) -> rpc_pb2.StatusResponse:
        return node.maintenance().Status(rpc_pb2.StatusRequest(), timeout=timeout)

    def leader(self, among: list[ProcNode] | None = None, timeout: float = 20.0) -> ProcNode:
        """The node that every live node in ``among`` agrees leads the KV group."""
        nodes = among or [n for n in self.nodes if n.proc and n.proc.poll() is None and not n.paused]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = set()
            for n in nodes:
                with contextlib.suppress(grpc.RpcError):
                    seen.add(self.status(n, 0.5).leader)
            if len(seen) == 1 and 0 not in seen:
                (lid,) = seen
                for n in nodes:
                    with contextlib.suppress(grpc.RpcError):
                        if self.status(n, 0.5).header.member_id == lid:
                            return n
            time.sleep(0.05)
        raise AssertionError(f"no agreed leader among {[n.name for n in nodes]} in {timeout}s")

    def put(self, key: bytes, value: bytes, via: list[ProcNode] | None = None,
            timeout: float = 30.0) -> int:
        """Put through any live node, retrying transient errors; returns the revision."""
        nodes = via or [n for n in self.nodes if n.proc and n.proc.poll() is None and not n.paused]
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        i = 0
        while time.monotonic() < deadline:
            n = nodes[i % len(nodes)]
            i += 1
            try:
                r = n.kv().Put(rpc_pb2.PutRequest(key=key, value=value), timeout=2.0)
                return int(r.header.revision)
            except grpc.RpcError as e:
                last = e
                time.sleep(0.05)
        raise AssertionError(f"put {key!r} failed for {timeout}s: {last}")

    def get(self, node: ProcNode, key: bytes, *, serializable: bool = False,
            timeout: float = 5.0) -> bytes | None:
        r = node.kv().Range(rpc_pb2.RangeRequest(key=key, serializable=serializable),
                            timeout=timeout)
        return r.kvs[0].value if r.kvs else None
