"""A crash between a snapshot file's rename and the log's record of it.

A snapshot becomes durable in two steps: its file is renamed into place (and the
directory fsynced), then the next WAL batch records it (``compact`` for a local one,
``install_snapshot`` for one received from the leader). A crash or power cut between
the two leaves a snapshot file newer than the log's marker. Recovery must restore the
snapshot the log names and replay the entries after it, not restore the newer file and
then replay entries that file already contains (applying them twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack

from accord.raft.core.types import ConfState, Entry, HardState, SnapshotMeta
from accord.raft.host.multiraft import HostConfig, MultiRaftHost
from accord.raft.storage.snapshot import SnapshotStore
from accord.raft.storage.wal import WriteAheadLog, WriteBatch
from accord.raft.transport.links import PeerTransport

CS = ConfState(voters=(1,))


@dataclass
class Counter:
    """Counts applied commands: applying one twice shows in the count."""

    count: int = 0

    def apply(self, index: int, payload: bytes) -> object:
        self.count += 1
        return self.count

    def prepare_snapshot(self) -> Callable[[], bytes]:
        n = self.count
        return lambda: bytes(msgpack.packb(n))

    def restore(self, data: bytes) -> None:
        self.count = int(msgpack.unpackb(data))


def _entry(i: int) -> Entry:
    return Entry(term=1, index=i, data=msgpack.packb([99, i, b"inc"]))


def _snapshot(store: SnapshotStore, index: int) -> None:
    with store.writer(1, SnapshotMeta(index, 1, CS)) as w:
        w.write(msgpack.packb(index))
        w.finish()


async def test_a_snapshot_file_newer_than_the_logs_marker_is_not_applied_twice(
    tmp_path: Path,
) -> None:
    wal, _ = WriteAheadLog.open(tmp_path / "wal")
    store = SnapshotStore(tmp_path / "snap")
    _snapshot(store, 5)
    batch = WriteBatch()
    batch.add(1, hard_state=HardState(term=1, vote=1, commit=10),
              entries=[_entry(i) for i in range(1, 11)])
    batch.compact(1, SnapshotMeta(5, 1, CS))
    batch.set_conf_state(1, 5, CS)
    await wal.append(batch)
    _snapshot(store, 8)  # durable file; the crash comes before the log records it
    wal.close()

    wal, recovered = WriteAheadLog.open(tmp_path / "wal")
    assert recovered[1].snapshot is not None and recovered[1].snapshot.index == 5
    transport = PeerTransport(1, "127.0.0.1", 0, on_messages=lambda frm, b: None,
                              on_snapshot_chunk=lambda frm, p: asyncio.sleep(0, 0),
                              on_heartbeats=lambda frm, h, r: None)
    host = MultiRaftHost(1, wal, SnapshotStore(tmp_path / "snap"), transport,
                         HostConfig(tick_interval=0.02, election_ticks=10, snapshot_entries=1000))
    sm = Counter()
    host.add_group(1, sm, recovered.get(1), voters=(1,))
    await transport.start()
    await host.start()
    try:
        await host.read_barrier(1, timeout=10)
        assert host.group(1).applied >= 10
        assert sm.count == 10, f"entries 6..8 were applied on top of the snapshot at 8: {sm.count}"
    finally:
        await host.stop()
        await transport.stop()
        wal.close()
