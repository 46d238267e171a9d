"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Per device: index, UUID, name, total memory, CUDA compute capability, MIG instances
(when MIG mode is on), NVLink neighbours (the remote PCI bus id of each active link;
a remote that is not a GPU is an NVSwitch, so every GPU cabled to one joins the
``nvswitch`` fabric), NUMA node and CPU affinity, and health: volatile uncorrected
ECC errors, pending or failed row remapping, a lost GPU, and critical XID events
(``XidWatch``).

The calls used and what they return (pynvml 13.x; ``nvidia-ml-py`` wraps the C API
one to one, ``@convertStrBytes`` makes strings ``str``):

- ``nvmlInit()``, ``nvmlShutdown()``; ``nvmlDeviceGetCount() -> int``;
  ``nvmlDeviceGetHandleByIndex(i) -> handle``
- ``nvmlDeviceGetUUID(h) -> "GPU-..."``, ``nvmlDeviceGetName(h) -> "NVIDIA H100 80GB HBM3"``
- ``nvmlDeviceGetMemoryInfo(h)`` -> struct with ``.total`` (bytes)
- ``nvmlDeviceGetCudaComputeCapability(h) -> (9, 0)``
- ``nvmlDeviceGetPciInfo(h)`` -> struct with ``.busId`` (``"00000000:18:00.0"``)
- ``nvmlDeviceGetMigMode(h) -> [current, pending]``; ``nvmlDeviceGetMaxMigDeviceCount(h)``;
  ``nvmlDeviceGetMigDeviceHandleByIndex(h, k)`` (``NVMLError`` NOT_FOUND for an empty slot)
- ``nvmlDeviceGetNvLinkState(h, link) -> 0/1``; ``nvmlDeviceGetNvLinkRemotePciInfo(h, link)``
  -> struct with ``.busId``; links ``0 .. NVML_NVLINK_MAX_LINKS-1``
- ``nvmlDeviceGetNumaNodeId(h) -> int``; ``nvmlDeviceGetCpuAffinity(h, words)`` -> array of
  64-bit masks
- ``nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)``;
  ``nvmlDeviceGetRemappedRows(h) -> (corrected, uncorrected, pending, failure)``
- ``nvmlEventSetCreate()``, ``nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, set)``,
  ``nvmlEventSetWait(set, ms)`` -> struct with ``.device``, ``.eventType``, ``.eventData`` (the
  XID); ``NVMLError`` TIMEOUT when none is waiting

Every call that a device or driver does not support (``NVMLError`` NOT_SUPPORTED and
friends) leaves that fact out rather than failing discovery.
"""

from __future__ import annotations

import logging
import math
import os
from types import ModuleType
from typing import Any

from accord.agent.discovery.found import Found, bitmask_cpus, cpu_list

log = logging.getLogger("accord.agent")

CRITICAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
"""XIDs after which a GPU needs a reset or replacement (NVIDIA's XID catalogue:
double-bit ECC, row-remap events, NVLink errors, fell off the bus, contained and
uncontained ECC errors, GSP errors, unrecovered ECC)."""


def load() -> ModuleType | None:
    """``pynvml`` initialised, or None when the library or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.info("NVML unavailable: %s", e)
        return None
    mod: ModuleType = pynvml
    return mod


def _try(nvml: Any, fn: str, *args: Any) -> Any:
    """``nvml.fn(*args)``, or None when the call is missing or the device refuses it."""
    f = getattr(nvml, fn, None)
    if f is None:
        return None
    try:
        return f(*args)
    except nvml.NVMLError:
        return None


def _bus(pci: Any) -> str:
    """A PCI bus id in sysfs form: NVML's 8-digit domain cut to 4, lower case."""
    bus = pci.busId
    if isinstance(bus, bytes):
        bus = bus.decode()
    bus = str(bus).lower()
    dom, sep, rest = bus.partition(":")
    return f"{dom[-4:]}:{rest}" if sep and len(dom) > 4 else bus


def probe(nvml: Any) -> list[Found]:
    """Every GPU NVML sees (``nvml`` initialised)."""
    out: list[Found] = []
    ncpu = os.cpu_count() or 1
    words = max(1, math.ceil(ncpu / 64))
    count = int(nvml.nvmlDeviceGetCount())
    for i in range(count):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except nvml.NVMLError as e:
            out.append(Found("nvidia", i, "unknown", 0, unhealthy=f"NVML cannot open it: {e}"))
            continue
        out.append(_device(nvml, i, h, words))
    return out


