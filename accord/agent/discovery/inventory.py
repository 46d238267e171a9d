"""A machine's whole inventory as the scheduler's ``Node``, and its refreshable health.

``Discoverer`` loads whatever vendor libraries the machine has (none on a machine
without accelerators: the node then has zero devices and its CPUs and memory, so
CPU-only tasks still run), builds the ``Node`` once, and re-checks health on
demand (``health()``): a device whose ECC, row remapping, XID events or driver
say it is broken is listed, the agent reports the list in its heartbeat, and
placement avoids those devices (the scheduler requeues jobs on a device that
turns bad).

Islands are the connected components of the fast-link graph (NVLink / xGMI):
two devices share an island when a chain of links joins them, and every device
cabled to an NVSwitch (a link whose far end is not a GPU) joins one ``nvswitch``
fabric. A device without links is an island alone.

One vendor per node: the visibility variables index each vendor's devices from
0, and ``Node`` requires unique indices, so on a (rare) host with GPUs of two
vendors the vendor with more devices is reported and the other is logged and
left out.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.agent.discovery import amd, host, intel, nvidia
from accord.agent.discovery.found import Found, parse_cpu_list
from accord.services.scheduling.model import Device, Nic, Node

log = logging.getLogger("accord.agent")


@dataclass(slots=True)
class Inventory:
    """What discovery found: the node, and facts the scheduler does not carry."""

    node: Node
    unhealthy: dict[int, str] = field(default_factory=dict)
    """Device index -> why it must not be used."""
    mig: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Device index -> its MIG instances' UUIDs (what ``CUDA_VISIBLE_DEVICES`` names)."""
    cpus: dict[int, str] = field(default_factory=dict)
    """Device index -> the CPUs close to it."""
    uuids: dict[int, str] = field(default_factory=dict)
    """Device index -> its UUID (kept here: a per-device attribute would make every
    device a class of its own to placement)."""
    sources: tuple[str, ...] = ()
    """Where the devices came from (``nvml``, ``amdsmi``, ``kfd-sysfs``, ``intel-sysfs``)."""


