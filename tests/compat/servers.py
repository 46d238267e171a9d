"""Start and stop the servers the compatibility tests talk to, always killed by PID.

* :func:`accord_server` runs ``python -m accord.node.grpc_server`` (the local backend) on a
  free 127.0.0.1 port;
* :func:`etcd_server` runs a real single-member etcd (``/usr/bin/etcd`` from Debian's
  etcd-server) with its data directory under the test's tmp dir.

Both are context managers yielding a :class:`Server` (``endpoint`` = ``127.0.0.1:PORT``).
A missing binary is a failure with a clear message, never a skip. ``etcd_server(...,
tls=EtcdTLS(...))`` serves ``https://`` with etcd's TLS flags (the security tests run
the same commands against it and accord).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from accord.client.tls import TLSOptions, sync_channel
from accord.node.certs import CertFiles
from accord.proto import rpc_pb2, rpc_pb2_grpc
from accord.testing import free_ports

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0


@dataclass(slots=True)
class Server:
    """A running server process and where to reach it."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    kind: str
    scheme: str = "http"

    @property
    def url(self) -> str:
        """``scheme://host:port`` (what ``--endpoints`` takes)."""
        return f"{self.scheme}://{self.endpoint}"


@dataclass(slots=True)
class EtcdTLS:
    """etcd's client TLS flags: the server's certificate, and who it trusts."""

    server: CertFiles
    client: CertFiles
    """What ``wait_serving`` dials with."""
    client_cert_auth: bool = True

    def flags(self) -> list[str]:
        f = self.server
        out = ["--cert-file", str(f.cert), "--key-file", str(f.key),
               "--trusted-ca-file", str(f.ca)]
        return out + (["--client-cert-auth"] if self.client_cert_auth else [])

    @property
    def options(self) -> TLSOptions:
        c = self.client
        return TLSOptions(cacert=str(c.ca), cert=str(c.cert), key=str(c.key))


def require_binary(name: str) -> str:
    """Path of a system binary the test needs; fails (not skips) when absent."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(
            f"`{name}` is not installed: the compatibility tests drive the real etcd tools. "
            "Install Debian's etcd-client and etcd-server (scripts/test does it as root)."
        )
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range and
    in this pytest-xdist worker's share of it (``accord.testing.free_ports``)."""
    return free_ports(1)[0]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def wait_serving(endpoint: str, proc: subprocess.Popen[bytes], what: str,
                 tls: TLSOptions | None = None) -> None:
    """Block until a Range over gRPC succeeds (or fail with the process's output);
    ``tls``: dial ``https://`` with these options."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode} before serving")
        try:
            url = f"{'https' if tls else 'http'}://{endpoint}"
            with sync_channel(url, tls) as ch:
                rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"health"), timeout=1.0)
            return
        except grpc.RpcError as e:
            last = e
            time.sleep(0.1)
    raise AssertionError(f"{what} did not serve on {endpoint} within {START_TIMEOUT_S}s: {last}")


@contextlib.contextmanager
def accord_server(data_dir: Path | None = None) -> Iterator[Server]:
    """``python -m accord.node.grpc_server`` on a free port; killed by PID on exit."""
    cmd = [sys.executable, "-m", "accord.node.grpc_server", "--listen", "127.0.0.1:0"]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        endpoint = ""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode().strip()
            if not line:
                if proc.poll() is not None:
                    raise AssertionError(f"accord.node.grpc_server exited with {proc.returncode}")
                continue
            if line.startswith("listening on "):
                endpoint = line.removeprefix("listening on ")
            if line == "ready":
                break
        if not endpoint:
            raise AssertionError("accord.node.grpc_server never printed its address and 'ready'")
        yield Server(proc, endpoint, "accord")
    finally:
        _kill(proc)


@contextlib.contextmanager
def etcd_server(data_dir: Path, tls: EtcdTLS | None = None) -> Iterator[Server]:
    """A real single-member etcd on free 127.0.0.1 ports; killed by PID on exit."""
    etcd = require_binary("etcd")
    client, peer = free_port(), free_port()
    scheme = "https" if tls else "http"
    cmd = [
        etcd,
        "--name", "default",
        "--data-dir", str(data_dir),
        "--listen-client-urls", f"{scheme}://127.0.0.1:{client}",
        "--advertise-client-urls", f"{scheme}://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"default=http://127.0.0.1:{peer}",
        "--log-level", "error",
        "--logger", "zap",
        *(tls.flags() if tls else ()),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    try:
        endpoint = f"127.0.0.1:{client}"
        wait_serving(endpoint, proc, "etcd", tls.options if tls else None)
        yield Server(proc, endpoint, "etcd", scheme)
    finally:
        _kill(proc)
