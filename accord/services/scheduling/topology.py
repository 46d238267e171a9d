"""Topology: inside a node (islands, PCIe switches, NUMA) and the network tree.

Two jobs: build realistic node descriptions (HGX-style NVIDIA, MI300X-style AMD,
Xe Link Intel systems) for tests and simulation, and choose *which* devices of a
node a task gets so that they share the narrowest domain (island > PCIe switch >
NUMA) while leaving whole islands free for later tasks (best fit).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from accord.services.scheduling.model import Device, Nic, Node

GiB = 2**30

LOCALITY_ORDER = ("island", "switch", "numa", "node", "leaf", "spine", "block", "cluster")
"""Scoring order, best first: sharing a narrower domain scores higher."""

_VENDOR_DEFAULTS: dict[str, tuple[str, str, float, int]] = {
    # vendor -> (model, arch, capability, memory GiB)
    "nvidia": ("H100", "sm_90", 9.0, 80),
    "amd": ("MI300X", "gfx942", 9.42, 192),
    "intel": ("Max1550", "xe-hpc", 1.0, 128),
}


def make_node(
    name: str,
    *,
    gpus: int = 8,
    vendor: str = "nvidia",
    model: str | None = None,
    memory_gib: int | None = None,
    arch: str | None = None,
    capability: float | None = None,
    islands: int = 1,
    numa_nodes: int = 2,
    cores_per_numa: int = 56,
    cpu_milli: int | None = None,
    memory_mib: int = 2 * 1024 * 1024,
    leaf: str = "leaf-0",
    spine: str = "spine-0",
    block: str = "block-0",
    address: str | None = None,
) -> Node:
    """A node with ``gpus`` devices split evenly over islands, PCIe switches (2 GPUs each) and NUMA nodes."""
    dm, da, dc, dmem = _VENDOR_DEFAULTS.get(vendor, ("GPU", "", 0.0, 16))
    islands = max(1, min(islands, gpus)) if gpus else 1
    numa_nodes = max(1, numa_nodes)
    devices = []
    for i in range(gpus):
        devices.append(Device(
            index=i, vendor=vendor, model=model or dm,
            memory=(memory_gib if memory_gib is not None else dmem) * GiB,
            arch=arch if arch is not None else da,
            capability=capability if capability is not None else dc,
            island=i * islands // gpus, pcie_switch=i // 2, numa=i * numa_nodes // gpus,
        ))
    numa_cpus = tuple(
        f"{n * cores_per_numa}-{(n + 1) * cores_per_numa - 1}" for n in range(numa_nodes)
    )
    nics = tuple(Nic(f"nic{i}", i * numa_nodes // max(1, gpus // 2)) for i in range(max(1, gpus // 2)))
    return Node(
        name=name, address=address or name,
        cpu_milli=cpu_milli if cpu_milli is not None else numa_nodes * cores_per_numa * 1000,
        memory_mib=memory_mib, devices=tuple(devices), numa_cpus=numa_cpus, nics=nics,
        leaf=leaf, spine=spine, block=block,
    )


def make_cluster(
    nodes: int, *, gpus: int = 8, nodes_per_leaf: int = 32, leaves_per_spine: int = 8,
    spines_per_block: int = 4, prefix: str = "node", **kw: object,
) -> list[Node]:
    """A fat-tree cluster of identical nodes (``kw`` goes to ``make_node``)."""
    out = []
    for i in range(nodes):
        leaf = i // nodes_per_leaf
        spine = leaf // leaves_per_spine
        block = spine // spines_per_block
        out.append(make_node(
            f"{prefix}-{i:05d}", gpus=gpus, leaf=f"leaf-{leaf}", spine=f"spine-{spine}",
            block=f"block-{block}", **kw,  # type: ignore[arg-type]
        ))
    return out


def domain_of(node: Node, level: str) -> str:
    """The node's domain name at a network level (``node``, ``leaf``, ``spine``, ``block``)."""
    if level in ("island", "node"):
        return node.name
    if level == "leaf":
        return node.leaf
    if level == "spine":
        return node.spine
    if level == "block":
        return node.block
    return ""


def locality(devices: Sequence[Device]) -> int:
    """Index into ``LOCALITY_ORDER`` of the narrowest in-node domain holding all ``devices``."""
    if len({d.island for d in devices}) <= 1 and len(devices) > 1:
        return 0
    if len({d.pcie_switch for d in devices}) <= 1:
        return 0 if len(devices) <= 1 else 1
    if len({d.numa for d in devices}) <= 1:
        return 2
    return 3


def _pick_groups(groups: list[list[int]], k: int) -> list[int]:
    """Take ``k`` ids from groups: the smallest single group that fits, else largest first."""
    fitting = [g for g in groups if len(g) >= k]
    if fitting:
        best = min(fitting, key=len)
        return best[:k]
    out: list[int] = []
    for g in sorted(groups, key=len, reverse=True):
        out.extend(g[: k - len(out)])
        if len(out) == k:
            break
    return out


def choose_devices(devices: Sequence[Device], free: Iterable[int], k: int) -> list[int] | None:
    """Pick ``k`` of the ``free`` device positions, keeping them in one island, switch, NUMA if possible.

    Best fit at each level: the smallest island that holds all ``k`` (so larger
    islands stay whole), within it the smallest PCIe switch group, else the
    smallest NUMA node, else fill from the largest groups. Deterministic.
    """
    free_l = sorted(free)
    if len(free_l) < k:
        return None
    if k == len(free_l):
        return free_l
    by_island: dict[int, list[int]] = {}
    for p in free_l:
        by_island.setdefault(devices[p].island, []).append(p)
    island_fit = [g for g in by_island.values() if len(g) >= k]
    pool = min(island_fit, key=len) if island_fit else free_l
    if k == 1:
        # Single device: take it from the emptiest switch so pairs stay whole.
        by_sw: dict[int, list[int]] = {}
        for p in pool:
            by_sw.setdefault(devices[p].pcie_switch, []).append(p)
        return [min(by_sw.values(), key=len)[0]]
    by_sw2: dict[int, list[int]] = {}
    for p in pool:
        by_sw2.setdefault(devices[p].pcie_switch, []).append(p)
    if any(len(g) >= k for g in by_sw2.values()):
        return _pick_groups(list(by_sw2.values()), k)
    by_numa: dict[int, list[int]] = {}
    for p in pool:
        by_numa.setdefault(devices[p].numa, []).append(p)
    if any(len(g) >= k for g in by_numa.values()):
        numa_pool = min((g for g in by_numa.values() if len(g) >= k), key=len)
        by_sw3: dict[int, list[int]] = {}
        for p in numa_pool:
            by_sw3.setdefault(devices[p].pcie_switch, []).append(p)
        return _pick_groups(list(by_sw3.values()), k)
    if island_fit:
        return _pick_groups(list(by_numa.values()), k)
    return _pick_groups(list(by_island.values()), k)
