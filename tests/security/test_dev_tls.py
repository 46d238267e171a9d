"""`accord dev --tls` with real nodes: the etcdctl line it prints works as printed, and the
cluster refuses a client without a certificate."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess

import pytest

from tests.compat.servers import require_binary
from tests.node.test_devcluster import Launcher, free_base, launch  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "ETCDCTL_API": "3"})


def test_dev_tls_prints_an_etcdctl_line_that_works(launch: type[Launcher]) -> None:  # noqa: F811
    base = free_base(2)
    lc = launch(2, base, "ok", "--tls", "--quiet", "--startup-timeout", "60", real=True)
    line = lc.wait_for("try: etcdctl", limit=90)
    argv = shlex.split(line.split("try: ", 1)[1])
    assert argv[0] == "etcdctl" and "--cacert" in line and "--cert" in line and "--key" in line
    argv[0] = require_binary("etcdctl")
    put = _run([*argv[:-3], "--command-timeout=20s", *argv[-3:]])  # "put /hello world", printed
    assert put.returncode == 0 and put.stdout.strip() == "OK", put.stdout + put.stderr
    flags = argv[1:-3]
    get = _run([argv[0], *flags, "get", "/hello"])
    assert get.stdout.split() == ["/hello", "world"], get.stdout + get.stderr
    anonymous = [f for f in flags if not f.startswith(("--cert=", "--key="))]
    refused = _run([argv[0], *anonymous, "--dial-timeout=2s", "--command-timeout=4s",
                    "get", "/hello"])
    assert refused.returncode != 0 and "world" not in refused.stdout
    os.kill(lc.proc.pid, signal.SIGTERM)
    assert lc.finish(limit=60) == 0
