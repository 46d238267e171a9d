"""Which worker of a node hosts which group (accord/node/placement.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.node.backend import kv_group
from accord.node.members import META_GROUP
from accord.node.placement import (
    NODE_GROUPS,
    PlacementError,
    WorkerPlan,
    check_workers,
    shard_of_group,
)


def test_every_group_has_exactly_one_worker_by_the_fixed_rule() -> None:
    plan = WorkerPlan(workers=3, shards=8)
    owned = [plan.groups_of(k) for k in range(3)]
    everything = sorted(g for groups in owned for g in groups)
    assert everything == sorted([*NODE_GROUPS, *(kv_group(s) for s in range(8))])
    assert plan.shards_of(0) == [0, 3, 6] and plan.shards_of(1) == [1, 4, 7] and plan.shards_of(2) == [2, 5]
    for k, groups in enumerate(owned):
        assert all(plan.worker_of_group(g) == k for g in groups)
    assert plan.worker_of_group(META_GROUP) == 0
    assert [shard_of_group(kv_group(s)) for s in range(8)] == list(range(8))


def test_one_worker_keeps_the_nodes_own_layout(tmp_path: Path) -> None:
    plan = WorkerPlan(workers=1, shards=8)
    assert plan.data_dir(tmp_path, 0) == tmp_path
    assert plan.peer_port(2380, 0) == 2380
    assert plan.groups_of(0) == [*NODE_GROUPS, *(kv_group(s) for s in range(8))]


def test_workers_get_their_own_directories_ports_and_sockets(tmp_path: Path) -> None:
    plan = WorkerPlan(workers=2, shards=8)
    assert [plan.data_dir(tmp_path, k) for k in (0, 1)] == [tmp_path / "worker-0", tmp_path / "worker-1"]
    assert [plan.peer_port(2380, k) for k in (0, 1)] == [2380, 2381]
    assert plan.forward_socket(tmp_path, 1) == tmp_path / "worker-1.sock"
    assert plan.metrics_socket(tmp_path, 1) == tmp_path / "worker-1.metrics.sock"


@pytest.mark.parametrize(("workers", "shards", "says"), [
    (0, 8, "between 1 and"), (65, 80, "between 1 and"), (4, 2, "--shards is 2"), (1, 0, "at least 1")])
def test_impossible_layouts_are_refused_saying_what_to_change(workers: int, shards: int, says: str) -> None:
    with pytest.raises(PlacementError, match=says):
        WorkerPlan(workers=workers, shards=shards)


def test_out_of_range_lookups_are_errors(tmp_path: Path) -> None:
    plan = WorkerPlan(workers=2, shards=4)
    with pytest.raises(PlacementError):
        plan.worker_of_shard(4)
    with pytest.raises(PlacementError):
        plan.worker_of_group(50)
    with pytest.raises(PlacementError):
        plan.data_dir(tmp_path, 2)
    with pytest.raises(PlacementError, match="65536"):
        plan.peer_port(65535, 0)
    with pytest.raises(PlacementError, match="shorter directory"):
        plan.forward_socket(tmp_path / ("d" * 120), 0)
    with pytest.raises(PlacementError, match=r"the metrics socket .* shorter directory"):
        plan.metrics_socket(tmp_path / ("d" * 100), 0)


def test_worker_count_is_fixed_when_the_directory_is_created(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    check_workers(fresh, 2)
    check_workers(fresh, 2)
    with pytest.raises(PlacementError, match=r"created with --workers 2.*--workers 3"):
        check_workers(fresh, 3)
    old = tmp_path / "old"
    (old / "wal").mkdir(parents=True)
    check_workers(old, 1)
    with pytest.raises(PlacementError, match="created with --workers 1"):
        check_workers(old, 2)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "workers").write_text("two\n")
    with pytest.raises(PlacementError, match="should hold the worker count"):
        check_workers(bad, 2)
