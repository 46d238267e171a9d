"""Recorded vendor-library outputs, served by stand-ins for ``pynvml`` and ``amdsmi``.

Each fake implements only the calls discovery makes, returning values of the shapes
the real libraries return (see the docstrings of ``accord/agent/discovery/nvidia.py``
and ``amd.py``, taken from ``nvidia-ml-py`` 13.x's ``pynvml.py`` and amdsmi 7.x's
``amdsmi_interface.py``): plain ints and strs, ``[current, pending]`` lists, tuples,
and structs read by attribute (``.total``, ``.busId``, ``.eventData``), here
``SimpleNamespace``. Errors are the libraries' exception classes with the same
``value`` codes (``NVML_ERROR_NOT_SUPPORTED`` = 3, ``NOT_FOUND`` = 6, ``TIMEOUT`` = 10,
``GPU_IS_LOST`` = 15).

The machines recorded:

- ``hgx_h100()``: an HGX H100 board: 8 x "NVIDIA H100 80GB HBM3" (sm_90, 81559 MiB),
  each with 18 NVLinks to the four NVSwitches (remote bus ids that are not GPUs),
  GPUs 0-3 on NUMA 0 (CPUs 0-55), 4-7 on NUMA 1 (CPUs 56-111).
- ``pcie_pairs()``: 4 x "NVIDIA A100-PCIE-40GB" with NVLink bridges joining 0-1 and
  2-3; GPU 2 in MIG mode with two instances; GPU 3 with 2 volatile uncorrected ECC
  errors; NUMA from ``nvmlDeviceGetNumaNodeId`` unsupported (older driver).
- ``mi300x()``: 8 x "AMD Instinct MI300X" (gfx942, 192 GiB), all joined by xGMI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVLINKS = 18


class NVMLError(Exception):
    """pynvml's ``NVMLError``: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Gpu:
    name: str
    uuid: str
    bus: str
    memory: int
    cc: tuple[int, int]
    numa: int | None
    affinity: list[int]
    links: list[str | None]
    mig: list[str | None] = field(default_factory=list)
    ecc_uncorrected: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    lost: bool = False


class FakeNVML:
    """A stand-in for the ``pynvml`` module over a list of recorded GPUs."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: list[Gpu], *, numa_supported: bool = True) -> None:
        self.gpus = gpus
        self.numa_supported = numa_supported
        self.events: list[SimpleNamespace] = []
        self.registered: list[int] = []
        self.shutdown = False

    # handles are ("gpu", i) or ("mig", i, k)
    def _gpu(self, h: tuple[Any, ...]) -> Gpu:
        g = self.gpus[h[1]]
        if g.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return g

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[Any, ...]:
        if not 0 <= i < len(self.gpus):
            raise NVMLError(2)  # INVALID_ARGUMENT
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h: tuple[Any, ...]) -> str:
        if h[0] == "mig":
            return str(self.gpus[h[1]].mig[h[2]])
        return self._gpu(h).uuid

    def nvmlDeviceGetName(self, h: tuple[Any, ...]) -> str:
        return self._gpu(h).name

    def nvmlDeviceGetMemoryInfo(self, h: tuple[Any, ...]) -> SimpleNamespace:
        g = self._gpu(h)
        return SimpleNamespace(total=g.memory, free=g.memory, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, h: tuple[Any, ...]) -> tuple[int, int]:
        return self._gpu(h).cc

    def nvmlDeviceGetPciInfo(self, h: tuple[Any, ...]) -> SimpleNamespace:
        # NVML's bus id has an 8-digit domain and upper-case hex.
        return SimpleNamespace(busId="0000" + self._gpu(h).bus.upper())

    def nvmlDeviceGetNumaNodeId(self, h: tuple[Any, ...]) -> int:
        g = self._gpu(h)
        if not self.numa_supported or g.numa is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return g.numa

    def nvmlDeviceGetCpuAffinity(self, h: tuple[Any, ...], words: int) -> list[int]:
        return (self._gpu(h).affinity + [0] * words)[:max(words, len(self._gpu(h).affinity))]

    def nvmlDeviceGetNvLinkState(self, h: tuple[Any, ...], link: int) -> int:
        g = self._gpu(h)
        if not g.links:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        if link >= NVLINKS:
            raise NVMLError(2)  # INVALID_ARGUMENT past the device's links
        return 1 if link < len(g.links) and g.links[link] is not None else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: tuple[Any, ...], link: int) -> SimpleNamespace:
        target = self._gpu(h).links[link]
        assert target is not None
        return SimpleNamespace(busId="0000" + target.upper())

    def nvmlDeviceGetMigMode(self, h: tuple[Any, ...]) -> list[int]:
        return [1, 1] if self._gpu(h).mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple[Any, ...]) -> int:
        return 7 if self._gpu(h).mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple[Any, ...], k: int) -> tuple[Any, ...]:
        g = self._gpu(h)
        if k >= len(g.mig) or g.mig[k] is None:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], k)

    def nvmlDeviceGetTotalEccErrors(self, h: tuple[Any, ...], kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)
        return self._gpu(h).ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: tuple[Any, ...]) -> tuple[int, int, int, int]:
        return self._gpu(h).remapped

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: tuple[Any, ...], kinds: int, event_set: str) -> None:
        assert kinds & self.nvmlEventTypeXidCriticalError
        self.registered.append(h[1])

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if not self.events:
            raise NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def xid(self, i: int, xid: int) -> None:
        """Record an XID event on GPU ``i`` (as the driver would)."""
        self.events.append(SimpleNamespace(device=("gpu", i), eventType=8, eventData=xid,
                                           gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))


def hgx_h100() -> FakeNVML:
    switches = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    buses = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
             "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
    gpus = []
    for i, bus in enumerate(buses):
        numa = 0 if i < 4 else 1
        mask = [(1 << 56) - 1, 0] if numa == 0 else [((1 << 64) - 1) ^ ((1 << 56) - 1), (1 << 48) - 1]
        links: list[str | None] = [switches[k % 4] for k in range(NVLINKS)]
        gpus.append(Gpu("NVIDIA H100 80GB HBM3", f"GPU-h100-{i:04d}", bus, 81559 * 2**20, (9, 0),
                        numa, mask, links))
    return FakeNVML(gpus)


def pcie_pairs() -> FakeNVML:
    buses = ["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"]
    peer = {0: 1, 1: 0, 2: 3, 3: 2}
    gpus = []
    for i, bus in enumerate(buses):
        links: list[str | None] = [buses[peer[i]], buses[peer[i]], buses[peer[i]], None]
        mask = [0x0FFF] if i < 2 else [0xFFF000]
        gpus.append(Gpu("NVIDIA A100-PCIE-40GB", f"GPU-a100-{i:04d}", bus, 40960 * 2**20, (8, 0),
                        None, mask, links))
    gpus[2].mig = ["MIG-a100-2-0", None, "MIG-a100-2-2"]
    gpus[3].ecc_uncorrected = 2
    return FakeNVML(gpus, numa_supported=False)


class AmdSmiException(Exception):
    """amdsmi's library exception."""


