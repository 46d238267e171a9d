"""Device choice inside a node, gang topology preference, and the FGD fragmentation measure."""

from __future__ import annotations

from collections import Counter

from accord.services.scheduling.capacity import CapacityIndex
from accord.services.scheduling.fragmentation import TaskType, Workload
from accord.services.scheduling.model import Job, Topology
from accord.services.scheduling.placement import Policy, place, take
from accord.services.scheduling.topology import choose_devices, make_cluster, make_node


def test_choose_devices_prefers_one_island_and_keeps_islands_whole() -> None:
    node = make_node("n", gpus=8, islands=2)  # islands {0-3}, {4-7}; switches pairs; NUMA halves
    devs = node.devices
    # Island 0 has 2 idle, island 1 has 4 idle: a 2-GPU task takes island 0 (best fit).
    assert choose_devices(devs, [2, 3, 4, 5, 6, 7], 2) == [2, 3]
    # A 4-GPU task needs a whole island: island 1.
    assert choose_devices(devs, [2, 3, 4, 5, 6, 7], 4) == [4, 5, 6, 7]
    # One device comes from the emptiest switch, leaving full pairs intact.
    assert choose_devices(devs, [1, 4, 5], 1) == [1]
    # Not enough idle devices.
    assert choose_devices(devs, [0, 1], 3) is None


def test_gang_prefers_one_node_then_one_leaf() -> None:
    idx = CapacityIndex()
    for n in make_cluster(8, nodes_per_leaf=4):
        idx.add_node(n)
    # Fragment leaf-0: one node half used.
    half = Job("x", devices_per_task=4)
    first = place(idx, half, Policy())
    assert first is not None
    take(idx, half, first)
    p = place(idx, Job("g", tasks=4, devices_per_task=2), Policy())
    assert p is not None and len({t.node for t in p.tasks}) == 1, "a 4x2 gang fits on one node"
    p = place(idx, Job("g2", tasks=4, devices_per_task=8, topology=Topology("leaf", False)), Policy())
    assert p is not None
    leaves = {idx.nodes[t.node].node.leaf for t in p.tasks}
    assert leaves == {"leaf-1"}, "a 4-node gang goes to the leaf with four idle nodes"
    assert place(idx, Job("g3", tasks=5, devices_per_task=8, topology=Topology("leaf", True)),
                 Policy()) is None, "no leaf holds five idle nodes"
    assert place(idx, Job("g3", tasks=5, devices_per_task=8), Policy()) is not None


def test_fragmentation_measure_by_hand() -> None:
    idx = CapacityIndex()
    idx.add_node(make_node("n", gpus=2, cpu_milli=8000))
    # Mix: half the tasks want one whole GPU with 2 cores, half want 0.5 GPU with 6 cores.
    wl = Workload(Counter({TaskType(1, 1000, 2000, 0, ""): 1, TaskType(1, 500, 6000, 0, ""): 1}))
    nc = idx.nodes["n"]
    # Idle node: four 2-core tasks fit (2 GPUs used, none stranded); the CPU holds only one
    # 6-core half-GPU task, which strands 1500 of the 2000 idle thousandths.
    assert wl.node_frag(idx, nc.sig) == 0.5 * 0 + 0.5 * 1500
    idx.allocate("n", [0], 700, 0, 0)  # device 0 has 300 left: useless to both types
    # whole type: 300 stranded; half type: one copy (CPU-bound) on device 1, 1300 - 500 left.
    assert wl.node_frag(idx, idx.nodes["n"].sig) == 0.5 * 300 + 0.5 * 800
    idx.allocate("n", [], 0, 4000, 0)  # 4 cores left: the 6-core type cannot run at all
    # whole type: 300 fragmented; half type: all 1300 idle thousandths fragmented.
    assert wl.node_frag(idx, idx.nodes["n"].sig) == 0.5 * 300 + 0.5 * 1300
    assert wl.cluster_frag(idx) == (0.5 * 300 + 0.5 * 1300) / 1000


def test_fill_measure_counts_gpus_a_type_strands_for_lack_of_cpu() -> None:
    idx = CapacityIndex()
    idx.add_node(make_node("n", gpus=4, cpu_milli=20000))
    # One-GPU tasks with 8 cores: only two fit on 20 cores, so two of four idle GPUs are stranded
    # even though one more task fits (the one-step FGD measure would say 0).
    wl = Workload(Counter({TaskType(1, 1000, 8000, 0, ""): 1}))
    assert wl.node_frag(idx, idx.nodes["n"].sig) == 2000
    # Two-GPU tasks on three whole GPUs: one copy fits, one whole GPU is left over.
    idx.allocate("n", [0], 1000, 0, 0)
    wl2 = Workload(Counter({TaskType(2, 1000, 0, 0, ""): 1}))
    assert wl2.node_frag(idx, idx.nodes["n"].sig) == 1000


def test_cpu_heavy_task_goes_where_it_strands_no_gpu() -> None:
    idx = CapacityIndex()
    idx.add_node(make_node("lean", gpus=8, cpu_milli=96000))   # 12 cores per GPU
    idx.add_node(make_node("fat", gpus=2, cpu_milli=104000))   # 52 cores per GPU
    mix = Workload(Counter({TaskType(1, 1000, 11000, 0, ""): 3, TaskType(1, 470, 24000, 0, ""): 1}))
    p = place(idx, Job("h", gpu_milli=470, cpu_milli=24000), Policy("accord", workload=mix))
    assert p is not None and p.tasks[0].node == "fat", "a CPU-heavy share belongs on the CPU-rich node"
    p = place(idx, Job("l", cpu_milli=11000), Policy("accord", workload=mix))
    assert p is not None and p.tasks[0].node == "lean", "a CPU-light GPU task fills the CPU-poor node"


def test_supply_pressure_leaves_scarce_types_to_constrained_work() -> None:
    idx = CapacityIndex()
    idx.add_node(make_node("big", gpus=8, model="G2", cpu_milli=96000))
    idx.add_node(make_node("rare", gpus=8, model="P100", cpu_milli=96000))
    # A third of the mix can only use P100; an unconstrained task should not eat into it.
    mix = Workload(Counter({TaskType(1, 1000, 0, 0, ""): 2, TaskType(1, 1000, 0, 0, "model == P100"): 1}))
    pressure = mix.class_pressure(idx)
    big_cls = idx.nodes["big"].cls[0]
    rare_cls = idx.nodes["rare"].cls[0]
    assert pressure[rare_cls] > pressure[big_cls]
    p = place(idx, Job("u"), Policy("accord", workload=mix))
    assert p is not None and p.tasks[0].node == "big"
    # With no constrained work in the mix the two classes weigh the same.
    flat = Workload(Counter({TaskType(1, 1000, 0, 0, ""): 1}))
    assert flat.class_pressure(idx)[rare_cls] == flat.class_pressure(idx)[big_cls]


def test_fgd_puts_a_share_where_it_fragments_least() -> None:
    idx = CapacityIndex()
    idx.add_node(make_node("a", gpus=1))
    idx.add_node(make_node("b", gpus=1))
    idx.allocate("a", [0], 500, 0, 0)  # a has half a GPU left
    wl = Workload(Counter({TaskType(1, 500, 0, 0, ""): 3, TaskType(1, 1000, 0, 0, ""): 1}))
    p = place(idx, Job("s", gpu_milli=500), Policy("accord", workload=wl))
    assert p is not None and p.tasks[0].node == "a", "fill the half-used GPU, keep b whole"
