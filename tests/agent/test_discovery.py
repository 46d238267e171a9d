"""Discovery from recorded vendor-library outputs and sysfs trees, and on this machine."""

from __future__ import annotations

from pathlib import Path

from accord.agent.discovery import amd, host, intel, nvidia
from accord.agent.discovery.found import bitmask_cpus, cpu_list, parse_cpu_list
from accord.agent.discovery.inventory import Discoverer
from accord.services.scheduling.model import Node
from tests.agent import fakes, sysfs

GIB = 2**30


def test_cpu_lists_round_trip() -> None:
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert parse_cpu_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert bitmask_cpus([0b101, 1]) == {0, 2, 64}


def test_hgx_h100_is_one_nvswitch_island_on_two_numa_nodes(tmp_path: Path) -> None:
    sysfs.two_socket_host(tmp_path)
    nvml = fakes.hgx_h100()
    inv = Discoverer("hgx", "10.0.0.5", nvml=nvml, root=tmp_path).inventory()
    node = inv.node
    assert [d.index for d in node.devices] == list(range(8))
    d0 = node.devices[0]
    assert (d0.vendor, d0.model, d0.memory, d0.arch, d0.capability) == (
        "nvidia", "NVIDIA H100 80GB HBM3", 81559 * 2**20, "sm_90", 9.0)
    assert inv.uuids[0] == "GPU-h100-0000" and d0.attributes == ()
    assert {d.class_key() for d in node.devices} == {d0.class_key()}  # one class: gangs fit
    assert {d.pcie_switch for d in node.devices} == {0}  # sysfs shows no switch for them
    assert {d.island for d in node.devices} == {0}
    assert [d.numa for d in node.devices] == [0] * 4 + [1] * 4
    assert inv.cpus[0] == "0-55" and inv.cpus[7] == "56-111"
    assert node.numa_cpus == ("0-55", "56-111")
    assert node.cpu_milli == 64_000 and node.memory_mib == 2**20
    assert [(n.name, n.numa) for n in node.nics] == [("ibp24s0", 0), ("ibp155s0", 1)]
    assert inv.unhealthy == {} and inv.sources == ("nvml",)
    # The node travels as the scheduler's wire form unchanged.
    assert Node.from_wire(node.to_wire()) == node


def test_nvlink_pairs_mig_and_ecc(tmp_path: Path) -> None:
    sysfs.two_socket_host(tmp_path)
    for i, bdf in enumerate(["0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"]):
        # GPUs 0-1 behind one PCIe switch, 2-3 behind another.
        sw = "0000:15:00.0" if i < 2 else "0000:af:00.0"
        sysfs.pci_device(tmp_path, ["0000:00:01.0", sw, f"0000:16:0{i}.0", bdf], 0 if i < 2 else 1)
    inv = Discoverer("pcie", nvml=fakes.pcie_pairs(), root=tmp_path).inventory()
    devs = inv.node.devices
    assert [d.island for d in devs] == [0, 0, 1, 1]
    assert [d.pcie_switch for d in devs] == [0, 0, 1, 1]
    # nvmlDeviceGetNumaNodeId unsupported: the PCI device's numa_node says.
    assert [d.numa for d in devs] == [0, 0, 1, 1]
    assert inv.mig == {2: ("MIG-a100-2-0", "MIG-a100-2-2")}
    assert dict(devs[2].attributes)["mig_instances"] == 2
    assert inv.unhealthy == {3: "2 uncorrected ECC error(s) since the last driver load"}


def test_health_refresh_sees_xid_lost_gpu_and_row_remapping(tmp_path: Path) -> None:
    sysfs.two_socket_host(tmp_path)
    nvml = fakes.hgx_h100()
    d = Discoverer("hgx", nvml=nvml, root=tmp_path)
    assert d.inventory().unhealthy == {}
    assert sorted(nvml.registered) == list(range(8))
    nvml.xid(5, 79)   # fell off the bus: critical
    nvml.xid(1, 13)   # graphics engine exception: an application fault, not the GPU's
    nvml.gpus[6].remapped = (0, 1, 1, 0)
    nvml.gpus[2].lost = True
    bad = d.health()
    assert bad == {5: "critical XID 79", 6: "row remapping pending (needs a GPU reset)",
                   2: "GPU is lost (fell off the bus)"}
    assert d.health()[5] == "critical XID 79"  # XIDs stay until the agent restarts
    d.close()
    assert nvml.shutdown