class FakeAmdSmi:
    """A stand-in for the ``amdsmi`` module: eight MI300X joined by xGMI."""

    AmdSmiLibraryException = AmdSmiException
    AmdSmiMemoryType = SimpleNamespace(VRAM=0, VIS_VRAM=1, GTT=2)

    def __init__(self, count: int = 8, *, bad: int | None = None, enumeration: bool = True) -> None:
        self.handles = [SimpleNamespace(pos=i) for i in range(count)]
        self.bad = bad
        self.enumeration = enumeration

    def amdsmi_shut_down(self) -> None:
        pass

    def amdsmi_get_processor_handles(self) -> list[SimpleNamespace]:
        return list(self.handles)

    def amdsmi_get_gpu_asic_info(self, h: SimpleNamespace) -> dict[str, Any]:
        return {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002",
                "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "device_id": "0x74a1",
                "rev_id": "0x00", "asic_serial": f"0x{h.pos:016X}", "oam_id": h.pos,
                "num_compute_units": 304, "target_graphics_version": "gfx942"}

    def amdsmi_get_gpu_enumeration_info(self, h: SimpleNamespace) -> dict[str, Any]:
        if not self.enumeration:
            raise AmdSmiException("not supported")
        return {"drm_render": 128 + h.pos, "drm_card": h.pos, "hsa_id": 2 + h.pos,
                "hip_id": h.pos, "hip_uuid": f"GPU-{h.pos:016x}"}

    def amdsmi_get_gpu_device_uuid(self, h: SimpleNamespace) -> str:
        return f"{h.pos:02x}ff74a1-0000-1000-8000-000000000000"

    def amdsmi_get_gpu_device_bdf(self, h: SimpleNamespace) -> str:
        return f"0000:{0x0c + 0x10 * h.pos:02x}:00.0"

    def amdsmi_get_gpu_memory_total(self, h: SimpleNamespace, kind: int) -> int:
        assert kind == 0
        return 192 * 2**30

    def amdsmi_topo_get_numa_node_number(self, h: SimpleNamespace) -> int:
        return 0 if h.pos < 4 else 1

    def amdsmi_topo_get_link_type(self, a: SimpleNamespace, b: SimpleNamespace) -> dict[str, int]:
        return {"hops": 1, "type": 2}

    def amdsmi_get_gpu_total_ecc_count(self, h: SimpleNamespace) -> dict[str, int]:
        return {"correctable_count": 0, "uncorrectable_count": 3 if h.pos == self.bad else 0,
                "deferred_count": 0}
