"""`accord dev`: run a real local cluster of accord nodes on 127.0.0.1, for development.

Starts ``--nodes`` (default 3) ``accord serve`` subprocesses. Member ``nI`` (I from 1)
serves clients on ``base+2(I-1)`` and peers on ``base+2(I-1)+1``, so with the default
base 2379 the first node has etcd's usual ports (2379/2380), the second 2381/2382,
and so on; SWIM membership runs on each peer port + 1000 (3380, 3382, ...) with the
``local`` gossip profile (detection within seconds on one host), and each node serves
``/metrics``, ``/health``, ``/livez`` and ``/readyz`` on its client port + 1000 (3379,
3381, ...). Logs are in the ``console`` format (``-- --log-format json`` for JSON).
Each keeps its data in ``<data-dir>/nI`` and its output in ``<data-dir>/nI.log`` (also shown on the terminal, prefixed ``[nI]``, unless
``--quiet``). Once every client port answers, the endpoints and an ``etcdctl``
example are printed. Ctrl-C (SIGINT) or SIGTERM stops the cluster: each child gets
SIGTERM by PID, stragglers get SIGKILL after ``--stop-timeout`` seconds.

``--tls`` makes a fresh CA and a certificate per node (and one for a client, CN
``client``) in ``<data-dir>/certs`` (``accord/node/certs.py``) and runs every port
under mutual TLS: ``https://`` client URLs that require a client certificate, and
``https://`` peer links; the ``etcdctl`` line it prints carries ``--cacert``, ``--cert``
and ``--key``.

Arguments after ``--`` are passed to every ``accord serve`` (``accord dev -- --shards 4``).
Nodes run in their own session, so a Ctrl-C on the terminal reaches only this
launcher, which then stops them in order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import socket
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from accord.node.certs import CertFiles, make_cluster_pki
from accord.node.config import GOSSIP_PORT_OFFSET, METRICS_PORT_OFFSET

HOST = "127.0.0.1"


@dataclass
class _Node:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    scheme: str = "http"
    certs: CertFiles | None = None
    proc: asyncio.subprocess.Process | None = None
    pump: asyncio.Task[None] | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.peer_port}"

    @property
    def gossip_port(self) -> int:
        return self.peer_port + GOSSIP_PORT_OFFSET

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.client_port + METRICS_PORT_OFFSET}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``accord dev`` options on ``parser``."""
    parser.add_argument("--nodes", type=int, default=3, help="number of nodes (1..15, default 3)")
    parser.add_argument("--base-port", type=int, default=2379,
                        help="client port of n1; node I uses base+2(I-1) (client) and +1 (peer)")
    parser.add_argument("--data-dir", default="accord-dev-data",
                        help="folder for the nodes' data and logs (default ./accord-dev-data)")
    parser.add_argument("--cluster-token", default="accord-dev", help="cluster token (default accord-dev)")
    parser.add_argument("--quiet", action="store_true", help="do not echo the nodes' logs")
    parser.add_argument("--tls", action="store_true",
                        help="mutual TLS everywhere, with a fresh CA and certificates "
                             "in <data-dir>/certs")
    parser.add_argument("--startup-timeout", type=float, default=30.0,
                        help="seconds to wait for every client port to answer (default 30)")
    parser.add_argument("--stop-timeout", type=float, default=10.0,
                        help="seconds between SIGTERM and SIGKILL on shutdown (default 10)")
    # Replaces `python -m accord serve` (tests start a fake server with it).
    parser.add_argument("--serve-command", default=None, help=argparse.SUPPRESS)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="accord dev", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after -- are passed to every `accord serve`.")
    add_arguments(p)
    return p