def _device(nvml: Any, i: int, h: Any, words: int) -> Found:
    name = _try(nvml, "nvmlDeviceGetName", h) or "unknown"
    mem = _try(nvml, "nvmlDeviceGetMemoryInfo", h)
    cc = _try(nvml, "nvmlDeviceGetCudaComputeCapability", h)
    pci = _try(nvml, "nvmlDeviceGetPciInfo", h)
    f = Found("nvidia", i, str(name), int(mem.total) if mem is not None else 0,
              uuid=str(_try(nvml, "nvmlDeviceGetUUID", h) or ""))
    if cc is not None:
        f.capability = float(f"{cc[0]}.{cc[1]}")
        f.arch = f"sm_{cc[0]}{cc[1]}"
    if pci is not None:
        f.pci_bus = _bus(pci)
    numa = _try(nvml, "nvmlDeviceGetNumaNodeId", h)
    if isinstance(numa, int) and numa >= 0:
        f.numa = numa
    aff = _try(nvml, "nvmlDeviceGetCpuAffinity", h, words)
    if aff is not None:
        f.cpus = cpu_list(bitmask_cpus(list(aff)))
    f.links = _links(nvml, h)
    f.mig = _mig(nvml, h)
    if f.mig:
        f.extra["mig"] = True
        f.extra["mig_instances"] = len(f.mig)
    f.unhealthy = health(nvml, h)
    return f


def _links(nvml: Any, h: Any) -> set[str]:
    out: set[str] = set()
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        state = _try(nvml, "nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            if link == 0:
                return out  # no NVLink on this device
            continue
        if state != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
            continue
        remote = _try(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if remote is not None:
            out.add(_bus(remote))
    return out


def _mig(nvml: Any, h: Any) -> tuple[str, ...]:
    mode = _try(nvml, "nvmlDeviceGetMigMode", h)
    if not mode or mode[0] != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return ()
    uuids = []
    for k in range(int(_try(nvml, "nvmlDeviceGetMaxMigDeviceCount", h) or 0)):
        m = _try(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", h, k)
        if m is None:
            continue  # an empty slot
        u = _try(nvml, "nvmlDeviceGetUUID", m)
        if u:
            uuids.append(str(u))
    return tuple(uuids)


def health(nvml: Any, h: Any) -> str:
    """Why the device is unhealthy (ECC, row remapping, lost), or ``""``."""
    try:
        nvml.nvmlDeviceGetMemoryInfo(h)
    except nvml.NVMLError as e:
        lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        if getattr(e, "value", None) == lost:
            return "GPU is lost (fell off the bus)"
    ecc = _try(nvml, "nvmlDeviceGetTotalEccErrors", h,
               getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
               getattr(nvml, "NVML_VOLATILE_ECC", 0))
    if isinstance(ecc, int) and ecc > 0:
        return f"{ecc} uncorrected ECC error(s) since the last driver load"
    rows = _try(nvml, "nvmlDeviceGetRemappedRows", h)
    if rows is not None:
        _corr, _unc, pending, failure = rows
        if failure:
            return "row remapping failed"
        if pending:
            return "row remapping pending (needs a GPU reset)"
    return ""


class XidWatch:
    """Critical XID events, gathered without blocking (``poll``), sticky per device index."""

    def __init__(self, nvml: Any, count: int) -> None:
        self.nvml = nvml
        self.bad: dict[int, str] = {}
        self._handles: dict[Any, int] = {}
        self._set: Any = _try(nvml, "nvmlEventSetCreate")
        if self._set is None:
            return
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", 8)
        for i in range(count):
            h = _try(nvml, "nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue
            self._handles[_key(h)] = i
            _try(nvml, "nvmlDeviceRegisterEvents", h, kind, self._set)

    def poll(self, limit: int = 64) -> dict[int, str]:
        """Drain waiting events; returns every device index ever hit by a critical XID."""
        if self._set is None:
            return self.bad
        for _ in range(limit):
            try:
                ev = self.nvml.nvmlEventSetWait(self._set, 0)
            except self.nvml.NVMLError:
                break  # TIMEOUT: nothing waiting
            xid = int(ev.eventData)
            i = self._handles.get(_key(ev.device))
            if i is not None and xid in CRITICAL_XIDS:
                self.bad[i] = f"critical XID {xid}"
        return self.bad

    def close(self) -> None:
        """Free the event set."""
        if self._set is not None:
            _try(self.nvml, "nvmlEventSetFree", self._set)
            self._set = None


def _key(handle: Any) -> Any:
    """A hashable identity for an NVML handle (a ctypes pointer compares by address)."""
    value = getattr(handle, "contents", None)
    if value is not None:
        try:
            import ctypes

            return ctypes.addressof(value)
        except TypeError:
            pass
    return handle
