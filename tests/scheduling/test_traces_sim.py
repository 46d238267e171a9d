"""Trace loaders and the simulator, on a slice of the real Alibaba traces and on plain CSV."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.services.scheduling import simulator, traces
from accord.services.scheduling.model import SchedulingError
from accord.services.scheduling.selectors import matches
from accord.services.scheduling.topology import make_cluster

REPO = Path(__file__).resolve().parents[2]
OPENB = traces.traces_dir(REPO.parent / "shared" / "traces") / "alibaba-gpu-v2023-openb" \
    if (REPO.parent / "shared" / "traces").is_dir() else None


def _openb() -> Path:
    if OPENB is None:
        pytest.fail("the shared traces are missing: expected <repo>/../shared/traces")
    return OPENB


def test_traces_dir_error_is_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--traces"):
        traces.traces_dir(tmp_path / "nope")


def test_openb_loaders_match_the_readme() -> None:
    d = _openb()
    nodes = traces.load_openb_nodes(d / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523 and traces.gpu_total(nodes) == 6212
    pods = traces.load_openb_pods(d / "openb_pod_list_gpuspec33.csv")
    assert len(pods) == 8152
    constrained = [p for p in pods if p.job.selector]
    assert len(constrained) == 2388
    # A "V100M16|V100M32" pod matches exactly those models.
    pod = next(p for p in constrained if "V100M16" in p.job.selector and "P100" not in p.job.selector)
    v100 = next(n for n in nodes if n.devices and n.devices[0].model == "V100M32").devices[0]
    t4 = next(n for n in nodes if n.devices and n.devices[0].model == "T4").devices[0]
    assert matches(pod.job.selector, v100.attrs()) and not matches(pod.job.selector, t4.attrs())
    shares = [p for p in pods if p.job.gpu_milli < 1000]
    assert shares and all(p.job.devices_per_task == 1 for p in shares)
    multi = traces.load_openb_pods(d / "openb_pod_list_multigpu50.csv", limit=50)
    assert all(p.duration is None for p in multi)


def test_saturation_and_replay_on_a_slice() -> None:
    d = _openb()
    nodes = traces.load_openb_nodes(d / "openb_node_list_gpu_node.csv")[::20]
    pods = traces.load_openb_pods(d / "openb_pod_list_gpuspec33.csv", limit=400)
    total = traces.gpu_total(nodes)
    results = {}
    for pol in simulator.POLICY_NAMES:
        sat = simulator.saturate(nodes, pods, pol, levels=(0.5, 1.0))
        assert sat.levels == [0.5, 1.0]
        assert 0 <= sat.unallocated[1] <= total and sat.allocated[1] <= total + 1e-6
        rep = simulator.replay(nodes, pods, pol, time_scale=5000.0, cycle_interval=60.0)
        assert rep.finished + rep.unplaced == len(pods), "every started job finishes"
        assert 0.0 <= rep.allocation_rate <= 1.0
        assert rep.jct_mean >= rep.queue_delay_mean >= 0.0
        results[pol] = rep
    # A job no node can ever hold stays unplaced under every policy, and only such jobs do.
    assert len({r.unplaced for r in results.values()}) == 1


def test_plain_csv(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text("arrival,gpus,duration,gpu_type\n0,8,100,H100\n5,16,50,\n7,0.5,10,\n")
    jobs = traces.load_plain_csv(f)
    assert [(j.job.tasks, j.job.devices_per_task, j.job.gpu_milli) for j in jobs] == [
        (1, 8, 1000), (2, 8, 1000), (1, 1, 500)]
    assert jobs[0].job.selector == "model in (H100)"
    steps = tmp_path / "steps.csv"
    steps.write_text("arrival,gpus,steps\n0,4,1000\n")
    assert traces.load_plain_csv(steps, step_seconds=0.5)[0].duration == 500.0
    r = simulator.replay(make_cluster(2), jobs, "accord", cycle_interval=1.0)
    assert r.finished == 3 and r.unplaced == 0
    for bad in ("arrival,gpus,duration\n0,12,5\n", "arrival,gpus\n0,1\n", "arrival,gpus,duration\nx,1,1\n",
                "arrival,gpus,duration\n0,1,-1\n", "gpus,duration\n1,1\n"):
        f.write_text(bad)
        with pytest.raises(SchedulingError):
            traces.load_plain_csv(f)
