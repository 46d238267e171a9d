"""The free-capacity index: one capacity model for admission, placement and metrics.

Every device has a free share in thousandths (1000 = idle, 0 = fully taken);
every node has free CPU and memory. The index keeps, incrementally, what the
placement search needs so that a scheduling cycle never scans the whole cluster
per job:

- device *classes* (devices interchangeable for selector matching), so a selector
  is evaluated once per class, not once per device;
- per class, buckets of schedulable nodes by their count of wholly free devices,
  globally and per leaf switch (best fit is "first non-empty bucket >= k");
- per class, wholly free device totals per leaf, spine and block (domain fit);
- nodes grouped by *signature* (hardware type + sorted free shares + free CPU and
  memory): nodes with the same signature score the same, so fragmentation-guided
  search evaluates each signature once. Each signature also gets a number
  (``NodeCap.sid``, ``groups``) so scoring memos key on an int instead of
  hashing a tuple per node state per job.

Mutations (``allocate``/``release``/``set_schedulable``/``set_health``) update all
of these; nothing here decides where a job goes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from accord.services.scheduling.errors import SchedulingError
from accord.services.scheduling.model import WHOLE, Node
from accord.services.scheduling.selectors import compile_selector

Signature = tuple[Any, ...]

_UIDS = itertools.count(1)
SID_LIMIT = 500_000
"""Distinct signatures numbered before the numbering restarts (bounds memory on long runs)."""


@dataclass(slots=True)
class NodeCap:
    """Free capacity of one node."""

    node: Node
    order: int
    """Registration order: the deterministic tie-break and first-fit order."""
    cls: tuple[int, ...]
    """Class id per device position."""
    free: list[int]
    """Free thousandths per device position (0 if unhealthy)."""
    healthy: list[bool]
    free_cpu: int
    free_mem: int
    schedulable: bool
    hw: int
    """Hardware-type id (class layout + CPU + memory), part of the signature."""
    pos_of: dict[int, int]
    sig: Signature = ()
    sid: int = -1
    """Number of ``sig`` in the index (an int is cheap to hash; memos key on it)."""
    whole: dict[int, int] | None = None

    def whole_free(self, cls: int) -> int:
        """Count of idle, healthy devices of class ``cls``."""
        return self.whole.get(cls, 0) if self.whole else 0

    def free_positions(self, cls: int) -> list[int]:
        """Positions of idle devices of class ``cls``."""
        return [p for p, c in enumerate(self.cls) if c == cls and self.free[p] == WHOLE]


class CapacityIndex:
    """Free capacity of the cluster, indexed for fast best-fit search."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeCap] = {}
        self.class_keys: list[tuple[Any, ...]] = []
        self.class_attrs: list[dict[str, Any]] = []
        self._class_id: dict[tuple[Any, ...], int] = {}
        self._hw_id: dict[tuple[Any, ...], int] = {}
        self._sel_cache: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.buckets: dict[int, dict[int, dict[str, None]]] = {}
        self.leaf_buckets: dict[tuple[int, str], dict[int, dict[str, None]]] = {}
        self.domain_free: dict[tuple[int, str, str], int] = {}
        """(class, level, domain) -> idle devices on schedulable nodes."""
        self.domains: dict[tuple[str, str], dict[str, None]] = {}
        """(level, domain) -> member leaves (for spine/block) or nodes (for leaf)."""
        self.class_free: dict[int, int] = {}
        self.sigs: dict[Signature, dict[str, None]] = {}
        self.groups: dict[int, dict[str, None]] = {}
        """The same groups as ``sigs``, keyed by signature number."""
        self.sig_of: list[Signature] = []
        """Signature by number."""
        self._sid: dict[Signature, int] = {}
        self.uid = next(_UIDS)
        """Identifies this index and its signature numbering for caches kept outside it."""
        self._order = 0
        self.version = 0
        """Bumped on every change; a failed search stays failed while only allocations happen."""
        self.releases = 0
        """Bumped when capacity grows (release, new node, undrain)."""
        self.topology_changes = 0
        """Bumped when a node or device leaves service (drain, death, failure, removal)."""
        self.total_devices = 0
        """Healthy devices on all known nodes."""
        self.total_cpu = 0

    # ----- classes and selectors -------------------------------------------------

    def _class(self, key: tuple[Any, ...], attrs: dict[str, Any]) -> int:
        cid = self._class_id.get(key)
        if cid is None:
            cid = len(self.class_keys)
            self._class_id[key] = cid
            self.class_keys.append(key)
            self.class_attrs.append(attrs)
        return cid

    def matching_classes(self, selector: str) -> tuple[int, ...]:
        """Device classes satisfying ``selector`` (cached until a new class appears)."""
        hit = self._sel_cache.get(selector)
        if hit is not None and hit[0] == len(self.class_keys):
            return hit[1]
        pred = compile_selector(selector)
        out = tuple(i for i, a in enumerate(self.class_attrs) if pred(a))
        self._sel_cache[selector] = (len(self.class_keys), out)
        return out

    # ----- nodes ----------------------------------------------------------------

    def add_node(self, node: Node, schedulable: bool = True) -> NodeCap:
        """Add a node with all its capacity free (replaces an idle node of that name)."""
        old = self.nodes.get(node.name)
        if old is not None:
            if self.is_busy(node.name):
                raise SchedulingError(f"node {node.name}: cannot replace a node with allocations")
            self.remove_node(node.name)
        cls = tuple(self._class(d.class_key(), d.attrs()) for d in node.devices)
        hw_key = (cls, node.cpu_milli, node.memory_mib)
        hw = self._hw_id.setdefault(hw_key, len(self._hw_id))
        nc = NodeCap(
            node=node, order=self._order, cls=cls, free=[WHOLE] * len(cls),
            healthy=[True] * len(cls), free_cpu=node.cpu_milli, free_mem=node.memory_mib,
            schedulable=schedulable, hw=hw, pos_of={d.index: p for p, d in enumerate(node.devices)},
        )
        self._order += 1
        self.nodes[node.name] = nc
        self.total_devices += len(cls)
        self.total_cpu += node.cpu_milli
        self.domains.setdefault(("leaf", node.leaf), {})[node.name] = None
        self.domains.setdefault(("spine", node.spine), {})[node.leaf] = None
        self.domains.setdefault(("block", node.block), {})[node.spine] = None
        self._index(nc)
        self.releases += 1
        return nc

    def remove_node(self, name: str) -> None:
        """Forget a node (its allocations must have been released by the caller)."""
        nc = self.nodes.pop(name, None)
        if nc is None:
            return
        self.topology_changes += 1
        self._unindex(nc)
        self.domains.get(("leaf", nc.node.leaf), {}).pop(name, None)
        self.total_devices -= sum(nc.healthy)
        self.total_cpu -= nc.node.cpu_milli

    def is_busy(self, name: str) -> bool:
        """Whether anything is allocated on the node."""
        nc = self.nodes[name]
        return (nc.free_cpu != nc.node.cpu_milli or nc.free_mem != nc.node.memory_mib
                or any(f != WHOLE for f, h in zip(nc.free, nc.healthy, strict=True) if h))

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        """Drain (False) or undrain (True): a drained node takes no new work."""
        nc = self.nodes[name]
        if nc.schedulable == schedulable:
            return
        self._unindex(nc)
        nc.schedulable = schedulable
        self._index(nc)
        if schedulable:
            self.releases += 1
        else:
            self.topology_changes += 1

    def set_health(self, name: str, index: int, healthy: bool, used_milli: int = 0) -> None:
        """Mark a device (by its index) healthy or not; an unhealthy device is never free."""
        nc = self.nodes[name]
        p = nc.pos_of[index]
        if nc.healthy[p] == healthy:
            return
        self._unindex(nc)
        self.total_devices += 1 if healthy else -1
        nc.healthy[p] = healthy
        nc.free[p] = WHOLE - used_milli if healthy else 0
        self._index(nc)
        if healthy:
            self.releases += 1
        else:
            self.topology_changes += 1

    # ----- allocation -----------------------------------------------------------

    def can_take(self, name: str, indices: Sequence[int], milli: int, cpu: int, mem: int) -> str | None:
        """Why ``indices`` (device indices) cannot be taken on ``name``, or None if they can."""
        nc = self.nodes.get(name)
        if nc is None:
            return f"node {name} is unknown"
        if nc.free_cpu < cpu or nc.free_mem < mem:
            return f"node {name} lacks cpu or memory"
        if len(set(indices)) != len(indices):
            return f"node {name}: a device is listed twice"
        for i in indices:
            p = nc.pos_of.get(i)
            if p is None:
                return f"node {name} has no device {i}"
            if not nc.healthy[p] or nc.free[p] < milli:
                return f"node {name} device {i} is not free"
        return None

    def allocate(self, name: str, indices: Sequence[int], milli: int, cpu: int, mem: int) -> None:
        """Take capacity; raises ``SchedulingError`` (changing nothing) if it is not free."""
        why = self.can_take(name, indices, milli, cpu, mem)
        if why is not None:
            raise SchedulingError(why)
        nc = self.nodes[name]
        self._unindex(nc)
        for i in indices:
            nc.free[nc.pos_of[i]] -= milli
        nc.free_cpu -= cpu
        nc.free_mem -= mem
        self._index(nc)

    def release(self, name: str, indices: Sequence[int], milli: int, cpu: int, mem: int) -> None:
        """Give capacity back (devices that went unhealthy stay at 0)."""
        nc = self.nodes.get(name)
        if nc is None:
            return
        self._unindex(nc)
        for i in indices:
            p = nc.pos_of[i]
            if nc.healthy[p]:
                nc.free[p] = min(WHOLE, nc.free[p] + milli)
        nc.free_cpu = min(nc.node.cpu_milli, nc.free_cpu + cpu)
        nc.free_mem = min(nc.node.memory_mib, nc.free_mem + mem)
        self._index(nc)
        self.releases += 1

    # ----- queries --------------------------------------------------------------

    def nodes_in(self, level: str, domain: str) -> Iterator[NodeCap]:
        """Schedulable and unschedulable nodes of a network domain."""
        if level in ("node", "island"):
            nc = self.nodes.get(domain)
            if nc is not None:
                yield nc
            return
        if level == "leaf":
            for n in self.domains.get(("leaf", domain), {}):
                yield self.nodes[n]
            return
        if level == "spine":
            for leaf in self.domains.get(("spine", domain), {}):
                yield from self.nodes_in("leaf", leaf)
            return
        if level == "block":
            for spine in self.domains.get(("block", domain), {}):
                yield from self.nodes_in("spine", spine)
            return
        yield from self.nodes.values()

    def leaves_of(self, level: str, domain: str) -> list[str]:
        """Leaf switches under a domain (``None`` level = the whole cluster)."""
        if level == "leaf":
            return [domain]
        if level == "spine":
            return list(self.domains.get(("spine", domain), {}))
        if level == "block":
            out: list[str] = []
            for s in self.domains.get(("block", domain), {}):
                out.extend(self.domains.get(("spine", s), {}))
            return out
        return [d for (lv, d) in self.domains if lv == "leaf"]

    def totals(self) -> tuple[int, int]:
        """(healthy devices, free thousandths on schedulable healthy devices)."""
        total = 0
        free = 0
        for nc in self.nodes.values():
            for f, h in zip(nc.free, nc.healthy, strict=True):
                if h:
                    total += 1
                    if nc.schedulable:
                        free += f
        return total, free

    # ----- internal index upkeep -----------------------------------------------

    def _unindex(self, nc: NodeCap) -> None:
        self.version += 1
        if not nc.schedulable or nc.whole is None:
            return
        name = nc.node.name
        group = self.sigs.get(nc.sig)
        if group is not None:
            group.pop(name, None)
            if not group:
                del self.sigs[nc.sig]
                self.groups.pop(nc.sid, None)
        for c, k in nc.whole.items():
            self.buckets[c][k].pop(name, None)
            self.leaf_buckets[(c, nc.node.leaf)][k].pop(name, None)
            self.class_free[c] -= k
            for lv, dom in (("leaf", nc.node.leaf), ("spine", nc.node.spine), ("block", nc.node.block)):
                self.domain_free[(c, lv, dom)] -= k
        nc.whole = None

    def _number(self, sig: Signature) -> int:
        """A fresh number for ``sig``; restarts the numbering (new ``uid``) past ``SID_LIMIT``."""
        if len(self.sig_of) >= SID_LIMIT:
            self.uid = next(_UIDS)
            self._sid = {}
            self.sig_of = []
            old = self.groups
            self.groups = {}
            for s, grp in self.sigs.items():
                if grp:
                    n = len(self.sig_of)
                    self._sid[s] = n
                    self.sig_of.append(s)
                    self.groups[n] = grp
                    for nm in grp:
                        self.nodes[nm].sid = n
            del old
        sid = len(self.sig_of)
        self._sid[sig] = sid
        self.sig_of.append(sig)
        return sid

    def _index(self, nc: NodeCap) -> None:
        self.version += 1
        whole: dict[int, int] = {}
        for c in nc.cls:
            whole.setdefault(c, 0)
        for p, c in enumerate(nc.cls):
            if nc.healthy[p] and nc.free[p] == WHOLE:
                whole[c] += 1
        nc.sig = (nc.hw, tuple(sorted(zip(nc.cls, nc.free, strict=True))), nc.free_cpu, nc.free_mem)
        if not nc.schedulable:
            nc.whole = whole
            return
        nc.whole = whole
        name = nc.node.name
        group = self.sigs.get(nc.sig)
        if group is None:
            group = self.sigs[nc.sig] = {}
            sid = self._sid.get(nc.sig)
            if sid is None:
                sid = self._number(nc.sig)
            self.groups[sid] = group
            nc.sid = sid
        else:
            nc.sid = self._sid[nc.sig]
        group[name] = None
        for c, k in whole.items():
            self.buckets.setdefault(c, {}).setdefault(k, {})[name] = None
            self.leaf_buckets.setdefault((c, nc.node.leaf), {}).setdefault(k, {})[name] = None
            self.class_free[c] = self.class_free.get(c, 0) + k
            for lv, dom in (("leaf", nc.node.leaf), ("spine", nc.node.spine), ("block", nc.node.block)):
                key = (c, lv, dom)
                self.domain_free[key] = self.domain_free.get(key, 0) + k
