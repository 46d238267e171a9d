"""Clusters for benchmarks: a real 3-member etcd, a 3-node accord, and a do-nothing server.

Every process runs on free 127.0.0.1 ports with its data under one temporary
directory; every process is started and ended by PID (SIGTERM, then SIGKILL), and
:class:`Harness` ends whatever is still alive when its ``with`` block exits, even on
error or Ctrl-C. etcd runs with its defaults (fsync on every commit); both clusters
take the same ``--heartbeat-interval`` and ``--election-timeout``. ``tls=True`` runs a
cluster under mutual TLS with etcd's flags (``https://`` client and peer URLs, a fresh
CA and one certificate per member, client certificates required): accord and etcd get
the same settings, so their TLS figures compare.

Used by ``bench/kv.py``, ``bench/failover.py``, ``bench/idle.py`` and ``bench/shards.py``.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accord.client.tls import TLSOptions, sync_channel  # noqa: E402
from accord.node.certs import CertFiles, make_cluster_pki  # noqa: E402
from accord.node.config import METRICS_PORT_OFFSET  # noqa: E402
from accord.proto import auth_pb2, rpc_pb2  # noqa: E402
from accord.proto import rpc_pb2_grpc as _rpc_grpc  # noqa: E402
from accord.testing import free_port_blocks  # noqa: E402

rpc_pb2_grpc: Any = _rpc_grpc  # generated stubs are untyped

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1
ETCD_BIN = shutil.which("etcd") or "/usr/bin/etcd"


def free_ports(n: int) -> list[int]:
    """``n`` distinct 127.0.0.1 ports that were free a moment ago."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS of /proc/PID/status), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for pid {pid}")


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds consumed so far by ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields_ = data[data.rindex(")") + 2:].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields_[11]) / tick, int(fields_[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU time consumed so far by ``pid`` (all its threads)."""
    user, system = cpu_times(pid)
    return user + system


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from ``/proc``)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    data = f.read()
                if int(data[data.rindex(")") + 2:].split()[1]) == pid:
                    out.append(int(entry))
    return out


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the benchmark process dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Member:
    """One server process: its ports, its data and log, its command line, its PID."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    argv: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    certs: CertFiles | None = None
    """This member's certificate when its cluster runs under TLS."""
    tls: TLSOptions | None = None
    """The client certificate to dial it with (a TLS cluster)."""

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def scheme(self) -> str:
        return "http" if self.certs is None else "https"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.peer_port}"

    def channel(self) -> grpc.Channel:
        """A blocking channel to this member (TLS when its cluster is)."""
        return sync_channel(self.client_url, self.tls)

    def tls_flags(self) -> list[str]:
        """etcd's flags for mutual TLS on both kinds of traffic (none without TLS)."""
        if self.certs is None:
            return []
        cert, key, ca = str(self.certs.cert), str(self.certs.key), str(self.certs.ca)
        return ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca,
                "--client-cert-auth", "--peer-cert-file", cert, "--peer-key-file", key,
                "--peer-trusted-ca-file", ca, "--peer-client-cert-auth"]

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # the child owns it from here
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()

    def kill9(self) -> None:
        """kill -9 by PID and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM by PID, SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Until the client port accepts a TCP connection."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited; log:\n{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.client_port), 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not serve in {timeout}s; log:\n{self.log_tail()}")


def status(endpoint: str, timeout: float = 1.0,
           tls: TLSOptions | None = None) -> rpc_pb2.StatusResponse:
    """Maintenance.Status of one member (``https://`` with ``tls``)."""
    with sync_channel(f"https://{endpoint}" if tls else endpoint, tls) as ch:
        resp: rpc_pb2.StatusResponse = rpc_pb2_grpc.MaintenanceStub(ch).Status(
            rpc_pb2.StatusRequest(), timeout=timeout)
        return resp


class Cluster(abc.ABC):
    """N members of one system (``kind``: "etcd", "accord" or "null")."""

    kind = "?"

    def __init__(self, root: Path, n: int, *, tls: bool = False) -> None:
        self.root = root
        label = f"{self.kind}-tls" if tls else self.kind  # a TLS cluster beside a plain one
        ports = free_ports(2 * n)
        self.members = [
            Member(f"{label}{i + 1}", ports[2 * i], ports[2 * i + 1],
                   root / f"{label}{i + 1}", root / f"{label}{i + 1}.log")
            for i in range(n)
        ]
        self.client_tls: TLSOptions | None = None
        """The client certificate for a TLS cluster (None: plaintext)."""
        if tls:
            _, files = make_cluster_pki(root / f"{label}-certs", [m.name for m in self.members])
            c = files["client"]
            self.client_tls = TLSOptions(cacert=str(c.ca), cert=str(c.cert), key=str(c.key))
            for m in self.members:
                m.certs, m.tls = files[m.name], self.client_tls
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.argv = self.argv(m)

    @abc.abstractmethod
    def argv(self, m: Member) -> list[str]:
        """The command line that starts member ``m``."""

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def pids(self) -> list[int]:
        """Every live member's process and its children (a node of several workers is a
        supervisor and its worker processes): what the CPU figures and pinning cover."""
        pids = [m.pid for m in self.members if m.alive()]
        return pids + [c for p in pids for c in children(p)]

    def start(self, timeout: float = 60.0) -> None:
        for m in self.members:
            m.start()
        for m in self.members:
            m.wait_serving(timeout)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until a put succeeds (a leader exists and commits)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for m in self.members:
                if not m.alive():
                    continue
                try:
                    with m.channel() as ch:
                        rpc_pb2_grpc.KVStub(ch).Put(
                            rpc_pb2.PutRequest(key=b"__bench_ready", value=b"1"), timeout=2.0)
                    return
                except grpc.RpcError as e:
                    last = e
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} cluster not ready in {timeout}s: {last}")

    def leader(self, timeout: float = 30.0) -> Member:
        """The live member that the live members agree leads (Maintenance.Status)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids: dict[int, Member] = {}
            leaders: set[int] = set()
            for m in self.members:
                if not m.alive():
                    continue
                with contextlib.suppress(grpc.RpcError):
                    st = status(m.endpoint, 0.5, m.tls)
                    ids[st.header.member_id] = m
                    leaders.add(st.leader)
            if len(leaders) == 1:
                (lid,) = leaders
                if lid in ids:
                    return ids[lid]
            time.sleep(0.05)
        raise RuntimeError(f"no agreed {self.kind} leader in {timeout}s")

    def stop(self) -> None:
        for m in self.members:
            with contextlib.suppress(Exception):
                m.stop()

    def rss(self) -> list[int]:
        return [rss_bytes(m.pid) for m in self.members]


BENCH_USER = ("bench", "bench-password")


def enable_auth(cluster: Cluster, timeout: float = 30.0) -> str:
    """etcd's auth on ``cluster``: root, a role with readwrite on ``bench/`` and
    ``__bench_ready``, user ``bench`` holding it; auth on. Returns a token for ``bench``."""
    rw = auth_pb2.Permission.READWRITE
    with cluster.members[0].channel() as ch:
        a = rpc_pb2_grpc.AuthStub(ch)
        deadline = time.monotonic() + timeout
        while True:  # a loaded machine can drop the first (TLS) connection
            try:
                a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="bench-root"),
                          timeout=timeout)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), timeout=timeout)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"),
                        timeout=timeout)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="bench"), timeout=timeout)
        for key, end in ((b"bench/", b"bench0"), (b"__bench_ready", b"")):
            a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
                name="bench", perm=auth_pb2.Permission(permType=rw, key=key, range_end=end)),
                timeout=timeout)
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name=BENCH_USER[0], password=BENCH_USER[1]),
                  timeout=timeout)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user=BENCH_USER[0], role="bench"),
                        timeout=timeout)
        a.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=timeout)
        return str(a.Authenticate(rpc_pb2.AuthenticateRequest(
            name=BENCH_USER[0], password=BENCH_USER[1]), timeout=timeout).token)


class EtcdCluster(Cluster):
    """A real etcd (``/usr/bin/etcd``), fsync on (etcd's default, not ``--unsafe-no-fsync``)."""

    kind = "etcd"

    def __init__(self, root: Path, n: int = 3, *, heartbeat_ms: int = 100,
                 election_ms: int = 1000, tls: bool = False) -> None:
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.token = f"bench-{os.getpid()}-{time.monotonic_ns()}"
        super().__init__(root, n, tls=tls)

    def argv(self, m: Member) -> list[str]:
        peer = m.peer_url
        client = m.client_url
        return [
            ETCD_BIN, "--name", m.name, "--data-dir", str(m.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--log-level", "warn", "--logger", "zap",
            *m.tls_flags(),
        ]


class AccordCluster(Cluster):
    """``python -m accord serve`` members with etcd's flags."""

    kind = "accord"

    def __init__(self, root: Path, n: int = 3, *, heartbeat_ms: int = 100,
                 election_ms: int = 1000, extra: tuple[str, ...] = (), tls: bool = False,
                 workers: int = 1) -> None:
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.extra = extra
        self.workers = workers
        """``--workers`` of every member (docs/workers.md): worker k listens on peer port + k."""
        if workers > 1:
            self.kind = f"accord-w{workers}"  # its own member names and data directories
        super().__init__(root, n, tls=tls)
        if workers > 1:
            taken = [m.client_port for m in self.members]
            for m, base in zip(self.members, free_port_blocks(n, workers, avoid=taken),
                               strict=True):
                m.peer_port = base
            self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
            for m in self.members:
                m.argv = self.argv(m)

    def counters(self, names: tuple[str, ...]) -> dict[str, float]:
        """The sums over the members of the named counters (their ``/metrics`` over
        plain HTTP on the default metrics port); empty under TLS or with workers, where
        the metrics are elsewhere."""
        if self.client_tls is not None or self.workers > 1:
            return {}
        out = dict.fromkeys(names, 0.0)
        for m in self.members:
            url = f"http://{HOST}:{m.client_port + METRICS_PORT_OFFSET}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
            for fam in text_string_to_metric_families(text):
                for sample in fam.samples:
                    if sample.name in out and not sample.labels:
                        out[sample.name] += sample.value
        return out

    def argv(self, m: Member) -> list[str]:
        return [
            sys.executable, "-m", "accord", "serve",
            "--name", m.name, "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url,
            "--initial-cluster", self.initial,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--log-level", "warn",
            *m.tls_flags(),
            *(("--workers", str(self.workers)) if self.workers > 1 else ()),
            *self.extra,
        ]


class NullServer(Cluster):
    """The do-nothing server (``bench/nullserver.py``): accord's gRPC front end, no work."""

    kind = "null"

    def __init__(self, root: Path, n: int = 1) -> None:
        super().__init__(root, n)

    def argv(self, m: Member) -> list[str]:
        argv = [sys.executable, str(Path(__file__).with_name("nullserver.py")), "--listen", m.endpoint]
        peers = ",".join(f"{HOST}:{x.peer_port}" for x in self.members if x is not m)
        return argv + (["--udp", str(m.peer_port), "--peers", peers] if peers else [])


class NullFanout(NullServer):
    """Three do-nothing servers passing each Put's watch event to each other: the floor
    of watch delivery for accord's front-end design (``bench/nullserver.py``)."""

    kind = "nullw"

    def __init__(self, root: Path) -> None:
        super().__init__(root, 3)


class NullQuorum(Cluster):
    """Three do-nothing quorum servers (``bench/nullquorum.py``): the floor of a replicated
    durable write and of a quorum-confirmed read for accord's front-end design."""

    kind = "nullq"

    def __init__(self, root: Path, links: str = "udp") -> None:
        self.links = links
        super().__init__(root, 3)

    def argv(self, m: Member) -> list[str]:
        peers = ",".join(f"{HOST}:{x.peer_port}" for x in self.members if x is not m)
        return [sys.executable, str(Path(__file__).with_name("nullquorum.py")),
                "--listen", m.endpoint, "--peer-port", str(m.peer_port), "--peers", peers,
                "--links", self.links, "--data-dir", str(m.data_dir)]


class Harness:
    """Owns a temp dir and every cluster started in it; ends them all on exit."""

    def __init__(self, keep: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="accord-bench-"))
        self.keep = keep
        self.clusters: list[Cluster] = []

    def add(self, cluster: Cluster, start: bool = True) -> Cluster:
        self.clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    def etcd(self, *, tls: bool = False, **kw: int) -> EtcdCluster:
        c = EtcdCluster(self.root, tls=tls, **kw)
        self.add(c)
        return c

    def accord(self, *, extra: tuple[str, ...] = (), tls: bool = False, **kw: int) -> AccordCluster:
        """A 3-member accord cluster (``workers=N``: each member ``--workers N``)."""
        c = AccordCluster(self.root, extra=extra, tls=tls, **kw)
        self.add(c)
        return c

    def null(self) -> NullServer:
        c = NullServer(self.root)
        self.add(c)
        return c

    def null_quorum(self, links: str = "udp") -> NullQuorum:
        c = NullQuorum(self.root, links)
        self.add(c)
        return c

    def null_fanout(self) -> NullFanout:
        c = NullFanout(self.root)
        self.add(c)
        return c

    def close(self) -> None:
        for c in self.clusters:
            c.stop()
        self.clusters.clear()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Harness:
        signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def machine() -> str:
    """A one-line description of this machine: CPU model, cores, memory, load."""
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // (1024 * 1024)
    load = os.getloadavg()[0]
    return f"{model}, {os.cpu_count()} cores, {mem} GiB, load {load:.1f}"
