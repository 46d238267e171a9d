"""LocalBackend: durability of its command log, group commit, lease expiry, alarms."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from accord.proto import kv_pb2, rpc_pb2
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.local import LOG_NAME, SNAP_NAME, CommandLog, LocalBackend


async def _value(b: LocalBackend, key: bytes) -> bytes | None:
    resp = await b.range(rpc_pb2.RangeRequest(key=key))
    return resp.kvs[0].value if resp.kvs else None


async def test_restart_after_clean_close_keeps_state_and_identity(tmp_path: Path) -> None:
    b = await LocalBackend.open(tmp_path)
    await b.put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
    lease = await b.lease_grant(rpc_pb2.LeaseGrantRequest(TTL=600))
    await b.put(rpc_pb2.PutRequest(key=b"b", value=b"2", lease=lease.ID))
    ids, rev = b.header_info(), b.revision
    await b.close()
    assert (tmp_path / SNAP_NAME).exists() and (tmp_path / LOG_NAME).stat().st_size == 0

    b2 = await LocalBackend.open(tmp_path)
    try:
        assert b2.revision == rev
        assert (b2.header_info().cluster_id, b2.header_info().member_id) == (
            ids.cluster_id,
            ids.member_id,
        )
        assert await _value(b2, b"a") == b"1"
        ttl = await b2.lease_time_to_live(rpc_pb2.LeaseTimeToLiveRequest(ID=lease.ID, keys=True))
        assert ttl.grantedTTL == 600 and list(ttl.keys) == [b"b"]
    finally:
        await b2.close()


async def test_crash_image_replays_log_and_cuts_torn_tail(tmp_path: Path) -> None:
    live = tmp_path / "live"
    b = await LocalBackend.open(live)
    try:
        for i in range(5):
            await b.put(rpc_pb2.PutRequest(key=b"k%d" % i, value=b"v%d" % i))
        await b.delete_range(rpc_pb2.DeleteRangeRequest(key=b"k0"))
        crash = tmp_path / "crash"
        shutil.copytree(live, crash)  # what the disk holds if the process died now
        rev = b.revision
    finally:
        await b.close()
    log = crash / LOG_NAME
    good = log.stat().st_size
    torn = b"\x00\x00\x01\x00garbage-from-a-torn-write"
    await asyncio.to_thread(log.write_bytes, log.read_bytes() + torn)
    b2 = await LocalBackend.open(crash)
    try:
        assert b2.revision == rev
        assert await _value(b2, b"k0") is None and await _value(b2, b"k4") == b"v4"
        assert log.stat().st_size == good
        await b2.put(rpc_pb2.PutRequest(key=b"after", value=b"x"))
    finally:
        await b2.close()
    b3 = await LocalBackend.open(crash)
    try:
        assert await _value(b3, b"after") == b"x"
    finally:
        await b3.close()


async def test_corrupt_snapshot_is_a_clear_error(tmp_path: Path) -> None:
    b = await LocalBackend.open(tmp_path)
    await b.put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
    await b.close()
    snap = tmp_path / SNAP_NAME
    data = bytearray(snap.read_bytes())
    data[-1] ^= 0xFF
    snap.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        await LocalBackend.open(tmp_path)


async def test_group_commit_applies_in_order(tmp_path: Path) -> None:
    b = await LocalBackend.open(tmp_path)
    try:
        start = b.revision
        resps = await asyncio.gather(
            *(b.put(rpc_pb2.PutRequest(key=b"g%02d" % i, value=b"x")) for i in range(40))
        )
        assert sorted(r.header.revision for r in resps) == list(range(start + 1, start + 41))
        # Each answer carries the revision its own command got, in submission order.
        assert [r.header.revision for r in resps] == list(range(start + 1, start + 41))
        assert b.applied_index == 40
        with pytest.raises(EtcdError) as info:
            await b.put(rpc_pb2.PutRequest(key=b""))
        assert info.value == errors.EMPTY_KEY
    finally:
        await b.close()


async def test_leases_expire_and_delete_their_keys() -> None:
    b = await LocalBackend.open(
        limits=Limits(min_lease_ttl_s=1), lease_check_interval_s=0.05
    )
    try:
        lease = await b.lease_grant(rpc_pb2.LeaseGrantRequest(TTL=1))
        await b.put(rpc_pb2.PutRequest(key=b"eph", value=b"v", lease=lease.ID))
        watcher = b.watch_hub.watch(b"eph")
        batch = await asyncio.wait_for(watcher.next_batch(), 5)
        assert [e.type for e in batch.events] == [kv_pb2.Event.DELETE]
        assert await _value(b, b"eph") is None
        ttl = await b.lease_time_to_live(rpc_pb2.LeaseTimeToLiveRequest(ID=lease.ID))
        assert ttl.TTL == -1
        assert await b.lease_keepalive(lease.ID) == 0
    finally:
        await b.close()


async def test_nospace_alarm_blocks_writes_but_not_reads_or_deletes() -> None:
    b = await LocalBackend.open()
    try:
        await b.put(rpc_pb2.PutRequest(key=b"a", value=b"1"))
        act = rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.ACTIVATE, alarm=rpc_pb2.NOSPACE,
                                   memberID=b.member_id)
        assert await b.alarm(act) == [(b.member_id, rpc_pb2.NOSPACE)]
        with pytest.raises(EtcdError) as info:
            await b.put(rpc_pb2.PutRequest(key=b"b", value=b"2"))
        assert info.value == errors.NO_SPACE
        with pytest.raises(EtcdError):
            await b.lease_grant(rpc_pb2.LeaseGrantRequest(TTL=60))
        assert await _value(b, b"a") == b"1"
        read_only = rpc_pb2.TxnRequest(
            success=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"a"))]
        )
        assert (await b.txn(read_only)).succeeded
        delete_only = rpc_pb2.TxnRequest(
            success=[rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=b"z"))]
        )
        assert (await b.txn(delete_only)).succeeded
        with_put = rpc_pb2.TxnRequest(
            failure=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"z", value=b"v"))]
        )
        with pytest.raises(EtcdError) as tinfo:
            await b.txn(with_put)
        assert tinfo.value == errors.NO_SPACE
        await b.delete_range(rpc_pb2.DeleteRangeRequest(key=b"a"))
        status = await b.status()
        assert status.errors == (f"memberID:{b.member_id} alarm:NOSPACE ",)
        get = await b.alarm(rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.GET))
        assert get == [(b.member_id, rpc_pb2.NOSPACE)]
        deact = rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.DEACTIVATE, alarm=rpc_pb2.NOSPACE,
                                     memberID=b.member_id)
        await b.alarm(deact)
        await b.put(rpc_pb2.PutRequest(key=b"b", value=b"2"))
    finally:
        await b.close()


async def test_replayed_log_gives_the_same_server_chosen_lease_ids(tmp_path: Path) -> None:
    live = tmp_path / "live"
    b = await LocalBackend.open(live)
    try:
        granted = [(await b.lease_grant(rpc_pb2.LeaseGrantRequest(TTL=600))).ID for _ in range(3)]
        crash = tmp_path / "crash"
        shutil.copytree(live, crash)
    finally:
        await b.close()
    b2 = await LocalBackend.open(crash)
    try:
        listed = sorted(s.ID for s in (await b2.lease_leases()).leases)
        assert listed == sorted(granted)
    finally:
        await b2.close()


async def test_log_compaction_and_defragment_under_concurrent_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = CommandLog.write_snapshot

    def slow_write_snapshot(self: CommandLog, index: int, data: bytes) -> None:
        time.sleep(0.02)  # widen the window in which a concurrent append could be lost
        original(self, index, data)

    monkeypatch.setattr(CommandLog, "write_snapshot", slow_write_snapshot)
    b = await LocalBackend.open(tmp_path, compact_log_bytes=2_000)
    try:

        async def writer(n: int) -> None:
            for i in range(30):
                await b.put(rpc_pb2.PutRequest(key=b"w%d/%02d" % (n, i), value=b"x" * 50))

        async def defragmenter() -> None:
            for _ in range(10):
                await asyncio.sleep(0.005)
                await b.defragment()

        await asyncio.gather(writer(0), writer(1), defragmenter(), writer(2))
        assert (tmp_path / LOG_NAME).stat().st_size < 20_000  # compacted along the way
        rev = b.revision
        crash = tmp_path.parent / (tmp_path.name + "-crash")
        shutil.copytree(tmp_path, crash)
    finally:
        await b.close()
    b2 = await LocalBackend.open(crash)
    try:
        assert b2.revision == rev
        resp = await b2.range(rpc_pb2.RangeRequest(key=b"w", range_end=b"x", count_only=True))
        assert resp.count == 90
    finally:
        await b2.close()
