"""The scheduler's vocabulary: nodes, devices, jobs, placements.

These are plain data. Every type converts to and from a msgpack-encodable dict
(``to_wire`` / ``from_wire``) because they travel inside replicated commands and
snapshots; ``from_wire`` validates its input and raises ``SchedulingError`` with a
message that names the bad field, so a malformed command changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from accord.services.scheduling.errors import SchedulingError

VENDORS = ("nvidia", "amd", "intel")
"""Vendors the launcher knows how to set device visibility for."""

TOPOLOGY_LEVELS = ("island", "node", "leaf", "spine", "block")
"""Job-level topology domains, narrowest first."""

MAX_ARGS = 1024
MAX_COMMAND_CHARS = 65536
MAX_GRACE = 3600.0
"""Bounds on a job's command and stop grace: a command travels in every placement event."""

WHOLE = 1000
"""A whole device, in thousandths (``gpu_milli``)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,252}$")


def _req(d: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(d, dict):
        raise SchedulingError(f"{what}: expected a mapping, got {type(d).__name__}")
    if key not in d:
        raise SchedulingError(f"{what}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise SchedulingError(f"{what}: field {key!r} must be {kind}, got bool")
    if not isinstance(v, kind):
        raise SchedulingError(f"{what}: field {key!r} has type {type(v).__name__}")
    return v


def _opt(d: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, what: str) -> Any:
    if key not in d or d[key] is None:
        return default
    return _req(d, key, kind, what)


def check_name(name: str, what: str) -> str:
    """Validate an identifier (node, job, tenant, queue, device id)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SchedulingError(
            f"{what}: {name!r} is not a valid name (1-253 chars of letters, digits, ._:/@-)"
        )
    return name


@dataclass(slots=True, frozen=True)
class Device:
    """One accelerator on a node, with its place inside the node."""

    index: int
    """Index the vendor runtime uses on this host (the visibility-env value)."""
    vendor: str
    model: str
    memory: int
    """Device memory, bytes."""
    arch: str = ""
    """Architecture: ``sm_90``, ``gfx942``, ``xe-hpc``..."""
    capability: float = 0.0
    """Numeric capability (CUDA compute capability, ...), 0 if not meaningful."""
    island: int = 0
    """NVLink / xGMI / Xe Link island within the node; devices in one island talk fast."""
    pcie_switch: int = 0
    numa: int = 0
    attributes: tuple[tuple[str, str | int | float | bool], ...] = ()
    """Extra attributes a selector can use."""

    def attrs(self) -> dict[str, str | int | float | bool]:
        """The attribute map a selector is evaluated against."""
        out: dict[str, str | int | float | bool] = dict(self.attributes)
        out.update(
            vendor=self.vendor, model=self.model, memory=self.memory, arch=self.arch,
            capability=self.capability,
        )
        return out

    def class_key(self) -> tuple[Any, ...]:
        """What makes two devices interchangeable for matching (not for topology)."""
        return (self.vendor, self.model, self.memory, self.arch, self.capability, self.attributes)

    def to_wire(self) -> dict[str, Any]:
        """Encode as a msgpack-friendly dict."""
        return {
            "index": self.index, "vendor": self.vendor, "model": self.model,
            "memory": self.memory, "arch": self.arch, "capability": self.capability,
            "island": self.island, "pcie_switch": self.pcie_switch, "numa": self.numa,
            "attributes": [[k, v] for k, v in self.attributes],
        }

    @staticmethod
    def from_wire(d: Any) -> Device:
        """Decode and validate."""
        w = "device"
        vendor = _req(d, "vendor", str, w).lower()
        if vendor not in VENDORS:
            raise SchedulingError(f"device: vendor {vendor!r} is not one of {', '.join(VENDORS)}")
        idx = _req(d, "index", int, w)
        mem = _req(d, "memory", int, w)
        if idx < 0 or mem < 0:
            raise SchedulingError("device: index and memory must be >= 0")
        attrs_raw = _opt(d, "attributes", (list, tuple), [], w)
        attrs: list[tuple[str, str | int | float | bool]] = []
        for item in attrs_raw:
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], (str, int, float, bool))):
                raise SchedulingError(f"device: bad attribute {item!r}; expected [name, value]")
            attrs.append((item[0], item[1]))
        cap = _opt(d, "capability", (int, float), 0.0, w)
        return Device(
            index=idx, vendor=vendor, model=_req(d, "model", str, w), memory=mem,
            arch=_opt(d, "arch", str, "", w), capability=float(cap),
            island=_opt(d, "island", int, 0, w), pcie_switch=_opt(d, "pcie_switch", int, 0, w),
            numa=_opt(d, "numa", int, 0, w), attributes=tuple(sorted(attrs)),
        )


@dataclass(slots=True, frozen=True)
class Nic:
    """A network interface and the NUMA node it hangs off."""

    name: str
    numa: int = 0


