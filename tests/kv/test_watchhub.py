"""The watch hub: live events, replay, filters, prev_kv, progress, compaction, slow watchers."""

from __future__ import annotations

import asyncio

import pytest

from accord.proto import kv_pb2
from accord.proto import rpc_pb2 as pb
from accord.services.kv.errors import EtcdError
from accord.services.kv.statemachine import KVStateMachine as SM
from accord.services.kv.watchhub import NODELETE, NOPUT, WatchBatch, Watcher
from tests.kv.helpers import delete, op_put, put, txn

PUT, DELETE = kv_pb2.Event.PUT, kv_pb2.Event.DELETE


def drain(w: Watcher) -> list[WatchBatch]:
    out = []
    while (b := w.poll()) is not None:
        out.append(b)
        if b.canceled:
            break
    return out


def events(w: Watcher) -> list[tuple[int, bytes, int]]:
    return [(e.type, e.kv.key, e.kv.mod_revision) for b in drain(w) for e in b.events]


def test_live_key_range_and_prefix_watches() -> None:
    sm = SM()
    hub = sm.watch_hub
    wk = hub.watch(b"a")
    wr = hub.watch(b"a", b"c")
    wp = hub.watch(b"b", b"\x00")
    put(sm, b"a")  # 2
    put(sm, b"b")  # 3
    put(sm, b"c")  # 4
    delete(sm, b"a")  # 5
    assert events(wk) == [(PUT, b"a", 2), (DELETE, b"a", 5)]
    assert events(wr) == [(PUT, b"a", 2), (PUT, b"b", 3), (DELETE, b"a", 5)]
    assert events(wp) == [(PUT, b"b", 3), (PUT, b"c", 4)]


def test_delete_event_carries_only_key_and_mod_revision_and_prev_kv_is_full() -> None:
    sm = SM()
    w = sm.watch_hub.watch(b"k", prev_kv=True)
    put(sm, b"k", b"1", lease=0)
    put(sm, b"k", b"2")
    delete(sm, b"k")
    evs = [e for b in drain(w) for e in b.events]
    assert not evs[0].HasField("prev_kv")
    assert evs[1].prev_kv.value == b"1" and evs[1].prev_kv.version == 1
    d = evs[2]
    assert d.type == DELETE
    assert d.kv == kv_pb2.KeyValue(key=b"k", mod_revision=4)
    assert d.prev_kv.value == b"2" and d.prev_kv.version == 2


def test_filters() -> None:
    sm = SM()
    noput = sm.watch_hub.watch(b"k", filters=[NOPUT])
    nodel = sm.watch_hub.watch(b"k", filters=[NODELETE])
    put(sm, b"k")
    delete(sm, b"k")
    assert events(noput) == [(DELETE, b"k", 3)]
    assert events(nodel) == [(PUT, b"k", 2)]


def test_replay_from_start_revision_is_inclusive_and_equals_live() -> None:
    sm = SM()
    live = sm.watch_hub.watch(b"\x00", b"\x00", prev_kv=True)
    put(sm, b"a", b"1")  # 2
    txn(sm, [], [op_put(b"b"), op_put(b"c")])  # 3
    delete(sm, b"a")  # 4
    put(sm, b"b", b"2")  # 5
    replay = sm.watch_hub.watch(b"\x00", b"\x00", start_revision=2, prev_kv=True)
    live_events = [e for b in drain(live) for e in b.events]
    replay_events = [e for b in drain(replay) for e in b.events]
    assert replay_events == live_events
    from3 = sm.watch_hub.watch(b"\x00", b"\x00", start_revision=3)
    assert [e.kv.mod_revision for b in drain(from3) for e in b.events] == [3, 3, 4, 5]
    put(sm, b"z")  # replayed watchers are now synced and see live events
    assert events(replay) == [(PUT, b"z", 6)]


def test_one_revision_is_never_split_across_batches() -> None:
    sm = SM()
    txn(sm, [], [op_put(b"k%d" % i) for i in range(10)])  # 2
    put(sm, b"x")
    w = sm.watch_hub.watch(b"\x00", b"\x00", start_revision=1, buffer_limit=4)
    batches = drain(w)
    assert [len(b.events) for b in batches] == [10, 1]
    w2 = sm.watch_hub.watch(b"\x00", b"\x00")
    txn(sm, [], [op_put(b"k%d" % i) for i in range(10)])
    b = w2.poll()
    assert b is not None and len(b.events) == 10 and {e.kv.mod_revision for e in b.events} == {4}


def test_future_start_revision_waits() -> None:
    sm = SM()
    w = sm.watch_hub.watch(b"k", start_revision=4)
    put(sm, b"k")  # 2
    put(sm, b"k")  # 3
    put(sm, b"k")  # 4
    assert events(w) == [(PUT, b"k", 4)]


