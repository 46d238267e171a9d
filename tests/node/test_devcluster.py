"""`accord dev` launcher, driven as a real subprocess with a fake `accord serve`.

The fake server (written to a temp dir) records its arguments and PID, listens on
its client and peer ports, and on SIGTERM writes a marker and exits; modes make it
ignore SIGTERM or crash at startup.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_SERVER = r'''
import json, os, signal, socket, sys, time
args = sys.argv[1:]
opt = {args[i]: args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}
mode = os.environ.get("FAKE_MODE", "ok")
data = opt["--data-dir"]
os.makedirs(data, exist_ok=True)
with open(os.path.join(data, "argv.json"), "w") as f:
    json.dump({"argv": args, "pid": os.getpid()}, f)
if mode == "crash":
    print("fake: cannot start", flush=True)
    sys.exit(3)
def port(url):
    return int(url.rsplit(":", 1)[1])
socks = []
for key in ("--listen-client-urls", "--listen-peer-urls"):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port(opt[key])))
    s.listen()
    socks.append(s)
def on_term(signum, frame):
    with open(os.path.join(data, "terminated"), "w") as f:
        f.write("ok")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else on_term)
print("fake " + opt["--name"] + " ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    socks[0].settimeout(0.2)
    try:
        c, _ = socks[0].accept()
        c.close()
    except OSError:
        pass
'''


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_base(nodes: int) -> int:
    """A base port whose 2*nodes client/peer ports and the gossip/metrics ports 1000
    above them are free on 127.0.0.1, all below the kernel's ephemeral range (so that
    no test's outgoing connection takes one of them between this check and the bind)."""
    rng = random.Random()
    top = min(40000, _ephemeral_low()) - 1000 - 2 * nodes
    for _ in range(50):
        base = rng.randrange(10000, top, 2)
        ok = True
        wanted = [*range(base, base + 2 * nodes), *range(base + 1000, base + 1000 + 2 * nodes)]
        for p in wanted:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range found")


class Launcher:
    """A running `accord dev` subprocess with its output collected by a reader thread."""

    def __init__(self, tmp: Path, nodes: int, base: int, mode: str = "ok", *extra: str,
                 real: bool = False) -> None:
        """``real``: run real ``accord serve`` nodes instead of the fake server."""
        fake = tmp / "fake_serve.py"
        fake.write_text(FAKE_SERVER)
        self.data = tmp / "cluster"
        self.real = real
        env = dict(os.environ, FAKE_MODE=mode, PYTHONPATH=str(REPO))
        serve = [] if real else ["--serve-command", f"{sys.executable} {fake}"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "accord.node.devcluster", "--nodes", str(nodes), "--base-port", str(base),
             "--data-dir", str(self.data), *serve, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp,
            start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, text: str, limit: float = 30.0) -> str:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {limit}s; got:\n" + "\n".join(self.seen))

    def finish(self, limit: float = 30.0) -> int:
        rc = self.proc.wait(timeout=limit)
        self._reader.join(timeout=5)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return rc

    def child_pids(self) -> list[int]:
        if self.real:  # real nodes: the launcher's direct children, as the kernel lists them
            with contextlib.suppress(OSError):
                path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                return [int(p) for p in path.read_text().split()]
            return []
        pids = []
        for f in self.data.glob("n*/argv.json"):
            pids.append(json.loads(f.read_text())["pid"])
        return pids

    def cleanup(self) -> None:
        """Kill by PID whatever is still alive (the launcher and its children)."""
        children = self.child_pids()  # read before the launcher is gone
        if self.real and self.proc.poll() is None:  # let it stop its nodes in order
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
                children = []  # it stopped (and reaped) them itself
            except subprocess.TimeoutExpired:
                pass
        for pid in [self.proc.pid, *children]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[type[Launcher]]:
    started: list[Launcher] = []

    class Tracked(Launcher):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(tmp_path, *a, **kw)  # type: ignore[arg-type]
            started.append(self)

    try:
        yield Tracked
    finally:
        for launcher in started:
            launcher.cleanup()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); check its state
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_starts_prints_endpoints_and_stops_cleanly(launch: type[Launcher]) -> None:
    base = free_base(3)
    lc = launch(3, base)
    lc.wait_for("etcdctl")
    out = "\n".join(lc.seen)
    clients = [f"http://127.0.0.1:{base + 2 * i}" for i in range(3)]
    assert f"client endpoints: {','.join(clients)}" in out
    assert f"etcdctl --endpoints={','.join(clients)} put" in out
    assert "[n2] fake n2 ready" in out  # children's output is prefixed
    for i in range(3):
        assert answers(base + 2 * i)
        argv = json.loads((lc.data / f"n{i + 1}" / "argv.json").read_text())["argv"]
        opt = dict(zip(argv[::2], argv[1::2], strict=False))
        assert opt["--name"] == f"n{i + 1}"
        assert opt["--listen-client-urls"] == clients[i]
        assert opt["--listen-peer-urls"] == f"http://127.0.0.1:{base + 2 * i + 1}"
        assert opt["--initial-cluster"] == ",".join(
            f"n{j + 1}=http://127.0.0.1:{base + 2 * j + 1}" for j in range(3))
        assert opt["--data-dir"] == str(lc.data / f"n{i + 1}")
    pids = lc.child_pids()
    assert len(pids) == 3
    lc.proc.send_signal(signal.SIGINT)
    assert lc.finish() == 0
    for i in range(3):
        assert (lc.data / f"n{i + 1}" / "terminated").exists()  # got SIGTERM, exited by itself
        assert f"fake n{i + 1} ready" in (lc.data / f"n{i + 1}.log").read_text()
        assert not answers(base + 2 * i)
    assert not any(alive(p) for p in pids)


