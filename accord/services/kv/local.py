"""A single-process backend: commands are applied directly to one in-process state machine.

For tests, embedding and ``python -m accord.node.grpc_server``: no Raft, no peers. This member
is its own leader (term 1), every read is trivially linearizable, and the cluster has
exactly one member.

Durability (only with a data directory): every command is appended to ``kv.log`` and
fsynced before it is applied and answered. Commands that arrive in the same event-loop
turn share one write and one fsync (group commit). Each record is
``u32 length | u32 crc32c | u64 index | command``; a torn or corrupt tail (a crash
mid-write) is cut off on open. When the log passes ``compact_log_bytes`` (and on close)
the state is written to ``kv.snap`` (atomically, with the index it covers) and the log
restarts empty; records at or below the snapshot's index are skipped on replay, so a
crash between the two steps loses nothing and applies nothing twice. Replaying a command
reproduces its effect exactly because apply is deterministic (lease commands carry their
clock).

Background tasks, owned and stopped by :meth:`LocalBackend.close`: lease expiry (every
``lease_check_interval_s``, proposes an expire command for overdue leases) and periodic
watch progress notifications (every ``progress_notify_interval_s``, etcd's default 10 min).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c

from accord.raft.storage.files import fsync_dir, replace_durably
from accord.services.cluster import snapfile
from accord.services.kv import errors
from accord.services.kv.backend import (
    ETCD_COMPAT_VERSION,
    HeaderInfo,
    MemberInfo,
    StateMachineBackend,
    StatusInfo,
)
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.statemachine import KVStateMachine

_REC = struct.Struct(">IIQ")
_SNAP_MAGIC = b"ACKVSNP1"
_SNAP_HEAD = struct.Struct(">8sQI")
LOG_NAME = "kv.log"
SNAP_NAME = "kv.snap"
MEMBER_NAME = "member.json"

_NOT_REPLICATED = (
    "accord: membership changes need a replicated accord node; this server runs the "
    "single-process local backend (start accord nodes with `accord serve` instead)"
)


def _random_id() -> int:
    """A non-zero 63-bit id (etcd's ids are uint64; 63 bits keep JSON tools exact)."""
    return secrets.randbits(63) or 1


class CommandLog:
    """Append-only, checksummed command log with a snapshot beside it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.log_path = directory / LOG_NAME
        self.snap_path = directory / SNAP_NAME
        self._fd: int | None = None
        self.size = 0

    def load(self) -> tuple[int, bytes | None, list[tuple[int, bytes]]]:
        """``(snapshot_index, snapshot_or_None, [(index, command), ...])``; cuts a torn tail."""
        snap_index, snap = 0, None
        if self.snap_path.exists():
            raw = self.snap_path.read_bytes()
            if len(raw) < _SNAP_HEAD.size:
                raise ValueError(f"{self.snap_path}: truncated snapshot file")
            magic, snap_index, crc = _SNAP_HEAD.unpack_from(raw)
            body = raw[_SNAP_HEAD.size :]
            if magic != _SNAP_MAGIC or crc32c.crc32c(body) != crc:
                raise ValueError(f"{self.snap_path}: not an accord KV snapshot or corrupt")
            snap = body
        records: list[tuple[int, bytes]] = []
        good = 0
        if self.log_path.exists():
            raw = self.log_path.read_bytes()
            pos = 0
            while pos + _REC.size <= len(raw):
                length, crc, index = _REC.unpack_from(raw, pos)
                end = pos + _REC.size + length
                if end > len(raw):
                    break
                body = raw[pos + _REC.size : end]
                if crc32c.crc32c(struct.pack(">Q", index) + body) != crc:
                    break
                if index > snap_index:
                    records.append((index, body))
                pos = good = end
            if good != len(raw):
                with open(self.log_path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
        self.size = good
        return snap_index, snap, records

    def open(self) -> None:
        """Open the log for appending."""
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, records: Sequence[tuple[int, bytes]]) -> None:
        """Write and fsync records (blocking: call it from a worker thread)."""
        if self._fd is None:
            raise RuntimeError("command log is not open")
        buf = bytearray()
        for index, body in records:
            crc = crc32c.crc32c(struct.pack(">Q", index) + body)
            buf += _REC.pack(len(body), crc, index) + body
        os.write(self._fd, bytes(buf))
        os.fsync(self._fd)
        self.size += len(buf)

    def write_snapshot(self, index: int, data: bytes) -> None:
        """Atomically replace the snapshot, then restart the log empty (blocking)."""
        tmp = self.snap_path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(_SNAP_HEAD.pack(_SNAP_MAGIC, index, crc32c.crc32c(data)) + data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.snap_path)
        fsync_dir(self.dir)
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
        self.size = 0

    def close(self) -> None:
        """Close the log file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LocalBackend(StateMachineBackend):
    """:class:`~accord.services.kv.backend.Backend` on one in-process ``KVStateMachine``."""

    def __init__(
        self,
        sm: KVStateMachine,
        *,
        cluster_id: int,
        member_id: int,
        name: str,
        client_urls: Sequence[str] = (),
        log: CommandLog | None = None,
        applied_index: int = 0,
        lease_check_interval_s: float = 0.5,
        progress_notify_interval_s: float = 600.0,
        compact_log_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        super().__init__(sm)
        self.cluster_id = cluster_id
        self.member_id = member_id
        self.name = name
        self.client_urls: tuple[str, ...] = tuple(client_urls)
        self.peer_urls: tuple[str, ...] = ()
        self._log = log
        self.applied_index = applied_index
        self._compact_log_bytes = compact_log_bytes
        self._pending: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._log_lock = asyncio.Lock()
        """Held while appending to the log and while replacing it by a snapshot."""
        self._flush_task: asyncio.Task[None] | None = None
        self._lease_interval = lease_check_interval_s
        self._progress_interval = progress_notify_interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._size_cache: tuple[int, int] = (-1, 0)

    # --- construction -------------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        name: str = "default",
        client_url: str = "",
        limits: Limits | None = None,
        max_request_bytes: int | None = None,
        **options: Any,
    ) -> LocalBackend:
        """Create (``data_dir=None``: in memory) or reopen a local store and start its tasks."""
        if max_request_bytes is not None:
            base = limits or Limits()
            fields = {f: getattr(base, f) for f in base.__slots__}
            fields["max_request_bytes"] = max_request_bytes
            limits = Limits(**fields)
        log = None
        applied = 0
        if data_dir is None:
            cluster_id, member_id = _random_id(), _random_id()
            sm = KVStateMachine(limits=limits, lease_id_seed=member_id)
        else:
            directory = Path(data_dir)
            cluster_id, member_id = await asyncio.to_thread(_identity, directory)
            # The seed of server-chosen lease ids must be the same on every replay of the
            # log: the member id is persisted, so it is.
            sm = KVStateMachine(limits=limits, lease_id_seed=member_id)
            log = CommandLog(directory)
            snap_index, snap, records = await asyncio.to_thread(log.load)
            if snap is not None:
                sm.restore(snap)
            applied = snap_index
            for index, command in records:
                with contextlib.suppress(EtcdError):  # it failed the same way the first time
                    sm.apply(command)
                applied = index
            log.open()
        backend = cls(
            sm,
            cluster_id=cluster_id,
            member_id=member_id,
            name=name,
            client_urls=[client_url] if client_url else [],
            log=log,
            applied_index=applied,
            **options,
        )
        backend.start()
        return backend

    def start(self) -> None:
        """Start the lease-expiry and progress-notify loops (idempotent)."""
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._expire_loop(), name="local-lease-expiry"),
            asyncio.create_task(self._progress_loop(), name="local-progress-notify"),
        ]

    async def close(self) -> None:
        """Stop the background tasks, flush, snapshot the log away, close the files."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._flush_task is not None:
            with contextlib.suppress(Exception):
                await self._flush_task
        self.sm.watch_hub.close()
        if self._log is not None:
            if self._log.size > 0:
                await self._write_snapshot()
            self._log.close()

    def set_client_urls(self, urls: Sequence[str]) -> None:
        """The URLs MemberList reports for this member (known once the port is bound)."""
        self.client_urls = tuple(urls)

    # --- StateMachineBackend ---------------------------------------------------------------
    def header_info(self) -> HeaderInfo:
        """This member is the leader of its own single-member cluster, in term 1."""
        return HeaderInfo(self.cluster_id, self.member_id, 1, self.member_id)

    async def read_barrier(self, shard: int = 0) -> None:
        """Nothing to wait for: every committed command is already applied here."""

    async def commit(self, command: bytes, shard: int = 0) -> Any:
        """Apply ``command`` (after logging it durably when there is a data directory);
        a local backend has one shard."""
        if shard != 0:
            raise ValueError(f"the local backend has one shard, not shard {shard}")
        if self._closed:
            raise errors.EtcdError(errors.NO_LEADER.code, errors.MSG_NO_LEADER, "backend closed")
        if self._log is None:
            self.applied_index += 1
            return self.sm.apply(command)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((command, fut))
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self._flush(), name="local-log-flush")
        return await fut

    async def _flush(self) -> None:
        """Group commit: log every pending command with one fsync, then apply them in order."""
        log = self._log
        assert log is not None
        while self._pending:
            async with self._log_lock:
                batch, self._pending = self._pending, []
                if not await self._append_and_apply(log, batch):
                    return
            if log.size > self._compact_log_bytes:
                await self._write_snapshot()

    async def _append_and_apply(
        self, log: CommandLog, batch: list[tuple[bytes, asyncio.Future[Any]]]
    ) -> bool:
        """Log one batch with one fsync, then apply it; False if the log failed."""
        first = self.applied_index + 1
        records = [(first + i, cmd) for i, (cmd, _f) in enumerate(batch)]
        try:
            await asyncio.to_thread(log.append, records)
        except OSError as e:
            # A failed write or fsync: acknowledge nothing, and stop accepting writes.
            self._closed = True
            err = EtcdError(errors.NO_LEADER.code, errors.MSG_NO_LEADER, f"log write failed: {e}")
            for _cmd, fut in batch + self._pending:
                if not fut.done():
                    fut.set_exception(err)
            self._pending = []
            return False
        for index, (cmd, fut) in zip(range(first, first + len(batch)), batch, strict=True):
            self.applied_index = index
            try:
                result = self.sm.apply(cmd)
            except EtcdError as e:
                if not fut.done():
                    fut.set_exception(e)
                continue
            if not fut.done():
                fut.set_result(result)
        return True

    async def _write_snapshot(self) -> None:
        """Snapshot the state as of now into the log's directory (serialized off the loop)."""
        log = self._log
        assert log is not None
        async with self._log_lock:  # no append may land between the capture and the truncate
            index, serialize = self.applied_index, self.sm.prepare_snapshot()
            await asyncio.to_thread(lambda: log.write_snapshot(index, serialize()))

    async def _image(self) -> bytes:
        """The state machine's snapshot bytes, serialized in a worker thread."""
        return await asyncio.to_thread(self.sm.prepare_snapshot())

    # --- background loops -----------------------------------------------------------------
    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lease_interval)
            await self.expire_leases()

    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(self._progress_interval)
            self.sm.watch_hub.notify_progress()

    # --- cluster ---------------------------------------------------------------------------
    def _self(self) -> MemberInfo:
        return MemberInfo(self.member_id, self.name, self.peer_urls, self.client_urls, False)

    async def members(self, linearizable: bool = False) -> list[MemberInfo]:
        """The one member."""
        return [self._self()]

    async def member_add(
        self, peer_urls: Sequence[str], is_learner: bool
    ) -> tuple[MemberInfo, list[MemberInfo]]:
        """Refused: a local backend cannot grow."""
        raise EtcdError(errors.NOT_LEADER.code, _NOT_REPLICATED)

    async def member_remove(self, member_id: int) -> list[MemberInfo]:
        """Unknown ids: etcd's member-not-found; this member: refused."""
        if member_id != self.member_id:
            raise errors.MEMBER_NOT_FOUND
        raise EtcdError(errors.NOT_LEADER.code, _NOT_REPLICATED)

    async def member_update(self, member_id: int, peer_urls: Sequence[str]) -> list[MemberInfo]:
        """Record new peer URLs for this member."""
        if member_id != self.member_id:
            raise errors.MEMBER_NOT_FOUND
        self.peer_urls = tuple(peer_urls)
        return [self._self()]

    async def member_promote(self, member_id: int) -> list[MemberInfo]:
        """This member is a voter already: etcd's answer for promoting a voter."""
        if member_id != self.member_id:
            raise errors.MEMBER_NOT_FOUND
        raise EtcdError(
            errors.NOT_LEADER.code, "etcdserver: can only promote a learner member"
        )

    # --- maintenance -----------------------------------------------------------------------
    async def _db_size(self) -> int:
        """Size of the state image, recomputed (off the loop) only when the revision moved."""
        rev, size = self._size_cache
        if rev != self.sm.revision:
            rev = self.sm.revision
            size = len(await self._image())
            self._size_cache = (rev, size)
        return size

    async def status(self) -> StatusInfo:
        """Version, sizes, and this member as leader."""
        size = await self._db_size()
        disk = self._log.size if self._log is not None else 0
        return StatusInfo(
            version=ETCD_COMPAT_VERSION,
            db_size=max(size, disk),
            db_size_in_use=size,
            leader=self.member_id,
            raft_index=self.applied_index,
            raft_term=1,
            raft_applied_index=self.applied_index,
            errors=self.alarms.names(),
        )

    async def snapshot(self) -> tuple[int, bytes]:
        """A backup file (``snapfile.py``) of the state machine at the current revision,
        as the group a node keeps shard 0 in (``snapfile.KV_SHARD0_GROUP``)."""
        revision, serialize = self.sm.revision, self.sm.prepare_snapshot()
        group = snapfile.KV_SHARD0_GROUP

        def build() -> bytes:
            return snapfile.encode(revision, {group: serialize()}, [group])

        return revision, await asyncio.to_thread(build)

    async def defragment(self) -> None:
        """Compact the command log into the snapshot file (nothing to do in memory)."""
        if self._log is not None and self._log.size > 0:
            await self._write_snapshot()

    async def hash(self) -> int:
        """CRC32C of the whole state image (``KVStateMachine.prepare_hash``'s: without the
        lease clock, which moves while nothing is written)."""
        return int(crc32c.crc32c(await asyncio.to_thread(self.sm.prepare_hash())))

    async def move_leader(self, target_id: int) -> None:
        """Already the leader of a one-member cluster; any other target is unknown."""
        if target_id != self.member_id:
            raise errors.BAD_LEADER_TRANSFEREE


def _identity(directory: Path) -> tuple[int, int]:
    """The persisted (cluster_id, member_id) of a data directory, created on first use."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MEMBER_NAME
    if path.exists():
        data = json.loads(path.read_text())
        return int(data["cluster_id"]), int(data["member_id"])
    ids = _random_id(), _random_id()
    replace_durably(path, json.dumps({"cluster_id": ids[0], "member_id": ids[1]}).encode())
    return ids
