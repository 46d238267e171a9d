"""The scheduler's typed results convert back to the exact wire messages they came from.

``accord jobs ls/show --json``, ``accord jobs watch --json`` and ``accord nodes ls --json``
print ``to_pb()`` of the client's dataclasses, so a field the dataclasses dropped would
silently vanish from the command's output: every field of the messages is set here (and
the optional ones both set and unset) and must survive ``from_pb`` then ``to_pb``.
"""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from accord.client import Job, Node, PlacementEvent
from accord.proto import scheduling_pb2 as pb


def _spec(**over: object) -> pb.JobSpec:
    m = pb.JobSpec(id="j1", tenant="t", queue="q", priority=-3, tasks=2, devices_per_task=0,
                   gpu_milli=250, cpu_milli=1500, memory_mib=4096, selector="vendor == amd",
                   topology_level="leaf", topology_required=True, estimated_runtime=12.5,
                   preemptible=True, submit_time=1700000000.25, command=["python", "x.py"],
                   workdir="/w", grace=3.0, max_restarts=0)
    for k, v in over.items():
        setattr(m, k, v)
    return m


def _launch(rank: int) -> pb.TaskLaunch:
    return pb.TaskLaunch(rank=rank, host=f"h{rank}", address=f"10.0.0.{rank}", devices=[0, 3],
                         vendor="amd", numa_nodes=[1], cpus="0-7", nics=["ib0", "ib1"],
                         env={"WORLD_SIZE": "4", "NODE_RANK": str(rank)},
                         argv=["--nnodes=2", f"--node-rank={rank}"])


def _same(a: object, b: object) -> None:
    assert a == b
    assert json_format.MessageToDict(a) == json_format.MessageToDict(b)


def test_a_job_round_trips_with_every_field() -> None:
    running = pb.TaskStatus(rank=0, node="h0", state="running", start_time=5.5, reason="")
    exited = pb.TaskStatus(rank=1, node="h1", state="exited", start_time=5.5, end_time=9.0,
                           exit_code=-9, reason="killed")
    exited_zero = pb.TaskStatus(rank=2, node="h1", state="exited", exit_code=0)
    m = pb.JobInfo(spec=_spec(), status="running", tasks=[_launch(0), _launch(1)],
                   start_time=5.0, end_time=0.0, master_port=29501, starts=2, requeues=1,
                   reason="requeued: node lost", task_status=[running, exited, exited_zero],
                   failures=1)
    job = Job.from_pb(m)
    assert job.task_status[0].exit_code is None and job.task_status[2].exit_code == 0
    _same(job.to_pb(), m)


@pytest.mark.parametrize("unset", ["gpu_milli", "estimated_runtime", "grace", "max_restarts"])
def test_an_unset_optional_field_stays_unset(unset: str) -> None:
    m = pb.JobInfo(spec=_spec(), status="pending")
    m.spec.ClearField(unset)
    _same(Job.from_pb(m).to_pb(), m)


def test_a_node_round_trips_with_attributes_nics_and_agent() -> None:
    dev = pb.Device(index=1, vendor="nvidia", model="H100", memory=80 << 30, arch="sm_90",
                    capability=9.0, island=2, pcie_switch=3, numa=1, attributes=[
                        pb.Attribute(name="mig", flag=True),
                        pb.Attribute(name="links", integer=18),
                        pb.Attribute(name="tflops", number=989.5),
                        pb.Attribute(name="serial", text="1320"),
                        pb.Attribute(name="flagged", flag=False),
                        pb.Attribute(name="zero", integer=0),
                    ])
    m = pb.NodeInfo(spec=pb.NodeSpec(name="gpu-a", address="10.1.1.1", cpu_milli=224000,
                                     memory_mib=2 << 20, devices=[dev],
                                     numa_cpus=["0-55,112-167", "56-111,168-223"],
                                     nics=[pb.Nic(name="ib0", numa=0), pb.Nic(name="ib1", numa=1)],
                                     leaf="leaf-1", spine="spine-0", block="b0"),
                    alive=True, drained=True, last_heartbeat=1700000001.5, unhealthy=[1],
                    running_jobs=["j1", "j2"], agent_endpoint="https://10.1.1.1:7070")
    node = Node.from_pb(m)
    assert node.agent_endpoint == "https://10.1.1.1:7070" and node.state == "drained"
    assert dict(node.devices[0].attributes) == {"mig": True, "links": 18, "tflops": 989.5,
                                                "serial": "1320", "flagged": False, "zero": 0}
    _same(node.to_pb(), m)


def test_placement_events_round_trip_with_and_without_their_job() -> None:
    placed = pb.PlacementEvent(index=41, kind="placed", job_id="j1", reason="",
                               tasks=[_launch(0)], attempt=3, spec=_spec())
    ev = PlacementEvent.from_pb(placed)
    assert ev.attempt == 3 and ev.spec is not None and ev.spec.command == ("python", "x.py")
    _same(ev.to_pb(), placed)
    cancelled = pb.PlacementEvent(index=42, kind="cancelled", job_id="j1", reason="by user",
                                  attempt=3)
    assert PlacementEvent.from_pb(cancelled).spec is None
    _same(PlacementEvent.from_pb(cancelled).to_pb(), cancelled)


def test_the_client_knows_every_job_status_the_scheduler_gives() -> None:
    """``jobs(status=...)`` checks the status before asking; a status the scheduler has
    and the client lacks (``held`` was one) could not be listed at all."""
    from accord.client.scheduling import JOB_STATES
    from accord.services.scheduling.state import JOB_STATUSES

    assert sorted(JOB_STATES) == sorted(JOB_STATUSES)