def test_stubborn_child_is_killed(launch: type[Launcher]) -> None:
    base = free_base(2)
    lc = launch(2, base, "stubborn", "--stop-timeout", "0.5", "--quiet")
    lc.wait_for("etcdctl")
    assert not any(line.startswith("[n1]") for line in lc.seen)  # --quiet
    pids = lc.child_pids()
    lc.proc.send_signal(signal.SIGTERM)
    assert lc.finish() == 0
    assert "ignored SIGTERM; killing it" in "\n".join(lc.seen)
    assert not any(alive(p) for p in pids)
    assert not list(lc.data.glob("n*/terminated"))


def test_child_crash_at_startup_fails_and_cleans_up(launch: type[Launcher]) -> None:
    base = free_base(2)
    lc = launch(2, base, "crash")
    assert lc.finish() == 1
    out = "\n".join(lc.seen)
    assert "exited with code 3 during startup" in out
    assert "fake: cannot start" in out
    assert not any(alive(p) for p in lc.child_pids())


def test_port_in_use_is_refused(launch: type[Launcher]) -> None:
    base = free_base(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 1))
        s.listen()
        lc = launch(1, base)
        assert lc.finish() == 1
    assert f"port(s) {base + 1} on 127.0.0.1 are in use" in "\n".join(lc.seen)
    assert not (lc.data / "n1").exists()


def test_tls_makes_certificates_and_passes_etcd_tls_flags(launch: type[Launcher]) -> None:
    base = free_base(2)
    lc = launch(2, base, "ok", "--tls", "--quiet")
    line = lc.wait_for("try: etcdctl")
    certs = lc.data / "certs"
    clients = [f"https://127.0.0.1:{base + 2 * i}" for i in range(2)]
    assert line.endswith(f"etcdctl --endpoints={','.join(clients)} --cacert={certs / 'ca.crt'} "
                         f"--cert={certs / 'client.crt'} --key={certs / 'client.key'} "
                         "put /hello world")
    from accord.node.tls import TLSFiles, load_files
    for i in range(2):
        name = f"n{i + 1}"
        argv = json.loads((lc.data / name / "argv.json").read_text())["argv"]
        opt = dict(zip(argv[::2], argv[1::2], strict=False))
        assert opt["--listen-client-urls"] == clients[i]
        assert opt["--initial-cluster"] == ",".join(
            f"n{j + 1}=https://127.0.0.1:{base + 2 * j + 1}" for j in range(2))
        assert opt["--client-cert-auth"] == opt["--peer-client-cert-auth"] == "true"
        assert opt["--cert-file"] == opt["--peer-cert-file"] == str(certs / f"{name}.crt")
        assert opt["--trusted-ca-file"] == opt["--peer-trusted-ca-file"] == str(certs / "ca.crt")
        loaded = load_files(TLSFiles(opt["--cert-file"], opt["--key-file"], opt["--trusted-ca-file"]))
        assert loaded.subject == f"CN={name}"
    os.kill(lc.proc.pid, signal.SIGTERM)
    assert lc.finish() == 0
