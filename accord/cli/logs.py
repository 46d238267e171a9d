"""`accord jobs logs JOB [--rank R] [--stderr] [--follow]`: a task's output, through its agent.

The scheduler says where the task ran (``GetJob``'s task status, kept after the job
ended) and where that node's agent serves (``ListNodes``' agent endpoint); the agent
streams the file (``accord.agent.v1.Agent/ReadLog``).
"""

from __future__ import annotations

import sys
from typing import Any

from accord.cli import common
from accord.proto import agent_pb2, agent_pb2_grpc, scheduling_pb2_grpc
from accord.proto import scheduling_pb2 as pb

_sched: Any = scheduling_pb2_grpc
_agent: Any = agent_pb2_grpc
TIMEOUT = 20.0


def print_logs(endpoints: list[str], job_id: str, rank: int, attempt: int, stderr: bool,
               follow: bool) -> int:
    """Copy the task's output to stdout; 1 with a message when it cannot be found."""
    info = common.first(endpoints, lambda ch: _sched.SchedulerStub(ch).GetJob(
        pb.GetJobRequest(job_id=job_id), timeout=TIMEOUT))
    node = next((t.node for t in info.task_status if t.rank == rank), "")
    if not node:
        print(f"accord jobs logs: job {job_id} has no rank {rank} placed yet "
              f"({info.status})", file=sys.stderr)
        return 1
    nodes = common.first(endpoints, lambda ch: _sched.SchedulerStub(ch).ListNodes(
        pb.ListNodesRequest(), timeout=TIMEOUT)).nodes
    agent = next((n.agent_endpoint for n in nodes if n.spec.name == node), "")
    if not agent:
        print(f"accord jobs logs: node {node} has no agent serving logs", file=sys.stderr)
        return 1
    req = agent_pb2.ReadLogRequest(job_id=job_id, rank=rank, attempt=attempt,
                                   stream="stderr" if stderr else "stdout", follow=follow)
    out = sys.stdout.buffer
    with common.channel(agent, endpoints) as ch:  # its scheme says TLS or not
        stream = _agent.AgentStub(ch).ReadLog(req, timeout=None if follow else TIMEOUT)
        try:
            for chunk in stream:
                out.write(chunk.data)
                out.flush()
        except KeyboardInterrupt:
            stream.cancel()
    return 0
