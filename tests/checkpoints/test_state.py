"""The checkpoint state machine: protocol, fencing, leases, retention, garbage, snapshots."""

from __future__ import annotations

import msgpack

from accord.services.checkpoints.model import ABORTED, COMMITTED, DELETED, PENDING
from accord.services.checkpoints.state import CheckpointStateMachine
from tests.checkpoints.helpers import Driver, records, shard


def test_save_moves_latest_and_manifest_has_everything_a_loader_needs() -> None:
    d = Driver()
    d.save(step=10)
    job, st = d.sm.manifest("j")
    assert job.latest == 10 and st.state == COMMITTED
    assert sorted(st.shards) == [f"rank-{r}" for r in range(4)]
    sh = st.shards["rank-2"]
    assert sh.uri == "file:///ckpt/j/step-10/rank-2" and sh.locations[0].tier == "shared_fs"
    assert sh.tensors[0].global_shape == (12,) and sh.tensors[0].offsets == (8,)
    assert st.layout.world_size == 4 and st.layout.dp == 4


def test_commit_with_missing_shards_is_refused_names_them_and_changes_nothing() -> None:
    d = Driver()
    d.save(step=1)
    assert d.begin(step=2)["ok"]
    assert d.register(step=2, ranks=[0, 2])["ok"]
    before = d.sm.snapshot()
    r = d.commit(step=2)
    assert not r["ok"] and r["kind"] == "precondition"
    assert r["missing"] == ["rank-1", "rank-3"]
    assert "rank-1 (rank 1)" in r["error"] and "rank-3 (rank 3)" in r["error"]
    assert d.sm.jobs["j"].latest == 1 and d.sm.jobs["j"].steps[2].state == PENDING
    assert records(d.sm) == _state_of(before)


def _state_of(snap: bytes) -> object:
    doc = msgpack.unpackb(snap, raw=False, strict_map_key=False)
    del doc["applied"], doc["clock"]
    return doc


def test_register_is_idempotent_and_a_different_checksum_changes_nothing() -> None:
    d = Driver()
    d.begin()
    assert d.register(ranks=[0, 1])["registered"] == 2
    again = d.register(ranks=[0, 1])
    assert again["ok"] and again["registered"] == 0 and again["duplicates"] == 2
    before = records(d.sm)
    bad = d.do("register", job="j", step=1, token=1,
               shards=[shard(2), shard(0, data=b"other bytes")])
    assert not bad["ok"] and bad["kind"] == "exists"
    assert "rank-0" in bad["error"] and "already registered with checksum" in bad["error"]
    assert records(d.sm) == before  # rank-2 in the same batch was not registered either


def test_bad_input_is_refused_with_a_clear_error_and_changes_nothing() -> None:
    d = Driver()
    d.save(step=5)
    before = records(d.sm)
    cases = {
        "negative": (d.begin(step=-1), "invalid", "negative"),
        "unknown job": (d.commit(job="nope"), "not_found", "unknown"),
        "exists": (d.begin(step=5), "exists", "already exists"),
        "committed": (d.do("register", job="j", step=5, token=1, shards=[shard(1)]), "exists",
                      "committed"),
    }
    for name, (r, kind, text) in cases.items():
        assert not r["ok"] and r["kind"] == kind and text in r["error"], (name, r)
    assert records(d.sm) == before
    assert d.begin(step=6)["ok"]
    before = records(d.sm)
    outside = d.do("register", job="j", step=6, token=1, shards=[shard(9)])
    assert outside["kind"] == "invalid" and "not in the expected shard set" in outside["error"]
    wrong_rank = d.do("register", job="j", step=6, token=1, shards=[{**shard(1), "rank": 2}])
    assert "expected from rank 1, not rank 2" in wrong_rank["error"]
    for uri in ("no-scheme/path", "file:///with space", ""):
        r = d.do("register", job="j", step=6, token=1, shards=[{**shard(1), "uri": uri}])
        assert not r["ok"] and r["kind"] == "invalid" and "uri" in r["error"], r
    no_sum = d.do("register", job="j", step=6, token=1,
                  shards=[{**shard(1), "checksum": ["crc32c", ""]}])
    assert "checksum is missing" in no_sum["error"]
    big = d.do("begin", job="j", step=7, token=1, layout={"world_size": 4},
               expected=[[f"s{i}", 0] for i in range(70_000)])
    assert big["kind"] == "too_large" and "at most 65536" in big["error"]
    assert records(d.sm) == before