def main(argv: Sequence[str]) -> int:
    """Run ``accord dev`` with ``argv``; returns the exit status once the cluster is stopped."""
    args_list = list(argv)
    extra: list[str] = []
    if "--" in args_list:
        i = args_list.index("--")
        args_list, extra = args_list[:i], args_list[i + 1:]
    parser = _parser()
    args = parser.parse_args(args_list)
    if not 1 <= args.nodes <= 15:
        parser.error(f"--nodes {args.nodes}: use 1..15")
    if not 1 <= args.base_port or args.base_port + 2 * args.nodes - 1 + GOSSIP_PORT_OFFSET > 65535:
        parser.error(f"--base-port {args.base_port}: the {2 * args.nodes} ports from it, and the "
                     f"gossip ports {GOSSIP_PORT_OFFSET} above the peer ports, must be 1..65535")
    root = Path(args.data_dir)
    nodes = [_Node(f"n{i + 1}", args.base_port + 2 * i, args.base_port + 2 * i + 1, root / f"n{i + 1}")
             for i in range(args.nodes)]
    busy = [p for n in nodes
            for p in (n.client_port, n.peer_port, n.gossip_port, n.client_port + METRICS_PORT_OFFSET)
            if _port_in_use(p)]
    if busy:
        print(f"accord dev: port(s) {', '.join(map(str, busy))} on {HOST} are in use "
              "(another cluster running?); stop it or pick another --base-port", file=sys.stderr)
        return 1
    root.mkdir(parents=True, exist_ok=True)
    if args.tls:
        _, files = make_cluster_pki(root / "certs", [n.name for n in nodes],
                                    ca_name="accord dev CA")
        for n in nodes:
            n.scheme, n.certs = "https", files[n.name]
    with contextlib.ExitStack() as stack:
        logs: list[TextIO] = [stack.enter_context(open(root / f"{n.name}.log", "a", encoding="utf-8"))
                              for n in nodes]
        return asyncio.run(_run(args, extra, root, nodes, logs))


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def _serve_argv(args: argparse.Namespace, node: _Node, cluster: str, extra: list[str]) -> list[str]:
    base = (shlex.split(args.serve_command) if args.serve_command
            else [sys.executable, "-m", "accord", "serve"])
    return [*base,
            "--name", node.name, "--data-dir", str(node.data_dir),
            "--listen-client-urls", node.client_url, "--advertise-client-urls", node.client_url,
            "--listen-peer-urls", node.peer_url, "--initial-advertise-peer-urls", node.peer_url,
            "--initial-cluster", cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", args.cluster_token, "--gossip-profile", "local",
            "--listen-metrics-urls", node.metrics_url, "--log-format", "console",
            *_tls_argv(node), *extra]


def _tls_argv(node: _Node) -> list[str]:
    """etcd's TLS flags for ``node``: its certificate for both kinds of traffic, the dev
    CA trusted, and a certificate required of every client and peer."""
    if node.certs is None:
        return []
    cert, key, ca = str(node.certs.cert), str(node.certs.key), str(node.certs.ca)
    return ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca,
            "--client-cert-auth", "true",
            "--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", ca,
            "--peer-client-cert-auth", "true"]


def client_tls_flags(root: Path) -> str:
    """etcdctl's (and accord's) TLS options for the client certificate ``--tls`` made."""
    certs = root / "certs"
    return (f"--cacert={certs / 'ca.crt'} --cert={certs / 'client.crt'} "
            f"--key={certs / 'client.key'}")


async def _pump(node: _Node, stream: asyncio.StreamReader, log: TextIO, quiet: bool) -> None:
    """Copy a child's output to its log file (and the terminal, prefixed)."""
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line longer than the stream's limit: take what is buffered
            line = await stream.read(1 << 16)
        if not line:
            return
        text = line.decode(errors="replace").rstrip("\n")
        node.tail.append(text)
        log.write(text + "\n")
        log.flush()
        if not quiet:
            print(f"[{node.name}] {text}", flush=True)


async def _answers(port: int) -> bool:
    try:
        async with asyncio.timeout(1.0):
            _, w = await asyncio.open_connection(HOST, port)
    except (OSError, TimeoutError):
        return False
    w.close()
    return True


