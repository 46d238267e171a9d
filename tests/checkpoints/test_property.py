"""Property: random begin/register/commit/abort/gc/pin/expire/tier-move/confirm sequences.

After every command: the latest committed step of a job exists, is committed and never
moves back; no URL any pending or committed manifest references is ever reported as
deletable; the reference counts match a recount; a refused command changed nothing; and
a snapshot restores to the same state. Hypothesis prints the failing sequence (and its
reproduction blob) when the property fails.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from accord.services.checkpoints.model import COMMITTED, PENDING
from accord.services.checkpoints.state import CheckpointStateMachine
from tests.checkpoints.helpers import shard

JOBS = ("a", "b")
RANKS = 3

job_s = st.sampled_from(JOBS)
step_s = st.integers(0, 5)
token_s = st.integers(1, 3)


def _uri(job: str, step: int, rank: int, shared: int | None) -> str:
    # A few shared URLs let two manifests (or two jobs) reference one object.
    return f"file:///pool/{shared}" if shared is not None else f"file:///{job}/{step}/{rank}"


op_s = st.one_of(
    st.tuples(st.just("begin"), job_s, step_s, token_s),
    st.tuples(st.just("register"), job_s, step_s, token_s,
              st.lists(st.integers(0, RANKS - 1), min_size=1, max_size=RANKS, unique=True),
              st.none() | st.integers(0, 2), st.booleans()),
    st.tuples(st.just("commit"), job_s, step_s, token_s),
    st.tuples(st.just("abort"), job_s, step_s, token_s),
    st.tuples(st.just("gc"), job_s, st.integers(0, 3), st.integers(0, 3), st.integers(0, 50)),
    st.tuples(st.just("pin"), job_s, step_s),
    st.tuples(st.just("unpin"), job_s, step_s),
    st.tuples(st.just("expire"), st.integers(1, 400)),
    st.tuples(st.just("move"), job_s, step_s, st.integers(0, RANKS - 1), st.booleans()),
    st.tuples(st.just("confirm"), st.integers(0, 3)),
)


def _command(sm: CheckpointStateMachine, op: tuple[Any, ...], now: float) -> dict[str, Any]:
    kind = op[0]
    if kind == "begin":
        _, job, step, token = op
        return {"op": "begin", "job": job, "step": step, "token": token, "lease_s": 100,
                "layout": {"world_size": RANKS},
                "expected": [[f"rank-{r}", r] for r in range(RANKS)]}
    if kind == "register":
        _, job, step, token, ranks, shared, corrupt = op
        shards = [shard(r, job=job, step=step, uri=_uri(job, step, r, shared if r == 0 else None),
                        data=b"corrupt" if corrupt and r == ranks[0] else None) for r in ranks]
        return {"op": "register", "job": job, "step": step, "token": token, "shards": shards}
    if kind in ("commit", "abort"):
        return {"op": kind, "job": op[1], "step": op[2], "token": op[3]}
    if kind == "gc":
        _, job, last, every, within = op
        sm.apply({"id": f"r{now}", "op": "set_retention", "job": job, "now": now,
                  "retention": {"keep_last": last, "keep_every": every, "keep_within_s": within}})
        return {"op": "gc", "jobs": []}
    if kind in ("pin", "unpin"):
        return {"op": kind, "job": op[1], "step": op[2]}
    if kind == "expire":
        return {"op": "expire"}
    if kind == "move":
        _, job, step, rank, drop_old = op
        j = sm.jobs.get(job)
        s = j.steps.get(step) if j else None
        sh = s.shards.get(f"rank-{rank}") if s else None
        drop = [sh.uri] if sh is not None and drop_old else []
        return {"op": "move_tier", "job": job, "step": step, "shard_id": f"rank-{rank}",
                "add": [f"s3://cold/{job}/{step}/{rank}/{now}", ""], "drop": drop}
    uris = sorted(sm.garbage)[: op[1]] or ["file:///never-garbage"]
    return {"op": "confirm_deleted", "uris": uris}


def _doc(sm: CheckpointStateMachine) -> Any:
    doc = msgpack.unpackb(sm.snapshot(), raw=False, strict_map_key=False)
    del doc["applied"], doc["clock"]
    return doc


def _check(sm: CheckpointStateMachine, latest_before: dict[str, int]) -> None:
    refs: dict[str, int] = {}
    for job in sm.jobs.values():
        if job.name in latest_before:
            assert job.latest is not None and job.latest >= latest_before[job.name]
        if job.latest is not None:
            assert job.steps[job.latest].state == COMMITTED, "latest committed step lost"
            latest_before[job.name] = job.latest
        for s in job.steps.values():
            # A snapshot's cached step encodings always match the live steps.
            assert s.cache is None or s.cache == msgpack.packb(s.to_wire(), use_bin_type=True)
            if s.state in (PENDING, COMMITTED):
                for sh in s.shards.values():
                    for u in sh.uris():
                        refs[u] = refs.get(u, 0) + 1
    assert sm.refs == refs
    referenced = set(refs)
    assert not referenced & {g.uri for g in sm.garbage_of()}, "a referenced URL is deletable"


@given(st.lists(op_s, min_size=1, max_size=60))
def test_random_sequences_keep_the_latest_and_never_free_a_referenced_uri(
        ops: list[tuple[Any, ...]]) -> None:
    sm = CheckpointStateMachine()
    now = 1000.0
    latest: dict[str, int] = {}
    for i, op in enumerate(ops):
        now += op[1] if op[0] == "expire" else 1.0
        cmd = {**_command(sm, op, now), "id": f"c{i}", "now": now}
        before = _doc(sm)
        result = sm.apply(cmd)
        if i % 3 == 0:
            sm.snapshot()  # fills the caches the next commands must keep right
        if not result["ok"]:
            assert _doc(sm) == before, f"refused {cmd['op']} changed the state: {result}"
        _check(sm, latest)
    copy = CheckpointStateMachine()
    copy.restore(sm.snapshot())
    assert _doc(copy) == _doc(sm) and copy.refs == sm.refs