def test_compacted_start_revision_is_cancelled_with_compact_revision() -> None:
    sm = SM()
    for _ in range(5):
        put(sm, b"k")
    sm.apply(SM.encode_compact(pb.CompactionRequest(revision=4)))
    w = sm.watch_hub.watch(b"k", start_revision=2)
    b = w.poll()
    assert b is not None and b.canceled and b.compact_revision == 4 and b.revision == 0
    assert w.poll() is b  # stays cancelled
    ok = sm.watch_hub.watch(b"k", start_revision=4)  # == compact revision is allowed
    assert events(ok) == [(PUT, b"k", 4), (PUT, b"k", 5), (PUT, b"k", 6)]


def test_slow_watcher_is_cancelled_with_an_actionable_reason() -> None:
    sm = SM()
    w = sm.watch_hub.watch(b"k", buffer_limit=3)
    for _ in range(5):
        put(sm, b"k")  # revisions 2..6
    batches = drain(w)
    assert [e.kv.mod_revision for b in batches for e in b.events] == [2, 3, 4]
    last = batches[-1]
    assert last.canceled and last.cancel_reason == (
        "accord: watcher too slow, buffer of 3 events exceeded; "
        "re-create the watch from revision 5"
    )
    assert len(sm.watch_hub) == 0
    again = sm.watch_hub.watch(b"k", start_revision=5)
    assert [r for _, _, r in events(again)] == [5, 6]


def test_replay_of_long_history_is_chunked_not_cancelled() -> None:
    sm = SM()
    for i in range(50):
        put(sm, b"k", b"%d" % i)
    w = sm.watch_hub.watch(b"k", start_revision=1, buffer_limit=8)
    assert w._queued_events <= 8 and not w.synced
    w.request_progress()  # deferred until the replay has caught up
    batches = drain(w)
    revs = [e.kv.mod_revision for b in batches for e in b.events]
    assert revs == list(range(2, 52))
    assert batches[-1].progress and batches[-1].revision == 51
    assert sum(b.progress for b in batches) == 1


def test_compaction_while_replaying_cancels() -> None:
    sm = SM()
    for _ in range(20):
        put(sm, b"k")
    w = sm.watch_hub.watch(b"k", start_revision=2, buffer_limit=2)
    sm.apply(SM.encode_compact(pb.CompactionRequest(revision=15)))
    batches = drain(w)
    assert batches[-1].canceled and batches[-1].compact_revision == 15


def test_progress_notifications() -> None:
    sm = SM()
    w = sm.watch_hub.watch(b"k", progress_notify=True)
    quiet = sm.watch_hub.watch(b"j")
    put(sm, b"other")
    assert sm.watch_hub.progress() == 2
    assert sm.watch_hub.notify_progress() == 1
    b = w.poll()
    assert b is not None and b.progress and b.revision == 2 and not b.events
    assert quiet.poll() is None
    put(sm, b"j")
    quiet.request_progress()
    bs = drain(quiet)
    assert bs[0].events and bs[1].progress and bs[1].revision == 3


def test_client_cancel_and_hub_close() -> None:
    sm = SM()
    w = sm.watch_hub.watch(b"k")
    w.close()
    b = w.poll()
    assert b is not None and b.canceled and b.cancel_reason == ""
    put(sm, b"k")
    assert w.poll() is b
    other = sm.watch_hub.watch(b"k")
    sm.watch_hub.close()
    assert other.canceled and len(sm.watch_hub) == 0
    below_b = sm.watch_hub.watch(b"", b"b")
    put(sm, b"a")
    put(sm, b"b")
    assert events(below_b) == [(PUT, b"a", 3)]
    with pytest.raises(EtcdError):
        sm.watch_hub.watch(b"k", buffer_limit=0)


async def test_next_batch_wakes_on_publish() -> None:
    sm = SM()
    w = sm.watch_hub.watch(b"k")
    task = asyncio.ensure_future(w.next_batch())
    await asyncio.sleep(0)
    assert not task.done()
    put(sm, b"k")
    batch = await asyncio.wait_for(task, timeout=5)
    assert batch.events[0].kv.key == b"k"
    task = asyncio.ensure_future(w.next_batch())
    await asyncio.sleep(0)
    w.close()
    assert (await asyncio.wait_for(task, timeout=5)).canceled


def test_watchers_follow_a_snapshot_restore() -> None:
    leader, follower = SM(), SM()
    w = follower.watch_hub.watch(b"k", prev_kv=True)
    put(leader, b"k", b"1")
    put(leader, b"k", b"2")
    follower.restore(leader.snapshot())
    evs = [(e.kv.value, e.prev_kv.value) for b in drain(w) for e in b.events]
    assert evs == [(b"1", b""), (b"2", b"1")]
    put(follower, b"k", b"3")
    assert [e.kv.value for b in drain(w) for e in b.events] == [b"3"]