@dataclass(slots=True, frozen=True)
class Node:
    """A host: its devices, its inside (NUMA, NICs) and its place in the network tree."""

    name: str
    address: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[Device, ...] = ()
    numa_cpus: tuple[str, ...] = ()
    """CPU list per NUMA node (``"0-55,112-167"``), indexed by NUMA id."""
    nics: tuple[Nic, ...] = ()
    leaf: str = "leaf-0"
    spine: str = "spine-0"
    block: str = "block-0"

    def to_wire(self) -> dict[str, Any]:
        """Encode as a msgpack-friendly dict."""
        return {
            "name": self.name, "address": self.address, "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib, "devices": [dv.to_wire() for dv in self.devices],
            "numa_cpus": list(self.numa_cpus), "nics": [[n.name, n.numa] for n in self.nics],
            "leaf": self.leaf, "spine": self.spine, "block": self.block,
        }

    @staticmethod
    def from_wire(d: Any) -> Node:
        """Decode and validate (device indices must be unique)."""
        w = "node"
        name = check_name(_req(d, "name", str, w), "node name")
        devices = tuple(Device.from_wire(x) for x in _opt(d, "devices", (list, tuple), [], w))
        if len({dv.index for dv in devices}) != len(devices):
            raise SchedulingError(f"node {name}: device indices are not unique")
        cpu = _req(d, "cpu_milli", int, w)
        mem = _req(d, "memory_mib", int, w)
        if cpu < 0 or mem < 0:
            raise SchedulingError(f"node {name}: cpu_milli and memory_mib must be >= 0")
        nics = []
        for item in _opt(d, "nics", (list, tuple), [], w):
            if not (isinstance(item, (list, tuple)) and len(item) == 2
                    and isinstance(item[0], str) and isinstance(item[1], int)):
                raise SchedulingError(f"node {name}: bad nic {item!r}; expected [name, numa]")
            nics.append(Nic(item[0], item[1]))
        numa_cpus = _opt(d, "numa_cpus", (list, tuple), [], w)
        if not all(isinstance(x, str) for x in numa_cpus):
            raise SchedulingError(f"node {name}: numa_cpus must be strings")
        return Node(
            name=name, address=_opt(d, "address", str, name, w), cpu_milli=cpu, memory_mib=mem,
            devices=devices, numa_cpus=tuple(numa_cpus), nics=tuple(nics),
            leaf=_opt(d, "leaf", str, "leaf-0", w), spine=_opt(d, "spine", str, "spine-0", w),
            block=_opt(d, "block", str, "block-0", w),
        )


@dataclass(slots=True, frozen=True)
class Topology:
    """A job's topology requirement: all its devices within one domain of ``level``."""

    level: str | None = None
    required: bool = False


