"""A node's log lines: ``--log-format json|console``, ``--log-level``, ids on every line.

One event is one line. Each line carries what is known about where it happened:

* ``node`` and ``member``: this member's name and id (hex, as etcdctl prints it), set once
  the node knows them (``LogContext.set_node``);
* ``group``: the Raft group, when the call passes it (``log.info(..., extra={"group": 7})``);
* ``request``: the id of the gRPC call being served (``REQUEST_ID``; the metrics
  interceptor sets it for every call, from the client's ``x-request-id`` metadata when
  there is one), so every line a request causes can be found with one grep.

``json`` writes one JSON object per line (``ts`` in UTC with milliseconds, ``level``,
``logger``, ``msg``, then the ids, then ``error`` with the traceback of an exception), the
shape log shippers parse; ``console`` writes the same facts for a person. The default is
``console`` when standard error is a terminal and ``json`` otherwise (a service manager, a
container, a file), as etcd's zap logger does.

No secrets in logs: values registered with ``LogContext.redact`` (the gossip encryption
keys, passwords) are replaced by ``[redacted]`` in the final line, whatever logged them,
even a traceback.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import TextIO

from accord.node.config import LOG_FORMATS

REDACTED = "[redacted]"

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("accord_request_id", default="")
"""The id of the request being served in this task (empty outside requests)."""

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "warning": logging.WARNING, "error": logging.ERROR}


def level_number(name: str) -> int:
    """``--log-level`` as a ``logging`` level; ``ValueError`` naming the choices."""
    try:
        return _LEVELS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"log-level {name!r}: use one of debug, info, warn, error") from None


def default_format(stream: TextIO) -> str:
    """``console`` on a terminal, ``json`` otherwise."""
    try:
        return "console" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # a closed or odd stream
        return "json"


class LogContext(logging.Filter):
    """Adds the node's ids and the current request id to every record; knows the secrets."""

    def __init__(self) -> None:
        super().__init__()
        self.node = ""
        self.member = ""
        self._secrets: list[str] = []

    def set_node(self, name: str, member_id: int) -> None:
        """Stamp this node's name and id on every later line."""
        self.node = name
        self.member = f"{member_id:x}"

    def redact(self, secrets: Iterable[str]) -> None:
        """Never let these strings reach a log line (empty ones are ignored)."""
        for s in secrets:
            if s and s not in self._secrets:
                self._secrets.append(s)
        self._secrets.sort(key=len, reverse=True)  # a longer secret first: no half-masked one

    def scrub(self, line: str) -> str:
        """``line`` with every registered secret replaced by ``[redacted]``."""
        for s in self._secrets:
            if s in line:
                line = line.replace(s, REDACTED)
        return line

    def filter(self, record: logging.LogRecord) -> bool:
        """Attach ``node``, ``member`` and ``request`` (a record may already carry ``group``)."""
        record.node = self.node
        record.member = self.member
        if not hasattr(record, "request"):
            record.request = REQUEST_ID.get()
        return True


def _timestamp(created: float) -> str:
    ms = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the fields)."""

    def __init__(self, context: LogContext) -> None:
        super().__init__()
        self._ctx = context

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out: dict[str, object] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower().replace("warning", "warn"),
            "logger": record.name,
            "msg": self._ctx.scrub(record.getMessage()),
        }
        for key in ("node", "member", "group", "request"):
            value = getattr(record, key, "")
            if value != "" and value is not None:
                out[key] = value
        if record.exc_info:
            out["error"] = self._ctx.scrub(self.formatException(record.exc_info))
        elif record.exc_text:
            out["error"] = self._ctx.scrub(record.exc_text)
        return self._ctx.scrub(json.dumps(out, default=str, ensure_ascii=False))


class ConsoleFormatter(logging.Formatter):
    """``ts LEVEL logger [node member] group=G request=R: message`` for a person."""

    def __init__(self, context: LogContext) -> None:
        super().__init__()
        self._ctx = context

    def format(self, record: logging.LogRecord) -> str:
        """The record as one readable line (a traceback follows on its own lines)."""
        node = getattr(record, "node", "")
        where = f" [{node} {getattr(record, 'member', '')}]" if node else ""
        ids = ""
        group = getattr(record, "group", None)
        if group is not None and group != "":
            ids += f" group={group}"
        request = getattr(record, "request", "")
        if request:
            ids += f" request={request}"
        line = (f"{_timestamp(record.created)} {record.levelname} {record.name}{where}{ids}: "
                f"{record.getMessage()}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self._ctx.scrub(line)


def configure(fmt: str, level: str, *, stream: TextIO | None = None) -> LogContext:
    """Send every ``accord`` log record to ``stream`` (stderr) in ``fmt`` at ``level``.

    Replaces the root logger's handlers (one node per process); returns the context to
    stamp the node's ids on (``set_node``) and to register secrets with (``redact``).
    """
    out = stream if stream is not None else sys.stderr
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log-format {fmt!r}: use json or console")
    ctx = LogContext()
    handler = logging.StreamHandler(out)
    handler.addFilter(ctx)
    handler.setFormatter(JsonFormatter(ctx) if fmt == "json" else ConsoleFormatter(ctx))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level_number(level))
    return ctx
