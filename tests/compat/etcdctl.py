"""Run the real ``etcdctl`` (v3 API) against an endpoint, bounded in time."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from tests.compat.servers import require_binary

TIMEOUT_S = 20.0


def etcdctl(endpoint: str, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """``etcdctl --endpoints=ENDPOINT ARGS...``; its stdout (stderr joined on failure)."""
    binary = require_binary("etcdctl")
    proc = subprocess.run(
        [binary, f"--endpoints={endpoint}", "--command-timeout=10s", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"etcdctl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout if check else proc.stdout + proc.stderr


def etcdctl_json(endpoint: str, *args: str) -> Any:
    """``etcdctl ... -w json`` parsed."""
    return json.loads(etcdctl(endpoint, *args, "-w", "json"))
