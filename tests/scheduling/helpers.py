"""Shared builders and invariant checks for the scheduling tests."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import strategies as st

from accord.services.scheduling.model import WHOLE, Job, Node, Topology
from accord.services.scheduling.selectors import compile_selector
from accord.services.scheduling.state import RUNNING, SchedulerStateMachine
from accord.services.scheduling.topology import domain_of, make_node

NODE_KINDS = [
    dict(vendor="nvidia", model="H100", memory_gib=80, gpus=8, islands=1),
    dict(vendor="nvidia", model="A100", memory_gib=40, gpus=8, islands=2),
    dict(vendor="amd", model="MI300X", memory_gib=192, gpus=8, islands=1),
    dict(vendor="intel", model="Max1550", memory_gib=128, gpus=4, islands=2),
    dict(vendor="nvidia", model="T4", memory_gib=16, gpus=2, islands=2),
]
SELECTORS = [
    "", "vendor == nvidia", "vendor == nvidia && memory >= 80GiB", "model in (MI300X, H100)",
    "vendor != amd", "memory >= 100GiB || model == T4", "!(vendor == intel)",
]
LEVELS = [None, "island", "node", "leaf", "spine"]


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 10) -> list[Node]:
    """A small heterogeneous cluster with a two-level network tree."""
    n = draw(st.integers(2, max_nodes))
    per_leaf = draw(st.integers(1, 4))
    out = []
    for i in range(n):
        kind = NODE_KINDS[draw(st.integers(0, len(NODE_KINDS) - 1))]
        leaf = i // per_leaf
        out.append(make_node(f"n{i}", leaf=f"leaf-{leaf}", spine=f"spine-{leaf // 2}",
                             cpu_milli=64000, memory_mib=512 * 1024, **kind))  # type: ignore[arg-type]
    return out


@st.composite
def jobs(draw: st.DrawFn, prefix: str = "j", count: int = 12) -> list[Job]:
    """A mix of gangs, single tasks, fractional tasks, selectors and topology requests."""
    out = []
    for i in range(draw(st.integers(1, count))):
        frac = draw(st.booleans()) and draw(st.booleans())
        tasks = 1 if frac else draw(st.integers(1, 4))
        dpt = 1 if frac else draw(st.sampled_from([1, 2, 4, 8]))
        level = draw(st.sampled_from(LEVELS))
        out.append(Job(
            id=f"{prefix}{i}", tenant=draw(st.sampled_from(["a", "b"])),
            priority=draw(st.integers(0, 2)), tasks=tasks, devices_per_task=dpt,
            gpu_milli=draw(st.sampled_from([250, 500, 700])) if frac else WHOLE,
            cpu_milli=draw(st.sampled_from([0, 4000, 16000])), selector=draw(st.sampled_from(SELECTORS)),
            topology=Topology(level, draw(st.booleans()) if level else False),
            estimated_runtime=float(draw(st.integers(1, 50))), preemptible=draw(st.booleans()),
            submit_time=float(i),
        ))
    return out


def check_invariants(sm: SchedulerStateMachine) -> None:
    """No device over-allocated; gangs whole; selectors and required topology honoured; index exact."""
    used: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    for jid, rec in sm.jobs.items():
        if rec.status != RUNNING:
            assert rec.placement is None, f"{jid} is {rec.status} but holds a placement"
            assert jid not in sm.running
            continue
        assert jid in sm.running and jid not in sm.pending
        p = rec.placement
        job = rec.job
        assert p is not None and len(p.tasks) == job.tasks, f"{jid}: partial gang"
        pred = compile_selector(job.selector)
        nodes = []
        for t in p.tasks:
            node = sm.nodes[t.node].node
            nodes.append(node)
            assert len(t.devices) == job.devices_per_task
            assert len(set(t.devices)) == len(t.devices)
            by_index = {d.index: d for d in node.devices}
            for i in t.devices:
                assert pred(by_index[i].attrs()), f"{jid}: selector {job.selector!r} violated"
                used[(t.node, i)] += job.gpu_milli
            cpu[t.node] += job.cpu_milli
        if job.topology.required and job.topology.level:
            assert len({domain_of(n, job.topology.level) for n in nodes}) == 1, f"{jid}: topology"
            if job.topology.level == "island":
                by_index = {d.index: d for d in nodes[0].devices}
                assert len({by_index[i].island for t in p.tasks for i in t.devices}) == 1
    for (node_name, i), milli in used.items():
        assert milli <= WHOLE, f"device {node_name}/{i} allocated {milli}/1000"
    for name, nc in sm.index.nodes.items():
        for pos, d in enumerate(nc.node.devices):
            expect = 0 if not nc.healthy[pos] else WHOLE - used.get((name, d.index), 0)
            assert nc.free[pos] == expect, f"index free for {name}/{d.index} drifted"
        assert nc.free_cpu == nc.node.cpu_milli - cpu.get(name, 0)
    for jid in sm.pending:
        assert sm.jobs[jid].status == "pending"


def register_all(sm: SchedulerStateMachine, nodes: list[Node]) -> None:
    """Register every node with fresh command ids."""
    for n in nodes:
        out = sm.apply({"id": f"reg-{n.name}", "op": "register_node", "node": n.to_wire(), "now": 0.0})
        assert out["ok"], out


def counter() -> Any:
    """A fresh command-id generator."""
    state = {"n": 0}

    def nxt(prefix: str = "c") -> str:
        state["n"] += 1
        return f"{prefix}-{state['n']}"

    return nxt
