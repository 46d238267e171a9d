"""What every `accord` client subcommand shares: where the cluster is, and failing over.

Endpoints come from ``--endpoints`` (comma-separated ``host:port``), else the
``ACCORD_ENDPOINTS`` environment variable, else ``127.0.0.1:2379`` (etcd's default).
A call goes to the first endpoint that answers: an unreachable member or one that timed
out passes the call to the next; any other error is the answer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import grpc

T = TypeVar("T")

RETRY_ON_NEXT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
"""Errors that send a call on to the next endpoint."""


def endpoints(raw: str | None) -> list[str]:
    """The endpoints to try, in order (``http://`` prefixes allowed, as etcdctl's)."""
    spec = raw or os.environ.get("ACCORD_ENDPOINTS") or "127.0.0.1:2379"
    return [e.strip().removeprefix("http://") for e in spec.split(",") if e.strip()]


def first(endpoints: list[str], call: Callable[[grpc.Channel], T]) -> T:
    """Run ``call(channel)`` against the first endpoint that answers."""
    last: grpc.RpcError | None = None
    for ep in endpoints:
        with grpc.insecure_channel(ep) as ch:
            try:
                return call(ch)
            except grpc.RpcError as e:
                last = e
                if e.code() not in RETRY_ON_NEXT:
                    break
    if last is None:
        raise ValueError("no endpoint given")
    raise last
