"""What each task's launcher needs: host, devices, visibility env, affinity, rendezvous.

Device visibility per vendor:

- NVIDIA: ``CUDA_VISIBLE_DEVICES``.
- AMD: ``ROCR_VISIBLE_DEVICES`` only. It filters at the ROCr runtime level, which
  HIP, OpenCL and every ROCm library honour; setting ``HIP_VISIBLE_DEVICES`` too
  would re-filter the already renumbered devices and pick the wrong ones.
- Intel (Level Zero): ``ZE_AFFINITY_MASK``.

Rendezvous follows torchrun: each task is one launcher (a torchrun "node") with
``devices_per_task`` worker processes; rank 0's host is the master.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import WHOLE, Job, Node, Placement

VISIBILITY_ENV = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES",
                  "intel": "ZE_AFFINITY_MASK"}


@dataclass(slots=True, frozen=True)
class TaskLaunch:
    """Everything one task's launcher needs."""

    rank: int
    host: str
    address: str
    devices: tuple[int, ...]
    vendor: str | None
    numa_nodes: tuple[int, ...]
    cpus: str
    nics: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    """torchrun arguments for this task."""


def task_launches(job: Job, placement: Placement, nodes: dict[str, Node], master_port: int
                  ) -> list[TaskLaunch]:
    """Per-task launch facts for a placed job (``nodes`` maps names to their descriptions)."""
    if not placement.tasks:
        raise SchedulingError(f"job {job.id}: placement has no tasks")
    master = nodes.get(placement.tasks[0].node)
    if master is None:
        raise SchedulingError(f"job {job.id}: master node {placement.tasks[0].node} is unknown")
    nproc = max(1, job.devices_per_task)
    world = len(placement.tasks) * nproc
    out = []
    for t in placement.tasks:
        node = nodes.get(t.node)
        if node is None:
            raise SchedulingError(f"job {job.id}: node {t.node} is unknown")
        by_index = {d.index: d for d in node.devices}
        devs = [by_index[i] for i in t.devices if i in by_index]
        if len(devs) != len(t.devices):
            raise SchedulingError(f"job {job.id}: node {t.node} lacks a placed device")
        vendors = {d.vendor for d in devs}
        if len(vendors) > 1:
            raise SchedulingError(f"job {job.id}: task {t.rank} mixes vendors {sorted(vendors)}")
        vendor = next(iter(vendors)) if vendors else None
        numa = tuple(sorted({d.numa for d in devs}))
        cpus = ",".join(node.numa_cpus[n] for n in numa if n < len(node.numa_cpus))
        nics = tuple(n.name for n in node.nics if n.numa in numa)
        env = {
            "MASTER_ADDR": master.address, "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(world), "NNODES": str(len(placement.tasks)),
            "NODE_RANK": str(t.rank), "NPROC_PER_NODE": str(nproc),
            "ACCORD_JOB_ID": job.id,
        }
        visible = ",".join(str(i) for i in t.devices)
        if vendor is not None:
            env[VISIBILITY_ENV[vendor]] = visible
        else:
            # No devices: hide them all rather than let the task see every GPU.
            env.update({v: "" for v in VISIBILITY_ENV.values()})
        if job.gpu_milli < WHOLE:
            env["ACCORD_GPU_FRACTION"] = f"{job.gpu_milli / WHOLE:.3f}"
            if vendor == "nvidia":
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, job.gpu_milli // 10))
        argv = (f"--nnodes={len(placement.tasks)}", f"--node-rank={t.rank}",
                f"--nproc-per-node={nproc}", f"--master-addr={master.address}",
                f"--master-port={master_port}")
        out.append(TaskLaunch(rank=t.rank, host=node.name, address=node.address,
                              devices=t.devices, vendor=vendor, numa_nodes=numa, cpus=cpus,
                              nics=nics, env=env, argv=argv))
    return out
