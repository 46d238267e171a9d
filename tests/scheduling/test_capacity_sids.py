"""Signature numbering in the capacity index: groups by number mirror groups by signature,
and restarting the numbering (bounded memory) keeps placements identical."""

from __future__ import annotations

import pytest

from accord.services.scheduling import capacity
from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.fragmentation import Workload
from accord.services.scheduling.model import Job
from accord.services.scheduling.placement import Policy, place, take
from accord.services.scheduling.topology import make_cluster


def _check(idx: CapacityIndex) -> None:
    assert len(idx.groups) == len(idx.sigs)
    for sig, names in idx.sigs.items():
        sid = idx.nodes[next(iter(names))].sid
        assert idx.sig_of[sid] == sig
        assert idx.groups[sid] is names
        assert all(idx.nodes[n].sid == sid for n in names)


def _churn(limit: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, tuple[int, ...]]], bool]:
    monkeypatch.setattr(capacity, "SID_LIMIT", limit)
    idx = CapacityIndex()
    for n in make_cluster(6, gpus=4, cpu_milli=32000):
        idx.add_node(n)
    jobs = [Job(f"j{i}", gpu_milli=[250, 500, 1000][i % 3], cpu_milli=1000 * (i % 5),
                devices_per_task=1) for i in range(40)]
    uid0 = idx.uid
    policy = Policy("accord")
    policy.set_workload(Workload.from_jobs(jobs))
    out = []
    placed = []
    for i, j in enumerate(jobs):
        p = place(idx, j, policy)
        if p is not None:
            take(idx, j, p)
            placed.append((j, p))
            out.append((p.tasks[0].node, p.tasks[0].devices))
        if i % 4 == 3 and placed:
            oj, op = placed.pop(0)
            idx.release(op.tasks[0].node, op.tasks[0].devices, oj.gpu_milli, oj.cpu_milli, oj.memory_mib)
        _check(idx)
    return out, idx.uid != uid0


def test_signature_numbers_restart_without_changing_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    unbounded, restarted = _churn(10**9, monkeypatch)
    assert not restarted
    bounded, restarted = _churn(4, monkeypatch)
    assert restarted, "the numbering should have restarted"
    assert bounded == unbounded
