"""What every `accord` client subcommand shares: where the cluster is, how to dial it, the
client, errors.

Endpoints come from ``--endpoints`` (comma-separated ``host:port``, ``http://`` or
``https://``), else the ``ACCORD_ENDPOINTS`` environment variable, else
``127.0.0.1:2379`` (etcd's default). TLS takes etcdctl's options: ``--cacert`` (the CA
that signed the servers), ``--cert`` and ``--key`` (a client certificate), else the
``ACCORD_CACERT``, ``ACCORD_CERT`` and ``ACCORD_KEY`` variables; ``https://`` endpoints,
and any endpoint once one of them is set, dial TLS (``accord.client.tls``).

Every command talks to the cluster through :mod:`accord.client`, never through a stub
or channel of its own (``tests/cli/test_cli_uses_client.py`` keeps it so): most through
:func:`client`, a :class:`accord.client.sync.SyncClient` (failover, deadlines and the
client's retry policy: a write that may have been applied is never sent twice) with a
shorter retry budget than a long-running program's, so a shell waits seconds, not half
a minute, for a cluster that is down; ``accord ckpt`` through the async client, and
``accord nodes agent`` through the agent daemon (``accord.agent``), which has its own
link to the scheduler. A :class:`~accord.client.errors.ClientError` is printed as
``accord: CODE at ENDPOINT: message; hint`` and exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from accord.client.errors import ClientError
from accord.client.sync import SyncClient
from accord.client.tls import TLSOptions, TLSOptionsError
from accord.services.auth.tokens import parse_duration

CALL_TIMEOUT_S = 20.0
"""Deadline of one call (a scheduler submit waits for a Raft commit and a barrier)."""
RETRY_BUDGET_S = 8.0
"""How long a command keeps failing over before it reports the cluster unavailable."""


def _duration(text: str) -> float:
    """``--command-timeout``'s value: a Go duration as etcdctl takes it (``5s``, ``1m``)
    or plain seconds; positive."""
    try:
        seconds = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return seconds


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--endpoints``, ``--command-timeout`` and etcdctl's TLS options, on a client
    subcommand's parser."""
    p.add_argument("--endpoints", help="comma-separated client endpoints "
                                       "(host:port, http://host:port or https://host:port)")
    p.add_argument("--command-timeout", type=_duration, default=None, metavar="DURATION",
                   help="the longest a command may take, as etcdctl's: its calls and its "
                        "tries of the endpoints before it reports the cluster unavailable "
                        f"(default: {RETRY_BUDGET_S:g}s of tries, {CALL_TIMEOUT_S:g}s a call)")
    p.add_argument("--cacert", dest="tls_cacert", metavar="FILE",
                   help="verify servers with this CA bundle (PEM) [env ACCORD_CACERT]")
    p.add_argument("--cert", dest="tls_cert", metavar="FILE",
                   help="client certificate (PEM) for TLS [env ACCORD_CERT]")
    p.add_argument("--key", dest="tls_key", metavar="FILE",
                   help="private key (PEM) of --cert [env ACCORD_KEY]")


def tls_options(args: argparse.Namespace) -> TLSOptions | None:
    """``--cacert/--cert/--key`` (else ``ACCORD_CACERT``...), or None if none is set."""
    env = os.environ
    cacert = getattr(args, "tls_cacert", None) or env.get("ACCORD_CACERT")
    cert = getattr(args, "tls_cert", None) or env.get("ACCORD_CERT")
    key = getattr(args, "tls_key", None) or env.get("ACCORD_KEY")
    if not (cacert or cert or key):
        return None
    tls = TLSOptions(cacert=cacert, cert=cert, key=key)
    tls.credentials()  # read the files now: a bad one is an error before any call
    return tls


class Endpoints(list[str]):
    """The endpoints to try, in order, and the TLS options to dial them with."""

    def __init__(self, items: Iterable[str], tls: TLSOptions | None = None) -> None:
        super().__init__(items)
        self.tls = tls


def from_args(args: argparse.Namespace) -> Endpoints:
    """The endpoints and TLS options a subcommand was given; exits with status 2 and
    the reason when a TLS option is unusable (a missing file, --cert without --key)."""
    try:
        tls = tls_options(args)
    except TLSOptionsError as e:
        print(f"accord: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return endpoints(getattr(args, "endpoints", None), tls)


def endpoints(raw: str | None, tls: TLSOptions | None = None) -> Endpoints:
    """The endpoints to try, in order (``http://`` and ``https://`` allowed, as etcdctl's)."""
    spec = raw or os.environ.get("ACCORD_ENDPOINTS") or "127.0.0.1:2379"
    return Endpoints([e.strip() for e in spec.split(",") if e.strip()], tls)


def client(args: argparse.Namespace, *, call_timeout_s: float = CALL_TIMEOUT_S) -> SyncClient:
    """A blocking client of the cluster a subcommand was given (``--endpoints`` and the
    TLS options; close it, or use ``with``)."""
    eps = from_args(args)
    given = getattr(args, "command_timeout", None)
    if given is not None:  # the whole command bounded, each call included
        return SyncClient(list(eps), tls=eps.tls, call_timeout_s=min(call_timeout_s, given),
                          retry_budget_s=given)
    return SyncClient(list(eps), tls=eps.tls, call_timeout_s=call_timeout_s,
                      retry_budget_s=RETRY_BUDGET_S)


def error_line(e: ClientError) -> str:
    """How a command reports a failed call."""
    where = f" at {e.endpoint}" if e.endpoint else ""
    hint = f"; {e.hint}" if e.hint else ""
    return f"accord: {e.code.name}{where}: {e.message}{hint}"


def run(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command; a failed call prints :func:`error_line` and exits 1."""
    try:
        return fn(args)
    except ClientError as e:
        print(error_line(e), file=sys.stderr)
        return 1


def to_json(obj: Any) -> Any:
    """A client result (dataclasses, enums, bytes, tuples) as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.name
    if isinstance(obj, bytes):
        return obj.decode(errors="backslashreplace")
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_json(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """:func:`to_json` as one line of JSON."""
    return json.dumps(to_json(obj))
