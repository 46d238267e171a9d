"""The host itself: usable CPUs, memory, NUMA nodes, NICs, and PCIe placement.

Everything comes from procfs/sysfs, read under ``root`` (``/`` on a real machine, a
directory tree of recorded files in tests):

- CPUs: the process's affinity (``os.sched_getaffinity``) when reading the live
  machine, else ``/sys/devices/system/cpu/online``; capped by the cgroup v2 quota
  (``/sys/fs/cgroup/cpu.max``: ``quota period``).
- Memory: ``MemTotal`` of ``/proc/meminfo``, capped by ``/sys/fs/cgroup/memory.max``.
- NUMA: ``/sys/devices/system/node/nodeN/cpulist``.
- NICs for GPUDirect: RDMA devices of ``/sys/class/infiniband`` (their net interface
  name when they have one) with the NUMA node of their PCI device; without RDMA
  devices, the physical interfaces of ``/sys/class/net`` (those with a ``device`` link).
- PCIe switch of a device: the bridge two levels above it in ``/sys/bus/pci/devices``'s
  resolved path (GPU -> downstream port -> switch upstream port); devices behind the same
  switch share it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from accord.agent.discovery.found import cpu_list, parse_cpu_list

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(slots=True, frozen=True)
class Host:
    """What the host offers besides its accelerators."""

    cpu_milli: int
    memory_mib: int
    numa_cpus: tuple[str, ...]
    """CPU list per NUMA node, indexed by node id."""
    nics: tuple[tuple[str, int], ...]
    """(name, NUMA node) of each NIC worth using for GPUDirect."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _numa(path: Path) -> int:
    text = _read(path)
    try:
        n = int(text) if text is not None else 0
    except ValueError:
        return 0
    return max(0, n)


def cpus(root: Path = Path("/")) -> set[int]:
    """CPUs this process may use."""
    if root == Path("/"):
        try:
            return set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            pass
    text = _read(root / "sys/devices/system/cpu/online")
    if text:
        try:
            return parse_cpu_list(text)
        except ValueError:
            pass
    return set(range(os.cpu_count() or 1))


def cpu_milli(root: Path = Path("/")) -> int:
    """Usable CPU in thousandths: the affinity set, capped by a cgroup quota."""
    milli = len(cpus(root)) * 1000
    quota = _read(root / "sys/fs/cgroup/cpu.max")
    if quota:
        parts = quota.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                milli = min(milli, int(int(parts[0]) * 1000 / int(parts[1])))
            except (ValueError, ZeroDivisionError):
                pass
    return milli


def memory_mib(root: Path = Path("/")) -> int:
    """Usable memory in MiB: ``MemTotal``, capped by a cgroup limit."""
    total = 0
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
            break
    limit = _read(root / "sys/fs/cgroup/memory.max")
    if limit and limit != "max":
        try:
            total = min(total, int(limit)) if total else int(limit)
        except ValueError:
            pass
    return total // (1024 * 1024)


def numa_cpus(root: Path = Path("/")) -> tuple[str, ...]:
    """CPU lists per NUMA node (one entry of every usable CPU when sysfs has no nodes)."""
    base = root / "sys/devices/system/node"
    nodes: dict[int, str] = {}
    try:
        for p in base.iterdir():
            m = re.fullmatch(r"node(\d+)", p.name)
            if m:
                nodes[int(m.group(1))] = _read(p / "cpulist") or ""
    except OSError:
        pass
    if not nodes:
        return (cpu_list(cpus(root)),)
    return tuple(nodes.get(i, "") for i in range(max(nodes) + 1))


def nics(root: Path = Path("/")) -> tuple[tuple[str, int], ...]:
    """NICs for GPUDirect: RDMA devices first; else physical net interfaces."""
    out: list[tuple[str, int]] = []
    ib = root / "sys/class/infiniband"
    try:
        rdma = sorted(ib.iterdir())
    except OSError:
        rdma = []
    for dev in rdma:
        names = sorted(p.name for p in (dev / "device/net").glob("*")) or [dev.name]
        numa = _numa(dev / "device/numa_node")
        out.extend((n, numa) for n in names[:1])
    if out:
        return tuple(out)
    try:
        nets = sorted((root / "sys/class/net").iterdir())
    except OSError:
        return ()
    for dev in nets:
        if (dev / "device").exists():
            out.append((dev.name, _numa(dev / "device/numa_node")))
    return tuple(out)


def pcie_switch(bus: str, root: Path = Path("/")) -> str:
    """The upstream bridge a PCI device hangs behind (``""`` when sysfs does not say)."""
    if not _BDF.match(bus):
        return ""
    link = root / "sys/bus/pci/devices" / bus
    try:
        path = link.resolve(strict=True)
    except OSError:
        return ""
    chain = [p for p in path.parts if _BDF.match(p)]
    # device <- downstream port <- switch upstream port: only a chain that deep has a switch.
    return chain[-3] if len(chain) >= 3 else ""


def pci_numa(bus: str, root: Path = Path("/")) -> int | None:
    """The NUMA node sysfs gives a PCI device, or None."""
    if not _BDF.match(bus):
        return None
    text = _read(root / "sys/bus/pci/devices" / bus / "numa_node")
    try:
        n = int(text) if text is not None else -1
    except ValueError:
        return None
    return n if n >= 0 else None


def probe(root: Path = Path("/")) -> Host:
    """The host's CPUs, memory, NUMA layout and NICs."""
    return Host(cpu_milli(root), memory_mib(root), numa_cpus(root), nics(root))