def islands(found: list[Found]) -> list[int]:
    """Island number per device (position in ``found``), numbered by first member."""
    parent = list(range(len(found)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_bus = {f.pci_bus: i for i, f in enumerate(found) if f.pci_bus}
    fabrics: dict[str, int] = {}
    for i, f in enumerate(found):
        for target in f.links:
            j = by_bus.get(target)
            if j is None:
                # Not a GPU: a switch (NVSwitch) or a named fabric (an xGMI hive).
                name = "nvswitch" if f.vendor == "nvidia" else target
                j = fabrics.setdefault(name, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    numbers: dict[int, int] = {}
    return [numbers.setdefault(root(i), len(numbers)) for i in range(len(found))]


def build(name: str, address: str, found: list[Found], h: host.Host, root: Path = Path("/"),
          sources: tuple[str, ...] = ()) -> Inventory:
    """The ``Node`` (and side facts) for ``found`` devices on host ``h``."""
    vendors: dict[str, int] = {}
    for f in found:
        vendors[f.vendor] = vendors.get(f.vendor, 0) + 1
    if len(vendors) > 1:
        keep = max(vendors, key=lambda v: (vendors[v], v))
        log.warning("devices of several vendors %s: reporting only %s", sorted(vendors), keep)
        found = [f for f in found if f.vendor == keep]
    found = sorted(found, key=lambda f: f.index)
    isl = islands(found)
    switches: dict[str, int] = {}
    numa_sets = [parse_cpu_list(c) if c else set() for c in h.numa_cpus]
    devices = []
    inv = Inventory(Node(name, address, h.cpu_milli, h.memory_mib), sources=sources)
    for f, island in zip(found, isl, strict=True):
        sw = host.pcie_switch(f.pci_bus, root) if f.pci_bus else ""
        numa = f.numa if f.numa >= 0 else (host.pci_numa(f.pci_bus, root) if f.pci_bus else None)
        if numa is None and f.cpus:
            near = parse_cpu_list(f.cpus)
            overlap = [len(near & s) for s in numa_sets]
            best = max(overlap, default=0)
            numa = overlap.index(best) if best else None
        attrs = dict(f.extra)
        devices.append(Device(
            index=f.index, vendor=f.vendor, model=f.model, memory=f.memory, arch=f.arch,
            capability=f.capability, island=island,
            pcie_switch=switches.setdefault(sw, len(switches)) if sw else 0,
            numa=numa or 0, attributes=tuple(sorted(attrs.items())),
        ))
        if f.unhealthy:
            inv.unhealthy[f.index] = f.unhealthy
        if f.mig:
            inv.mig[f.index] = f.mig
        if f.cpus:
            inv.cpus[f.index] = f.cpus
        if f.uuid:
            inv.uuids[f.index] = f.uuid
    inv.node = Node(name, address, h.cpu_milli, h.memory_mib, devices=tuple(devices),
                    numa_cpus=h.numa_cpus, nics=tuple(Nic(n, numa) for n, numa in h.nics))
    return inv


Loader = Callable[[], Any]


class Discoverer:
    """Finds the machine's devices once and re-checks their health on demand.

    ``nvml`` / ``amdsmi``: the initialised library modules to use (tests pass recorded
    fakes); by default each is imported and initialised if installed. ``root``: where
    procfs and sysfs live.
    """

    def __init__(self, name: str | None = None, address: str | None = None, *,
                 nvml: Any = None, amdsmi: Any = None, root: Path = Path("/"),
                 load_libraries: bool = True) -> None:
        self.name = name or socket.gethostname()
        self.address = address or self.name
        self.root = root
        self.nvml = nvml if nvml is not None else (nvidia.load() if load_libraries else None)
        self.amdsmi = amdsmi if amdsmi is not None else (amd.load() if load_libraries else None)
        self._xid: nvidia.XidWatch | None = None
        self._inventory: Inventory | None = None

    def _found(self) -> tuple[list[Found], tuple[str, ...]]:
        found: list[Found] = []
        sources: list[str] = []
        if self.nvml is not None:
            found += nvidia.probe(self.nvml)
            sources.append("nvml")
        if self.amdsmi is not None:
            found += amd.probe(self.amdsmi)
            sources.append("amdsmi")
        elif (kfd := amd.probe_sysfs(self.root / "sys")):
            found += kfd
            sources.append("kfd-sysfs")
        if (xe := intel.probe_sysfs(self.root / "sys")):
            found += xe
            sources.append("intel-sysfs")
        return found, tuple(sources)

    def inventory(self) -> Inventory:
        """Discover everything (the first call) and return the inventory with fresh health."""
        if self._inventory is None:
            found, sources = self._found()
            self._inventory = build(self.name, self.address, found, host.probe(self.root),
                                    self.root, sources)
            if self.nvml is not None:
                self._xid = nvidia.XidWatch(self.nvml, int(self.nvml.nvmlDeviceGetCount()))
        self._inventory.unhealthy = self.health()
        return self._inventory

    def health(self) -> dict[int, str]:
        """Device index -> why it is unhealthy, as of now."""
        inv = self._inventory
        if inv is None:
            return dict(self.inventory().unhealthy)
        bad: dict[int, str] = {}
        if self.nvml is not None:
            for d in inv.node.devices:
                if d.vendor != "nvidia":
                    continue
                try:
                    h = self.nvml.nvmlDeviceGetHandleByIndex(d.index)
                except self.nvml.NVMLError as e:
                    bad[d.index] = f"NVML cannot open it: {e}"
                    continue
                why = nvidia.health(self.nvml, h)
                if why:
                    bad[d.index] = why
            if self._xid is not None:
                for i, why in self._xid.poll().items():
                    bad.setdefault(i, why)
        if self.amdsmi is not None:
            for f in amd.probe(self.amdsmi):
                if f.unhealthy:
                    bad[f.index] = f.unhealthy
        return bad

    def close(self) -> None:
        """Release the vendor libraries."""
        if self._xid is not None:
            self._xid.close()
        for lib, fn in ((self.nvml, "nvmlShutdown"), (self.amdsmi, "amdsmi_shut_down")):
            if lib is not None and hasattr(lib, fn):
                try:
                    getattr(lib, fn)()
                except Exception as e:  # shutting down: nothing left to do about it
                    log.debug("%s failed: %s", fn, e)
