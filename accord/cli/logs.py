"""`accord jobs logs JOB [--rank R] [--stderr] [--follow]`: a task's output, through its agent.

``client.scheduler.logs`` (:mod:`accord.client.tasklogs`) finds where the task ran (the
job's task status, kept after the job ended) and where that node's agent serves (its
registered agent endpoint), and streams the file from the agent
(``accord.agent.v1.Agent/ReadLog``); this copies it to stdout as it comes.
"""

from __future__ import annotations

import sys

from accord.client.sync import SyncClient
from accord.client.tasklogs import check_request


def print_logs(c: SyncClient, job_id: str, rank: int, attempt: int, stderr: bool,
               follow: bool) -> int:
    """Copy the task's output to stdout; 1 with a message for a bad ``--rank`` or
    ``--attempt`` (a job, rank or agent that cannot be found is a
    :class:`~accord.client.errors.NotFound`, which the command reports)."""
    stream = "stderr" if stderr else "stdout"
    try:
        check_request(stream, rank, attempt, 0)
    except ValueError as e:
        print(f"accord jobs logs: {e}", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    with c.scheduler.logs(job_id, rank=rank, attempt=attempt, stream=stream,
                          follow=follow) as chunks:
        try:
            for chunk in chunks:
                out.write(chunk.data)
                out.flush()
        except KeyboardInterrupt:
            pass
    return 0