def test_a_stale_token_is_refused_naming_the_current_one_and_changes_nothing() -> None:
    d = Driver()
    d.save(step=1, token=7)
    assert d.begin(step=2, token=7)["ok"]
    assert d.register(step=2, token=7, ranks=[0, 1])["ok"]
    # The job restarts: the new incarnation (token 9) begins step 2 again.
    r = d.begin(step=2, token=9)
    assert r["ok"] and r["superseded"] == [2]
    before = records(d.sm)
    for r in (d.register(step=2, token=7, ranks=[2, 3]), d.commit(step=2, token=7),
              d.begin(step=3, token=7), d.do("abort", job="j", step=2, token=7)):
        assert not r["ok"] and r["kind"] == "stale" and r["current"] == 9, r
        assert "token 7 is stale" in r["error"] and "token 9" in r["error"]
    assert records(d.sm) == before
    assert d.register(step=2, token=9)["ok"] and d.commit(step=2, token=9)["latest"] == 2


def test_a_commit_is_accepted_once() -> None:
    d = Driver()
    d.begin()
    d.register()
    assert d.commit()["ok"]
    again = d.commit()
    assert not again["ok"] and again["kind"] == "exists" and "committed once" in again["error"]


def test_retried_command_ids_apply_once() -> None:
    d = Driver()
    d.begin()
    d.register()
    cmd = {"id": "same", "op": "commit", "job": "j", "step": 1, "token": 1, "now": d.now}
    assert d.sm.apply(cmd)["ok"]
    assert d.sm.apply(cmd) == {"ok": True, "latest": 1, "latest_changed": True, "duplicate": True}


def test_pending_steps_expire_and_an_expired_lease_refuses_commit() -> None:
    d = Driver()
    d.begin(step=1, lease_s=10)
    d.register(ranks=[0, 1])  # renews the lease to now + 10
    d.now += 8
    assert d.register(ranks=[2])["ok"]
    d.now += 9  # 17 s after begin, 9 after the last renewal: still leased
    assert not d.sm.expired_pending(d.now)
    d.now += 2
    assert d.sm.expired_pending(d.now)
    r = d.commit()
    assert not r["ok"] and "lease ran out" in r["error"]
    exp = d.do("expire")
    assert exp["expired"] == [["j", 1]]
    st = d.sm.jobs["j"].steps[1]
    assert st.state == ABORTED and "lease expired" in st.reason
    assert {g.uri for g in d.sm.garbage_of()} == {f"file:///ckpt/j/step-1/rank-{r}"
                                                 for r in range(3)}


def test_retention_keeps_last_every_within_pins_and_always_latest() -> None:
    d = Driver()
    for step in range(1, 11):
        d.save(step=step * 100)
        d.now += 60
    d.do("pin", job="j", step=200)
    d.do("set_retention", job="j", retention={"keep_last": 2, "keep_every": 500,
                                              "keep_within_s": 130})
    r = d.do("gc")
    kept = sorted(s for s, st in d.sm.jobs["j"].steps.items() if st.state == COMMITTED)
    assert kept == [200, 500, 900, 1000]  # pinned, every 500th, last 2 (within 130 s too)
    assert sorted(s for _, s in r["deleted"]) == [100, 300, 400, 600, 700, 800]
    assert all(d.sm.jobs["j"].steps[s].state == DELETED for _, s in r["deleted"])
    d.do("set_retention", job="j", retention={"keep_last": 0, "keep_every": 7})
    d.do("unpin", job="j", step=200)
    d.do("gc")
    job = d.sm.jobs["j"]
    assert [s for s, st in job.steps.items() if st.state == COMMITTED] == [1000] == [job.latest]