def test_amdsmi_mi300x_one_xgmi_island(tmp_path: Path) -> None:
    sysfs.two_socket_host(tmp_path)
    inv = Discoverer("mi300", amdsmi=fakes.FakeAmdSmi(bad=6), root=tmp_path,
                     load_libraries=False).inventory()
    devs = inv.node.devices
    assert len(devs) == 8 and {d.island for d in devs} == {0}
    assert (devs[0].vendor, devs[0].model, devs[0].arch, devs[0].memory) == (
        "amd", "AMD Instinct MI300X", "gfx942", 192 * GIB)
    assert [d.numa for d in devs] == [0] * 4 + [1] * 4
    assert inv.unhealthy == {6: "3 uncorrectable ECC error(s)"}
    # Without enumeration info (older libraries) the handle order is the index.
    found = amd.probe(fakes.FakeAmdSmi(enumeration=False))
    assert [f.index for f in found] == list(range(8))


def test_kfd_sysfs_without_the_library(tmp_path: Path) -> None:
    sysfs.two_socket_host(tmp_path)
    sysfs.kfd_mi250(tmp_path)
    inv = Discoverer("mi250", root=tmp_path, load_libraries=False).inventory()
    devs = inv.node.devices
    assert inv.sources == ("kfd-sysfs",)
    assert [d.index for d in devs] == [0, 1, 2, 3]
    assert {d.arch for d in devs} == {"gfx90a"} and devs[0].memory == 64 * GIB
    assert [d.island for d in devs] == [0, 0, 1, 1]
    assert [d.numa for d in devs] == [0, 0, 1, 1]
    assert inv.uuids[1] == f"{0xABC1:016x}"


def test_intel_sysfs_discrete_cards_in_pci_order(tmp_path: Path) -> None:
    sysfs.intel_max(tmp_path)
    found = intel.probe_sysfs(tmp_path / "sys")
    assert [(f.index, f.pci_bus, f.numa, f.memory) for f in found] == [
        (0, "0000:29:00.0", 0, 128 * GIB), (1, "0000:3a:00.0", 1, 128 * GIB)]
    assert found[0].model == "intel-0bd5"


def test_host_fallbacks_without_numa_or_cgroup(tmp_path: Path) -> None:
    sysfs.write(tmp_path, "sys/devices/system/cpu/online", "0-3\n")
    sysfs.write(tmp_path, "proc/meminfo", "MemTotal: 8388608 kB\n")
    h = host.probe(tmp_path)
    assert (h.cpu_milli, h.memory_mib, h.numa_cpus, h.nics) == (4000, 8192, ("0-3",), ())


def test_nvml_absent_means_no_nvidia_devices(tmp_path: Path) -> None:
    sysfs.two_socket_host(tmp_path)
    assert nvidia.probe(fakes.FakeNVML([])) == []
    inv = Discoverer("cpu", root=tmp_path, load_libraries=False).inventory()
    assert inv.node.devices == () and inv.node.cpu_milli == 64_000


def test_real_discovery_on_this_machine() -> None:
    """Whatever runs the suite: a node with its CPUs and memory, devices if it has any."""
    d = Discoverer("smoke", "127.0.0.1")
    try:
        inv = d.inventory()
    finally:
        d.close()
    node = inv.node
    assert node.cpu_milli >= 1000 and node.memory_mib > 0
    assert node.numa_cpus and all(parse_cpu_list(c) for c in node.numa_cpus if c)
    assert Node.from_wire(node.to_wire()) == node
    if d.nvml is None and d.amdsmi is None and not inv.sources:
        assert node.devices == ()
    for dev in node.devices:
        assert dev.memory > 0 and dev.model
