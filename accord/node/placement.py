"""Which worker process of a node hosts which Raft group (``docs/workers.md``).

A node of ``N`` workers splits its groups by a fixed rule, the same on every node, so
that worker ``k`` of one node only ever talks Raft to worker ``k`` of the others:

* KV shard ``s`` (group ``kv_group(s)``) lives in worker ``s mod N``;
* the meta group (1), the scheduler's (3) and the checkpoints' (4) live in worker 0.

Each worker has its own data directory (``<data-dir>/worker-<k>``), its own peer port
(``P + k`` for the node's peer port ``P``) and its own forwarding socket
(``<sockets>/worker-<k>.sock``) on which the other workers hand it calls for its shards,
and its metrics socket (``<sockets>/worker-<k>.metrics.sock``) that the supervisor
scrapes; ``<sockets>`` is a directory the supervisor makes in the system's temporary
directory (``server.SOCKETS_ENV``), not the data directory, which may be on a file system
without Unix sockets.
With one worker nothing moves: the data directory and the ports are the node's own, so a
node's layout does not change until it runs several workers.

``N`` is fixed when a data directory is created, as ``--shards`` is: ``check_workers``
records it and refuses a restart with another value, naming both (moving groups between
workers' logs would be a tool of its own, like resharding).

Pure functions plus one small file; nothing here starts a process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accord.node.backend import KV_GROUP, KV_SHARD_GROUP_BASE, kv_group
from accord.node.members import META_GROUP
from accord.services.checkpoints.replicated import CHECKPOINT_GROUP
from accord.services.scheduling.replicated import SCHEDULING_GROUP

MAX_WORKERS = 64
"""More workers than this per node is a typo, not a machine (and a port range)."""

WORKERS_FILE = "workers"
"""The file in a data directory that records the worker count it was created with."""

UNIX_PATH_MAX = 107
"""Longest Unix socket path Linux accepts (``sun_path`` is 108 bytes with its NUL)."""

NODE_GROUPS = (META_GROUP, SCHEDULING_GROUP, CHECKPOINT_GROUP)
"""The node-wide groups, all in worker 0."""


class PlacementError(ValueError):
    """A worker layout that cannot work; the message says what to change."""


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """The split of a node's ``shards`` KV shards and node-wide groups over ``workers``."""

    workers: int
    shards: int

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise PlacementError(f"--workers must be between 1 and {MAX_WORKERS}, got {self.workers}")
        if self.shards < 1:
            raise PlacementError(f"--shards must be at least 1, got {self.shards}")
        if self.workers > self.shards:
            raise PlacementError(
                f"--workers {self.workers} needs at least as many shards (--shards is "
                f"{self.shards}): a worker without a shard would only cost memory; raise "
                f"--shards when the cluster is created or lower --workers")

    def worker_of_shard(self, shard: int) -> int:
        """The worker that hosts KV shard ``shard``."""
        if not 0 <= shard < self.shards:
            raise PlacementError(f"shard {shard} is outside 0..{self.shards - 1}")
        return shard % self.workers

    def worker_of_group(self, group_id: int) -> int:
        """The worker that hosts Raft group ``group_id`` (a KV shard or a node-wide group)."""
        if group_id in NODE_GROUPS:
            return 0
        return self.worker_of_shard(shard_of_group(group_id))

    def shards_of(self, worker: int) -> list[int]:
        """The KV shards worker ``worker`` hosts, in order."""
        self._check_worker(worker)
        return list(range(worker, self.shards, self.workers))

    def groups_of(self, worker: int) -> list[int]:
        """Every Raft group worker ``worker`` hosts: the node-wide ones on worker 0, then
        its KV shards' groups."""
        node = list(NODE_GROUPS) if worker == 0 else []
        return node + [kv_group(s) for s in self.shards_of(worker)]

    def data_dir(self, base: Path, worker: int) -> Path:
        """Worker ``worker``'s data directory (the node's own with one worker)."""
        self._check_worker(worker)
        return base if self.workers == 1 else base / f"worker-{worker}"

    def peer_port(self, port: int, worker: int) -> int:
        """Worker ``worker``'s peer port for a node whose peer port is ``port``."""
        self._check_worker(worker)
        if not 0 < port or port + self.workers - 1 > 65535:
            raise PlacementError(
                f"peer port {port} leaves no room for {self.workers} workers "
                f"(ports {port}..{port + self.workers - 1} must all be below 65536)")
        return port + worker

    def forward_socket(self, base: Path, worker: int) -> Path:
        """The Unix socket on which worker ``worker`` takes calls the others forward."""
        return self._socket(base, worker, "sock", "forwarding")

    def metrics_socket(self, base: Path, worker: int) -> Path:
        """The Unix socket on which worker ``worker`` serves its own ``/metrics`` and
        health endpoints to the supervisor (``workermetrics.py``)."""
        return self._socket(base, worker, "metrics.sock", "metrics")

    def _socket(self, base: Path, worker: int, suffix: str, what: str) -> Path:
        self._check_worker(worker)
        path = base / f"worker-{worker}.{suffix}"
        if len(str(path).encode()) > UNIX_PATH_MAX:
            raise PlacementError(
                f"the {what} socket {str(path)!r} is longer than the {UNIX_PATH_MAX} bytes "
                f"a Unix socket path may have: use a shorter directory for it (TMPDIR)")
        return path

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise PlacementError(f"worker {worker} is outside 0..{self.workers - 1}")


def shard_of_group(group_id: int) -> int:
    """The KV shard whose group is ``group_id`` (inverse of ``kv_group``)."""
    if group_id == KV_GROUP:
        return 0
    if group_id > KV_SHARD_GROUP_BASE:
        return group_id - KV_SHARD_GROUP_BASE
    raise PlacementError(f"group {group_id} is neither a KV shard nor a node-wide group")


def check_workers(data_dir: Path, workers: int) -> None:
    """Record ``workers`` in a new data directory, or check it against the recorded one.

    A directory without the file that already holds a node's state was made by a node of
    one worker (before workers existed); it may only restart with one.
    """
    path = data_dir / WORKERS_FILE
    if path.exists():
        text = path.read_text().strip()
        try:
            recorded = int(text)
        except ValueError:
            raise PlacementError(f"{path} should hold the worker count, holds {text[:40]!r}") from None
    elif data_dir.exists() and any(p.name != WORKERS_FILE for p in data_dir.iterdir()):
        recorded = 1
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{workers}\n")
        tmp.replace(path)
        return
    if recorded != workers:
        raise PlacementError(
            f"the data directory {data_dir} was created with --workers {recorded}; it cannot "
            f"restart with --workers {workers} (groups would move between workers' logs): "
            f"start it with --workers {recorded}")