def test_gc_never_reports_a_referenced_uri_and_records_confirmed_deletions() -> None:
    d = Driver()
    d.save(step=1)
    # Step 2 reuses rank 0's file of step 1 (frozen weights): shared by two manifests.
    d.begin(step=2)
    shared = shard(0, step=1)
    d.do("register", job="j", step=2, token=1, shards=[shared] + [shard(r, step=2)
                                                                  for r in (1, 2, 3)])
    d.commit(step=2)
    d.do("set_retention", job="j", retention={"keep_last": 1})
    d.do("gc")
    garbage = {g.uri for g in d.sm.garbage_of()}
    assert garbage == {f"file:///ckpt/j/step-1/rank-{r}" for r in (1, 2, 3)}
    refused = d.do("confirm_deleted", uris=[shared["uri"]])
    assert not refused["ok"] and "referenced by a kept manifest" in refused["error"]
    assert d.do("confirm_deleted", uris=sorted(garbage))["confirmed"] == 3
    assert d.sm.garbage_of() == []
    again = d.do("confirm_deleted", uris=sorted(garbage))
    assert again["kind"] == "not_found"


def test_tier_moves_are_recorded_per_shard_and_dropped_copies_become_garbage() -> None:
    d = Driver()
    d.save(step=1)
    nvme = d.sm.jobs["j"].steps[1].shards["rank-0"].uri
    r = d.do("move_tier", job="j", step=1, shard_id="rank-0",
             add=["s3://bucket/j/1/rank-0", ""], drop=[nvme])
    assert r["locations"] == [["s3://bucket/j/1/rank-0", "object_store"]]
    sh = d.sm.jobs["j"].steps[1].shards["rank-0"]
    assert sh.uri == "s3://bucket/j/1/rank-0" and sh.locations[0].tier == "object_store"
    assert [g.uri for g in d.sm.garbage_of()] == [nvme]
    bad = d.do("move_tier", job="j", step=1, shard_id="rank-0", drop=["s3://bucket/j/1/rank-0"])
    assert not bad["ok"] and "without a location" in bad["error"]


def test_snapshot_restore_round_trips_everything() -> None:
    d = Driver()
    d.save(step=1)
    d.begin(step=2)
    d.register(step=2, ranks=[1])
    d.do("pin", job="j", step=1)
    other = CheckpointStateMachine()
    other.restore(d.sm.snapshot())
    assert records(other) == records(d.sm)
    assert other.refs == d.sm.refs and other.pending == d.sm.pending
    assert other.apply({"id": "x", "op": "commit", "job": "j", "step": 2, "token": 1,
                        "now": d.now})["missing"] == ["rank-0", "rank-2", "rank-3"]


def test_a_bad_tensor_index_is_refused_naming_the_tensor() -> None:
    d = Driver()
    d.begin()
    before = records(d.sm)
    for tensors, text in (
            ([["w", [4], [2], [3], "f32"]], "tensor 'w': dimension 0: offset 2 + size 3 exceeds"),
            ([["w", [4, 4], [0], [4], ""]], "need the same number of dimensions"),
            ([["w", [True], [0], [1], ""]], "global_shape must be at most 16 integers"),
            ([["", [1], [0], [1], ""]], "tensor name must be a non-empty string"),
            (["w"], "a tensor entry is [name, global_shape, offsets, sizes, dtype]")):
        r = d.do("register", job="j", step=1, token=1, shards=[{**shard(0), "tensors": tensors}])
        assert not r["ok"] and r["kind"] == "invalid" and text in r["error"], r
        assert "shard 'rank-0'" in r["error"]
    assert records(d.sm) == before
    ok = d.do("register", job="j", step=1, token=1, shards=[shard(0)])
    assert ok["ok"] and d.sm.jobs["j"].steps[1].shards["rank-0"].tensors[0].name == "w"