async def _wait_ready(nodes: list[_Node], limit: float, stop: asyncio.Event) -> str:
    """"" when every client port answers; otherwise why not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    pending = list(nodes)
    while pending:
        for n in list(pending):
            assert n.proc is not None
            if n.proc.returncode is not None:
                return f"{n.name} exited with code {n.proc.returncode} during startup"
            if await _answers(n.client_port):
                pending.remove(n)
        if stop.is_set():
            return "interrupted during startup"
        if pending and loop.time() > deadline:
            return (f"{', '.join(n.name for n in pending)} did not answer on "
                    f"{', '.join(n.client_url for n in pending)} within {limit:g}s")
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await stop.wait()
    return ""


async def _stop_all(nodes: list[_Node], grace: float) -> None:
    """SIGTERM every live child by PID, wait up to ``grace`` seconds, SIGKILL the rest."""
    live = [n for n in nodes if n.proc is not None and n.proc.returncode is None]
    for n in live:
        assert n.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(n.proc.pid, signal.SIGTERM)
    waits = [n.proc.wait() for n in live if n.proc is not None]
    try:
        async with asyncio.timeout(grace):
            await asyncio.gather(*waits)
    except TimeoutError:
        for n in live:
            assert n.proc is not None
            if n.proc.returncode is None:
                print(f"accord dev: {n.name} (pid {n.proc.pid}) ignored SIGTERM; killing it", flush=True)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.proc.pid, signal.SIGKILL)
        for n in live:
            assert n.proc is not None
            await n.proc.wait()
    for n in nodes:
        if n.pump is not None:
            try:
                async with asyncio.timeout(2.0):
                    await n.pump
            except TimeoutError:
                n.pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await n.pump


async def _run(args: argparse.Namespace, extra: list[str], root: Path, nodes: list[_Node],
               logs: list[TextIO]) -> int:
    cluster = ",".join(f"{n.name}={n.peer_url}" for n in nodes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        for n, log in zip(nodes, logs, strict=True):
            cmd = _serve_argv(args, n, cluster, extra)
            try:
                n.proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=env)
            except OSError as e:
                print(f"accord dev: cannot start {n.name} ({shlex.join(cmd)}): {e}", file=sys.stderr)
                return 1
            assert n.proc.stdout is not None
            n.pump = asyncio.create_task(_pump(n, n.proc.stdout, log, args.quiet))
        problem = await _wait_ready(nodes, args.startup_timeout, stop)
        if problem:
            print(f"accord dev: {problem}", file=sys.stderr)
            for n in nodes:
                if n.proc is not None and n.proc.returncode is not None and n.tail:
                    print(f"--- last output of {n.name}:\n" + "\n".join(n.tail), file=sys.stderr)
            return 130 if stop.is_set() else 1
        endpoints = ",".join(n.client_url for n in nodes)
        lines = [f"accord dev: {len(nodes)} node(s) up; data and logs in {root}"]
        lines += [f"  {n.name}  client {n.client_url}  peer {n.peer_url}  gossip {HOST}:{n.gossip_port}"
                  f"  metrics {n.metrics_url}/metrics  log {root / (n.name + '.log')}" for n in nodes]
        tls = f" {client_tls_flags(root)}" if args.tls else ""
        lines += [f"client endpoints: {endpoints}",
                  f"try: etcdctl --endpoints={endpoints}{tls} put /hello world",
                  "press Ctrl-C to stop the cluster"]
        print("\n".join(lines), flush=True)
        reported: set[str] = set()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()
            for n in nodes:
                if n.proc is not None and n.proc.returncode is not None and n.name not in reported:
                    reported.add(n.name)
                    print(f"accord dev: {n.name} exited with code {n.proc.returncode}", flush=True)
        print("accord dev: stopping", flush=True)
        return 0
    finally:
        await _stop_all(nodes, args.stop_timeout)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
