"""Recorded procfs/sysfs trees, written under a temporary root for discovery tests.

The file names and formats are the kernel's: ``/proc/meminfo`` lines, cgroup v2
``cpu.max`` (``quota period``) and ``memory.max``, ``nodeN/cpulist``, the amdkfd
topology's ``properties`` files (``key value`` lines), ``/sys/class/infiniband`` and
``/sys/class/net`` device links, PCI device directories nested under their bridges
(``/sys/devices/pci0000:00/<root port>/<switch upstream>/<downstream>/<device>``) with
``/sys/bus/pci/devices/<bdf>`` symlinks to them, and DRM ``cardN/device`` files.
"""

from __future__ import annotations

import os
from pathlib import Path


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def pci_device(root: Path, chain: list[str], numa: int = 0) -> Path:
    """A PCI device at the end of a bridge chain, with its bus/pci/devices symlink."""
    path = root / "sys/devices/pci0000:00"
    for bdf in chain:
        path = path / bdf
    path.mkdir(parents=True, exist_ok=True)
    (path / "numa_node").write_text(f"{numa}\n")
    link = root / "sys/bus/pci/devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        os.symlink(path, link)
    return path


def two_socket_host(root: Path) -> None:
    """112 CPUs on 2 NUMA nodes, 2 TiB, a 64-CPU/1 TiB cgroup, two RDMA NICs and an eth0."""
    write(root, "sys/devices/system/cpu/online", "0-111\n")
    write(root, "sys/devices/system/node/node0/cpulist", "0-55\n")
    write(root, "sys/devices/system/node/node1/cpulist", "56-111\n")
    write(root, "proc/meminfo", "MemTotal:       2113645000 kB\nMemFree:        1000 kB\n")
    write(root, "sys/fs/cgroup/cpu.max", "6400000 100000\n")
    write(root, "sys/fs/cgroup/memory.max", f"{2**40}\n")
    for ib, net, numa, bdf in (("mlx5_0", "ibp24s0", 0, "0000:19:00.0"),
                               ("mlx5_1", "ibp155s0", 1, "0000:9b:00.0")):
        dev = pci_device(root, ["0000:00:01.0", bdf], numa)
        (dev / "net" / net).mkdir(parents=True)
        d = root / "sys/class/infiniband" / ib
        d.mkdir(parents=True)
        os.symlink(dev, d / "device")
    eth = pci_device(root, ["0000:00:1c.0", "0000:03:00.0"], 0)
    (root / "sys/class/net/eth0").mkdir(parents=True)
    os.symlink(eth, root / "sys/class/net/eth0/device")


def kfd_mi250(root: Path) -> None:
    """A CPU node and four gfx90a GPU nodes (two xGMI hives of two), as amdkfd writes them."""
    base = "sys/class/kfd/kfd/topology/nodes"
    write(root, f"{base}/0/properties", "cpu_cores_count 64\nsimd_count 0\nmem_banks_count 1\n"
          "gfx_target_version 0\n")
    for i in range(4):
        loc = (0x29 + 0x20 * i) << 8  # bus << 8 | device << 3 | function
        hive = 0x1111 if i < 2 else 0x2222
        write(root, f"{base}/{i + 1}/properties",
              f"cpu_cores_count 0\nsimd_count 416\nmem_banks_count 1\ngfx_target_version 90010\n"
              f"vendor_id 4098\ndevice_id 29708\nlocation_id {loc}\ndomain 0\n"
              f"drm_render_minor {128 + i}\nhive_id {hive}\nunique_id {0xABC0 + i}\n")
        write(root, f"{base}/{i + 1}/mem_banks/0/properties",
              f"heap_type 1\nsize_in_bytes {64 * 2**30}\nflags 0\n")
        pci_device(root, ["0000:00:07.1", f"0000:{0x29 + 0x20 * i:02x}:00.0"], 0 if i < 2 else 1)


def intel_max(root: Path) -> None:
    """Two discrete Intel GPUs (i915, local memory) and an integrated one."""
    for card, bdf, mem in (("card1", "0000:3a:00.0", 128 * 2**30), ("card0", "0000:29:00.0", 128 * 2**30),
                           ("card2", "0000:00:02.0", 0)):
        dev = pci_device(root, ["0000:00:01.0", bdf], 1 if bdf.startswith("0000:3a") else 0)
        (dev / "vendor").write_text("0x8086\n")
        (dev / "class").write_text("0x038000\n" if mem else "0x030000\n")
        (dev / "device").write_text("0x0bd5\n")
        (dev / "driver").mkdir()
        c = root / "sys/class/drm" / card
        c.mkdir(parents=True)
        os.symlink(dev, c / "device")
        if mem:
            (c / "lmem_total_bytes").write_text(f"{mem}\n")
