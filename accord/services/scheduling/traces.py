"""Loaders for GPU cluster traces: the Alibaba openb / PAI / spot node and pod lists, and plain CSV.

The traces live outside the repository, in ``<repo>/../shared/traces`` (see its
README); ``traces_dir`` finds them and says clearly when they are missing.

Mapping choices (the traces do not say):

- every GPU in these traces is treated as NVIDIA (T4, P100, V100, A10, A100,
  H800 are; G1-G3 are undisclosed). Memory is the model's known size, 0 if
  unknown. V100 and A100/H800/A800 8-GPU nodes get one NVLink island, others
  one island per GPU (PCIe cards). The network tree is not in the traces: nodes
  are put 32 to a leaf switch in file order.
- a pod becomes a one-task job: ``num_gpu`` devices, or a ``gpu_milli`` share of
  one; ``gpu_spec`` ("T4|V100M16") becomes ``model in (T4, V100M16)``; the QoS
  class becomes the tenant. Duration is deletion minus scheduled time (creation
  time for pods never scheduled), at least 1 s.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import WHOLE, Job
from accord.services.scheduling.model import Node as NodeSpec
from accord.services.scheduling.topology import make_node

_MEMORY_GIB = {"T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "V100": 16, "A10": 24,
               "A100-SXM4-80GB": 80, "A800-SXM4-80GB": 80, "H800": 80}
_NVLINK = ("V100", "A100", "A800", "H800", "H100")
NODES_PER_LEAF = 32


@dataclass(slots=True, frozen=True)
class TraceJob:
    """A job with its arrival time and true duration (None: runs forever)."""

    arrival: float
    duration: float | None
    job: Job


def traces_dir(override: str | Path | None = None) -> Path:
    """The traces directory: ``override`` or ``<repo>/../shared/traces``; raises if absent."""
    path = Path(override) if override else Path(__file__).resolve().parents[3].parent / "shared" / "traces"
    if not path.is_dir():
        raise FileNotFoundError(
            f"trace directory {path} not found; pass --traces DIR pointing at the shared traces "
            "(alibaba-gpu-v2023-openb/ and friends)"
        )
    return path


def _gpu_node(name: str, model: str, gpus: int, cpu_milli: int, memory_mib: int, i: int) -> NodeSpec:
    nvlink = gpus == 8 and any(model.startswith(p) for p in _NVLINK)
    leaf = i // NODES_PER_LEAF
    return make_node(
        name, gpus=gpus, vendor="nvidia", model=model or "none", memory_gib=_MEMORY_GIB.get(model, 0),
        arch="", capability=0.0, islands=1 if nvlink else max(gpus, 1), numa_nodes=2 if gpus >= 2 else 1,
        cpu_milli=cpu_milli, memory_mib=memory_mib, leaf=f"leaf-{leaf}", spine=f"spine-{leaf // 8}",
        block=f"block-{leaf // 32}",
    )


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"trace file {path} not found")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise SchedulingError(f"{path.name}: missing columns {missing}")
        return list(reader)


def load_openb_nodes(path: Path) -> list[NodeSpec]:
    """``openb_node_list_*.csv``: sn, cpu_milli, memory_mib, gpu, model."""
    out = []
    for i, r in enumerate(_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))):
        out.append(_gpu_node(r["sn"], r["model"], int(r["gpu"]), int(r["cpu_milli"]),
                             int(r["memory_mib"]), i))
    return out


def load_pai_nodes(path: Path) -> list[NodeSpec]:
    """``pai_machine_spec.csv``: machine, gpu_type, cap_cpu (cores), cap_mem (GiB), cap_gpu."""
    out = []
    for i, r in enumerate(_rows(path, ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu"))):
        gpus = int(float(r["cap_gpu"]))
        out.append(_gpu_node(f"pai-{i:05d}", r["gpu_type"] if gpus else "", gpus,
                             int(float(r["cap_cpu"]) * 1000), int(float(r["cap_mem"]) * 1024), i))
    return out


def load_spot_nodes(path: Path) -> list[NodeSpec]:
    """v2026 spot ``node_info_df.csv``: gpu_model, gpu_capacity_num, cpu_num, node_name."""
    out = []
    for i, r in enumerate(_rows(path, ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name"))):
        out.append(_gpu_node(f"spot-{r['node_name']}", r["gpu_model"], int(r["gpu_capacity_num"]),
                             int(float(r["cpu_num"]) * 1000), 1024 * 1024, i))
    return out


def _selector_for(spec: str) -> str:
    models = sorted({m.strip() for m in spec.split("|") if m.strip()})
    return f"model in ({', '.join(models)})" if models else ""


def load_openb_pods(path: Path, limit: int | None = None) -> list[TraceJob]:
    """``openb_pod_list_*.csv``; files without time columns get arrival = row order, no end."""
    rows = _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    timed = "creation_time" in (rows[0] if rows else {})
    out = []
    for i, r in enumerate(rows[:limit] if limit else rows):
        ngpu = int(r["num_gpu"])
        milli = int(r["gpu_milli"]) if ngpu == 1 else WHOLE
        if ngpu == 1 and not 0 < milli <= WHOLE:
            milli = WHOLE
        if timed:
            arrival = float(r["creation_time"])
            start = float(r["scheduled_time"]) if r.get("scheduled_time") else arrival
            duration: float | None = max(1.0, float(r["deletion_time"]) - start)
        else:
            arrival, duration = float(i), None
        job = Job(
            id=r["name"], tenant=r.get("qos") or "default", tasks=1, devices_per_task=ngpu,
            gpu_milli=milli, cpu_milli=int(r["cpu_milli"]), memory_mib=int(r["memory_mib"]),
            selector=_selector_for(r.get("gpu_spec", "")),
            estimated_runtime=duration if duration else 3600.0, submit_time=arrival,
        )
        out.append(TraceJob(arrival, duration, job))
    out.sort(key=lambda t: (t.arrival, t.job.id))
    return out


def load_plain_csv(path: Path, step_seconds: float = 1.0, gpus_per_node: int = 8) -> list[TraceJob]:
    """A plain job CSV: ``arrival,gpus,duration`` or ``arrival,gpus,steps``, optional ``gpu_type``.

    Optional columns: ``id``, ``tenant``, ``priority``, ``cpu_milli``, ``memory_mib``,
    ``estimate`` (runtime estimate, defaults to the duration). A request of more than
    ``gpus_per_node`` GPUs becomes a gang of whole-node tasks and must divide evenly.
    """
    rows = _rows(path, ("arrival", "gpus"))
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            arrival = float(r["arrival"])
            gpus_f = float(r["gpus"])
            if r.get("duration"):
                duration = float(r["duration"])
            elif r.get("steps"):
                duration = float(r["steps"]) * step_seconds
            else:
                raise SchedulingError("needs a duration or a steps column value")
        except ValueError as e:
            raise SchedulingError(f"{path.name} line {i}: {e}") from e
        if duration <= 0 or gpus_f < 0 or arrival < 0:
            raise SchedulingError(f"{path.name} line {i}: arrival, gpus, duration must be >= 0 (duration > 0)")
        if gpus_f < 1 and gpus_f > 0:
            tasks, dpt, milli = 1, 1, max(1, round(gpus_f * WHOLE))
        else:
            gpus = int(gpus_f)
            if gpus != gpus_f:
                raise SchedulingError(f"{path.name} line {i}: fractional GPUs above 1 are not supported")
            if gpus > gpus_per_node:
                if gpus % gpus_per_node:
                    raise SchedulingError(
                        f"{path.name} line {i}: {gpus} GPUs is not a multiple of {gpus_per_node}")
                tasks, dpt = gpus // gpus_per_node, gpus_per_node
            else:
                tasks, dpt = 1, gpus
            milli = WHOLE
        est = float(r["estimate"]) if r.get("estimate") else duration
        job = Job(
            id=r.get("id") or f"job-{i - 1:06d}", tenant=r.get("tenant") or "default",
            priority=int(r.get("priority") or 0), tasks=tasks, devices_per_task=dpt, gpu_milli=milli,
            cpu_milli=int(r.get("cpu_milli") or 0), memory_mib=int(r.get("memory_mib") or 0),
            selector=_selector_for(r.get("gpu_type") or ""), estimated_runtime=max(est, 1e-3),
            submit_time=arrival,
        )
        out.append(TraceJob(arrival, duration, job))
    out.sort(key=lambda t: (t.arrival, t.job.id))
    return out


def gpu_total(nodes: list[NodeSpec]) -> int:
    """Devices in a node list."""
    return sum(len(n.devices) for n in nodes)

