"""AMD GPUs through ``amdsmi``, or the KFD topology in sysfs where the library is absent.

amdsmi calls used and their shapes (amdsmi 7.x Python interface, ``amdsmi_interface.py``):

- ``amdsmi_init()``, ``amdsmi_shut_down()``; ``amdsmi_get_processor_handles() -> [handle]``
- ``amdsmi_get_gpu_asic_info(h) -> {"market_name": "AMD Instinct MI300X",
  "target_graphics_version": "gfx942", ...}``
- ``amdsmi_get_gpu_device_uuid(h) -> str``; ``amdsmi_get_gpu_device_bdf(h) -> "0000:0c:00.0"``
- ``amdsmi_get_gpu_memory_total(h, AmdSmiMemoryType.VRAM) -> bytes``
- ``amdsmi_get_gpu_enumeration_info(h) -> {"hip_id": 0, "drm_render": 128, ...}`` (newer
  libraries; the handle order is the fallback index)
- ``amdsmi_topo_get_numa_node_number(h) -> int``
- ``amdsmi_topo_get_link_type(a, b) -> {"hops": 1, "type": AMDSMI_LINK_TYPE_XGMI (2)}``
- ``amdsmi_get_gpu_total_ecc_count(h) -> {"correctable_count", "uncorrectable_count", ...}``

The sysfs fallback reads ``/sys/class/kfd/kfd/topology/nodes/N/properties`` (``key value``
lines, as the amdkfd driver writes them): GPU nodes have ``simd_count > 0``; the ROCr
index is the GPU nodes' order; ``gfx_target_version 90402`` is ``gfx942``; ``hive_id``
(non-zero) names the xGMI hive, so one hive is one island; memory is the sum of
``mem_banks/*/properties`` ``size_in_bytes``; ``location_id`` and ``domain`` give the
PCI bus id, whose ``numa_node`` sysfs holds.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from accord.agent.discovery.found import Found

log = logging.getLogger("accord.agent")

XGMI = 2
"""``AMDSMI_LINK_TYPE_XGMI``."""


def load() -> ModuleType | None:
    """``amdsmi`` initialised, or None when the library or the driver is missing."""
    try:
        # Without libamd_smi.so the wheel prints a hint on stdout and raises KeyError.
        with contextlib.redirect_stdout(io.StringIO()):
            import amdsmi
    except (ImportError, KeyError, OSError):
        return None
    try:
        amdsmi.amdsmi_init()
    except Exception as e:
        log.info("amdsmi unavailable: %s", e)
        return None
    mod: ModuleType = amdsmi
    return mod


def _try(lib: Any, fn: str, *args: Any) -> Any:
    f = getattr(lib, fn, None)
    if f is None:
        return None
    try:
        return f(*args)
    except Exception:  # AmdSmiLibraryException and friends: leave the fact out
        return None


def probe(lib: Any) -> list[Found]:
    """Every GPU amdsmi sees (``lib`` initialised)."""
    handles = list(lib.amdsmi_get_processor_handles())
    vram = getattr(getattr(lib, "AmdSmiMemoryType", None), "VRAM", 0)
    out: list[Found] = []
    for pos, h in enumerate(handles):
        asic = _try(lib, "amdsmi_get_gpu_asic_info", h) or {}
        enum = _try(lib, "amdsmi_get_gpu_enumeration_info", h) or {}
        index = enum.get("hip_id")
        f = Found("amd", index if isinstance(index, int) else pos,
                  str(asic.get("market_name") or "unknown"),
                  int(_try(lib, "amdsmi_get_gpu_memory_total", h, vram) or 0),
                  uuid=str(_try(lib, "amdsmi_get_gpu_device_uuid", h) or ""),
                  arch=str(asic.get("target_graphics_version") or ""))
        f.pci_bus = str(_try(lib, "amdsmi_get_gpu_device_bdf", h) or "").lower()
        numa = _try(lib, "amdsmi_topo_get_numa_node_number", h)
        if isinstance(numa, int) and numa >= 0:
            f.numa = numa
        for other_pos, other in enumerate(handles):
            if other_pos == pos:
                continue
            link = _try(lib, "amdsmi_topo_get_link_type", h, other)
            if link and int(link.get("type", -1)) == XGMI:
                f.links.add(f"hip:{other_pos}")
        f.links = {_peer_bus(lib, handles, x) for x in f.links}
        ecc = _try(lib, "amdsmi_get_gpu_total_ecc_count", h) or {}
        if int(ecc.get("uncorrectable_count", 0) or 0) > 0:
            f.unhealthy = f"{ecc['uncorrectable_count']} uncorrectable ECC error(s)"
        out.append(f)
    return out


def _peer_bus(lib: Any, handles: list[Any], ref: str) -> str:
    pos = int(ref.split(":", 1)[1])
    bus = _try(lib, "amdsmi_get_gpu_device_bdf", handles[pos])
    return str(bus).lower() if bus else ref


def _props(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


def _gfx(version: int) -> str:
    """KFD's ``gfx_target_version`` (``90402``) as an arch name (``gfx942``)."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def probe_sysfs(sysfs: Path = Path("/sys")) -> list[Found]:
    """GPUs from the KFD topology (no library needed); empty when there is none."""
    root = sysfs / "class/kfd/kfd/topology/nodes"
    try:
        nodes = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []
    out: list[Found] = []
    for node in nodes:
        p = _props(node / "properties")
        if p.get("simd_count", 0) <= 0:
            continue  # a CPU node
        mem = 0
        for bank in sorted((node / "mem_banks").glob("*/properties")):
            mem += _props(bank).get("size_in_bytes", 0)
        loc = p.get("location_id", 0)
        bus = f"{p.get('domain', 0):04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1f:02x}.{loc & 7:x}"
        dev_id = p.get("device_id", 0)
        f = Found("amd", len(out), f"amd-{dev_id:04x}", mem,
                  arch=_gfx(p.get("gfx_target_version", 0)), pci_bus=bus)
        numa = _read_int(sysfs / "bus/pci/devices" / bus / "numa_node")
        if numa is not None and numa >= 0:
            f.numa = numa
        hive = p.get("hive_id", 0)
        if hive:
            f.links.add(f"xgmi-hive-{hive:x}")
        uid = p.get("unique_id", 0)
        if uid:
            f.uuid = f"{uid:016x}"
        out.append(f)
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
