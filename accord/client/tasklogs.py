"""A task's output, streamed from the agent of the node it ran on (``accord.agent.v1.Agent``).

``client.scheduler.logs(job_id, rank=0)`` asks the scheduler where the rank ran (the
job's task status, kept after the job ended) and where that node's agent serves
(its registered agent endpoint), then reads the file from the agent as
:class:`LogChunk` s. The agent is not a cluster member: the stream goes to that one
endpoint (dialed as its scheme says, with the client's TLS options), without failover.
A broken stream raises; the chunks carry their ``offset``, so a caller resumes with
``offset=`` the end of the last chunk (reading from an offset changes nothing on the
agent, so it is safe to repeat).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from accord.client.errors import Unavailable, from_rpc_error
from accord.client.transport import EndpointPool, normalize
from accord.proto import agent_pb2, agent_pb2_grpc

_rpc: Any = agent_pb2_grpc

STREAMS = ("stdout", "stderr")
"""Which of a task's files :func:`read_log` reads."""


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of a task's output file."""

    data: bytes
    offset: int
    """Where ``data`` starts in the file."""
    attempt: int
    """The attempt of the task whose file this is (the newest one when 0 was asked)."""

    @property
    def end(self) -> int:
        """The offset after this chunk (where a resumed read starts)."""
        return self.offset + len(self.data)


def check_request(stream: str, rank: int, attempt: int, offset: int) -> None:
    """ValueError unless the arguments of a log read make sense (checked before any call)."""
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
    if rank < 0 or attempt < 0 or offset < 0:
        raise ValueError(f"rank, attempt and offset must be >= 0, got {rank}, {attempt}, "
                         f"{offset}")


async def read_log(pool: EndpointPool, agent_endpoint: str, job_id: str, *, rank: int = 0,
                   attempt: int = 0, stream: str = "stdout", offset: int = 0,
                   follow: bool = False, timeout: float | None = None
                   ) -> AsyncIterator[LogChunk]:
    """The output of ``job_id``'s task ``rank`` as the agent at ``agent_endpoint`` has it.

    ``attempt`` 0 reads the newest attempt the agent has; ``follow`` keeps the stream
    open until the task has ended and its file is read to the end. ``timeout`` bounds
    the whole stream (default: the client's call timeout, or none with ``follow``)."""
    check_request(stream, rank, attempt, offset)
    deadline = timeout if timeout is not None else (None if follow else pool.call_timeout_s)
    req = agent_pb2.ReadLogRequest(job_id=job_id, rank=rank, attempt=attempt, stream=stream,
                                   offset=offset, follow=follow)
    call = _rpc.AgentStub(pool.channel(agent_endpoint)).ReadLog(req, timeout=deadline)
    try:
        async for chunk in call:
            yield LogChunk(bytes(chunk.data), int(chunk.offset), int(chunk.attempt))
    except grpc.aio.AioRpcError as e:
        err = from_rpc_error(e, normalize(agent_endpoint, pool.tls))
        if isinstance(err, Unavailable):
            err.hint = "the node's agent serves logs only while it runs: is it up and reachable?"
        raise err from None
    finally:
        call.cancel()