@dataclass(slots=True, frozen=True)
class Job:
    """A gang: ``tasks`` tasks of ``devices_per_task`` devices each, placed all or nothing."""

    id: str
    tenant: str = "default"
    queue: str = "default"
    priority: int = 0
    tasks: int = 1
    devices_per_task: int = 1
    gpu_milli: int = WHOLE
    """Share of each device in thousandths; below 1000 only for 1-device tasks."""
    cpu_milli: int = 0
    """Per task."""
    memory_mib: int = 0
    """Per task."""
    selector: str = ""
    topology: Topology = field(default_factory=Topology)
    estimated_runtime: float = 3600.0
    preemptible: bool = False
    submit_time: float = 0.0
    command: tuple[str, ...] = ()
    """What each task runs (argv); empty: nothing is started (a placement-only job)."""
    workdir: str = ""
    """The tasks' working directory on their node; empty: the task's own directory."""
    grace: float = 10.0
    """Seconds between SIGTERM and SIGKILL when the job's tasks are stopped."""
    max_restarts: int = 3
    """Failures (a task exiting non-zero, its node or device dying) requeued before it is held."""

    @property
    def gpus(self) -> float:
        """Devices the whole gang occupies (fractional shares count as fractions)."""
        return self.tasks * self.devices_per_task * self.gpu_milli / WHOLE

    def shape(self) -> tuple[int, int, int, int, int, str]:
        """What decides where a job fits: equal shapes fit in the same places."""
        return (self.tasks, self.devices_per_task, self.gpu_milli, self.cpu_milli,
                self.memory_mib, self.selector)

    def to_wire(self) -> dict[str, Any]:
        """Encode as a msgpack-friendly dict."""
        return {
            "id": self.id, "tenant": self.tenant, "queue": self.queue, "priority": self.priority,
            "tasks": self.tasks, "devices_per_task": self.devices_per_task,
            "gpu_milli": self.gpu_milli, "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib, "selector": self.selector,
            "topology": [self.topology.level, self.topology.required],
            "estimated_runtime": self.estimated_runtime, "preemptible": self.preemptible,
            "submit_time": self.submit_time, "command": list(self.command),
            "workdir": self.workdir, "grace": self.grace, "max_restarts": self.max_restarts,
        }

    @staticmethod
    def from_wire(d: Any) -> Job:
        """Decode and validate every field; the selector is parsed to check its syntax."""
        from accord.services.scheduling.selectors import compile_selector

        w = "job"
        jid = check_name(_req(d, "id", str, w), "job id")
        w = f"job {jid}"
        tasks = _opt(d, "tasks", int, 1, w)
        dpt = _opt(d, "devices_per_task", int, 1, w)
        milli = _opt(d, "gpu_milli", int, WHOLE, w)
        if not 1 <= tasks <= 100_000:
            raise SchedulingError(f"{w}: tasks must be in 1..100000, got {tasks}")
        if not 0 <= dpt <= 64:
            raise SchedulingError(f"{w}: devices_per_task must be in 0..64, got {dpt}")
        if not 1 <= milli <= WHOLE:
            raise SchedulingError(f"{w}: gpu_milli must be in 1..1000, got {milli}")
        if milli < WHOLE and dpt != 1:
            raise SchedulingError(f"{w}: a fractional gpu_milli needs devices_per_task == 1")
        cpu = _opt(d, "cpu_milli", int, 0, w)
        mem = _opt(d, "memory_mib", int, 0, w)
        if cpu < 0 or mem < 0:
            raise SchedulingError(f"{w}: cpu_milli and memory_mib must be >= 0")
        selector = _opt(d, "selector", str, "", w)
        compile_selector(selector)
        topo_raw = _opt(d, "topology", (list, tuple), [None, False], w)
        if len(topo_raw) != 2 or not (topo_raw[0] is None or topo_raw[0] in TOPOLOGY_LEVELS) \
                or not isinstance(topo_raw[1], bool):
            raise SchedulingError(
                f"{w}: topology must be [level or null, required]; level one of {TOPOLOGY_LEVELS}"
            )
        est = _opt(d, "estimated_runtime", (int, float), 3600.0, w)
        if est <= 0:
            raise SchedulingError(f"{w}: estimated_runtime must be > 0")
        command = _opt(d, "command", (list, tuple), [], w)
        if (len(command) > MAX_ARGS or not all(isinstance(a, str) for a in command)
                or sum(len(a) for a in command) > MAX_COMMAND_CHARS):
            raise SchedulingError(f"{w}: command must be at most {MAX_ARGS} strings of "
                                  f"{MAX_COMMAND_CHARS} characters in all")
        if command and not command[0]:
            raise SchedulingError(f"{w}: the command's program is empty")
        workdir = _opt(d, "workdir", str, "", w)
        if len(workdir) > 4096 or "\0" in workdir:
            raise SchedulingError(f"{w}: workdir is not a usable path")
        grace = _opt(d, "grace", (int, float), 10.0, w)
        if not 0 <= grace <= MAX_GRACE:
            raise SchedulingError(f"{w}: grace must be in 0..{MAX_GRACE} seconds, got {grace}")
        restarts = _opt(d, "max_restarts", int, 3, w)
        if not 0 <= restarts <= 1000:
            raise SchedulingError(f"{w}: max_restarts must be in 0..1000, got {restarts}")
        return Job(
            id=jid, tenant=check_name(_opt(d, "tenant", str, "default", w), "tenant"),
            queue=check_name(_opt(d, "queue", str, "default", w), "queue"),
            priority=_opt(d, "priority", int, 0, w), tasks=tasks, devices_per_task=dpt,
            gpu_milli=milli, cpu_milli=cpu, memory_mib=mem, selector=selector,
            topology=Topology(topo_raw[0], topo_raw[1]), estimated_runtime=float(est),
            preemptible=_opt(d, "preemptible", bool, False, w),
            submit_time=float(_opt(d, "submit_time", (int, float), 0.0, w)),
            command=tuple(command), workdir=workdir, grace=float(grace), max_restarts=restarts,
        )


@dataclass(slots=True, frozen=True)
class TaskPlacement:
    """Where one task of a gang runs: a node and devices on it."""

    rank: int
    node: str
    devices: tuple[int, ...]
    """Device indices on ``node``."""


@dataclass(slots=True, frozen=True)
class Placement:
    """A whole gang's placement; ``tasks[i].rank == i``."""

    job_id: str
    tasks: tuple[TaskPlacement, ...]

    def to_wire(self) -> dict[str, Any]:
        """Encode as a msgpack-friendly dict."""
        return {"job": self.job_id, "tasks": [[t.node, list(t.devices)] for t in self.tasks]}

    @staticmethod
    def from_wire(d: Any) -> Placement:
        """Decode and validate shape (not feasibility: the state machine checks that)."""
        jid = check_name(_req(d, "job", str, "placement"), "placement job")
        tasks = []
        for rank, item in enumerate(_req(d, "tasks", (list, tuple), f"placement {jid}")):
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], (list, tuple))
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in item[1])):
                raise SchedulingError(f"placement {jid}: bad task {item!r}")
            tasks.append(TaskPlacement(rank, item[0], tuple(item[1])))
        if not tasks:
            raise SchedulingError(f"placement {jid}: no tasks")
        return Placement(jid, tuple(tasks))


@dataclass(slots=True)
class Running:
    """A placed job, as the scheduler sees it."""

    job: Job
    placement: Placement
    start_time: float
    last_checkpoint: float | None = None
    """Time of its latest committed checkpoint, if any."""

    @property
    def expected_end(self) -> float:
        """When it should finish, from its runtime estimate."""
        return self.start_time + self.job.estimated_runtime
