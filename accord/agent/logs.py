"""``accord.agent.v1.Agent``: task output read through the agent that ran the task.

Reads ``stdout.log`` / ``stderr.log`` of a task directory (``runner``) in chunks of
``CHUNK`` bytes from an offset. With ``follow`` the stream waits for more (polling
the file every ``POLL`` seconds) until the task has ended and the file is read to
its end; a client that goes away ends it. Attempt 0 means the newest attempt of
that rank this agent has a directory for.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from accord.agent.runner import STDERR, STDOUT, TaskKey
from accord.proto import agent_pb2 as pb
from accord.proto import agent_pb2_grpc

CHUNK = 64 * 1024
POLL = 0.2
_grpc_mod: Any = agent_pb2_grpc


def task_dir(root: Path, job_id: str, rank: int, attempt: int) -> tuple[Path, int] | None:
    """The directory of that task (the newest attempt when ``attempt`` is 0), or None."""
    if attempt:
        d = root / TaskKey(job_id, rank, attempt).dirname
        return (d, attempt) if d.is_dir() else None
    pattern = re.compile(re.escape(f"{job_id}.r{rank}.a") + r"(\d+)$")
    best: tuple[Path, int] | None = None
    try:
        entries = list(root.iterdir())
    except OSError:
        return None
    for d in entries:
        m = pattern.match(d.name)
        if m and (best is None or int(m.group(1)) > best[1]):
            best = (d, int(m.group(1)))
    return best


def _read(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(size)


class AgentServicer(_grpc_mod.AgentServicer):  # type: ignore[misc]
    """Serves task logs from ``root``; ``running(key)`` says whether a task still runs."""

    def __init__(self, root: Path, running: Callable[[TaskKey], bool]) -> None:
        self.root = root
        self.running = running

    async def ReadLog(self, request: pb.ReadLogRequest,
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LogChunk]:
        """Stream one task's output (see the module docstring)."""
        if request.stream not in ("", "stdout", "stderr"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"stream {request.stream!r} is not stdout or stderr")
        found = await asyncio.to_thread(task_dir, self.root, request.job_id, request.rank,
                                        request.attempt)
        if found is None:
            which = f"attempt {request.attempt}" if request.attempt else "any attempt"
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"this agent has no log of job {request.job_id!r} rank "
                                f"{request.rank} ({which})")
            return
        d, attempt = found
        path = d / (STDERR if request.stream == "stderr" else STDOUT)
        key = TaskKey(request.job_id, request.rank, attempt)
        offset = request.offset
        while True:
            live = self.running(key)
            try:
                data = await asyncio.to_thread(_read, path, offset, CHUNK)
            except FileNotFoundError:
                data = b""
            if data:
                yield pb.LogChunk(data=data, offset=offset, attempt=attempt)
                offset += len(data)
                continue
            if not request.follow or not live:
                return
            await asyncio.sleep(POLL)


def add_agent_service(server: grpc.aio.Server, servicer: AgentServicer) -> None:
    """Register the agent service on ``server``."""
    _grpc_mod.add_AgentServicer_to_server(servicer, server)
