"""A deterministic simulator for the membership protocol: many members, one process, one seed.

It drives the same ``SwimProtocol`` as the real node over a simulated network and
clock: a heap of timestamped events (packet deliveries, push-pull exchanges, timer
wake-ups), per-packet loss and latency drawn from a seeded RNG, partitions, crashes,
pauses (SIGSTOP-like: nothing runs, packets queue) and *slow* members, which process
every packet and push-pull late (by a lag that changes from episode to episode) while
their own timers still fire on time: the CPU-starved member of the Lifeguard paper,
whose acks arrive "too late" by its own clock.

Packets travel, by default, as the protocol's decoded messages together with the exact
size of their encoding (``SwimProtocol.use_decoded_packets``): every update is still
encoded once, so byte counts and the UDP size bound are exact, but thousands of members
do not spend their time in msgpack. ``wire=True`` (and any encrypted configuration)
sends the real bytes instead; both modes give the same history for the same seed
(``tests/membership/test_simulator.py`` checks it). Everything is driven by one
``random.Random(seed)``: a run is reproduced exactly by its seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .config import SwimConfig
from .protocol import SwimProtocol
from .state import Address, Member, MemberEvent, MemberState

__all__ = ["SimNode", "Simulator", "views_of"]

_DELIVER, _WAKE, _SYNC_REQ, _SYNC_REPLY, _DELIVER_DECODED = range(5)
_INF = float("inf")

EventHook = Callable[[float, int, MemberEvent], None]
DeclareHook = Callable[[float, int, str], None]


@dataclass(slots=True)
class SimNode:
    """One simulated member: its protocol instance and how badly it is doing."""

    idx: int
    name: str
    addr: Address
    proto: SwimProtocol
    crashed: bool = False
    paused_until: float = 0.0
    slow: bool = False
    lag: float = 0.0
    episode_end: float = 0.0
    last_process: float = 0.0
    wake_at: float = _INF
    group: int = 0


@dataclass(slots=True)
class _Traffic:
    tcp_bytes: int = 0
    syncs: int = 0
    dropped: int = 0
    delivered: int = 0


class Simulator:
    """``n`` members over a simulated network; advance it with ``run_until``."""

    def __init__(
        self,
        config: SwimConfig,
        n: int,
        *,
        seed: int = 0,
        loss: float = 0.0,
        latency: tuple[float, float] = (0.0005, 0.002),
        slow_fraction: float = 0.0,
        slow_lag: tuple[float, float] = (1.0, 10.0),
        slow_episode: tuple[float, float] = (10.0, 60.0),
        slow_duty: float = 1.0,
        converged: bool = True,
        seeds: int = 1,
        on_event: EventHook | None = None,
        on_declare_dead: DeclareHook | None = None,
        wire: bool = False,
    ) -> None:
        if n < 1:
            raise ValueError(f"need at least one member, got n={n}")
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        if not 0.0 <= slow_fraction <= 1.0:
            raise ValueError(f"slow_fraction must be in [0, 1], got {slow_fraction}")
        if latency[0] < 0 or latency[1] < latency[0]:
            raise ValueError(f"latency must be a range (lo, hi) with 0 <= lo <= hi, got {latency}")
        self.config = config
        self.rng = random.Random(seed)
        self.now = 0.0
        self.loss = loss
        self.latency = latency
        self.slow_lag = slow_lag
        self.slow_episode = slow_episode
        self.slow_duty = slow_duty
        self.on_event = on_event
        self.on_declare_dead = on_declare_dead
        # Decoded packets unless asked for bytes, or encryption needs them.
        self.wire = wire or bool(config.secret_keys)
        self.traffic = _Traffic()
        self._heap: list[tuple[float, int, int, int, object, object]] = []
        self._seq = 0
        self._partitioned = False
        self.nodes: list[SimNode] = []
        self._by_addr: dict[Address, int] = {}
        self._by_name: dict[str, int] = {}
        seed_addrs = [self._addr(i) for i in range(min(seeds, n))]
        for i in range(n):
            self.nodes.append(self._make_node(i, seed_addrs if not converged else []))
        slow_count = round(slow_fraction * n)
        for i in self.rng.sample(range(n), slow_count):
            self.nodes[i].slow = True
        if converged:
            self._install_converged()
            for node in self.nodes:
                node.proto.start(0.0)
                self._after(node)
        else:
            for node in self.nodes:
                # Staggered starts: everyone joins through the seeds within a second.
                start = 0.0 if node.idx < len(seed_addrs) else self.rng.uniform(0.0, 1.0)
                self._push(start, _WAKE, node.idx, "start", None)
                node.wake_at = start

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _addr(i: int) -> Address:
        return (f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}", 7946)

    def _make_node(self, i: int, seeds: Sequence[Address], incarnation_hint: int = 0) -> SimNode:
        name = f"n{i}"
        addr = self._addr(i)
        proto = SwimProtocol(
            self.config, name, addr, {"role": "sim"}, seeds=seeds,
            rng=random.Random(self.rng.getrandbits(64)),
        )
        if not self.wire:
            proto.use_decoded_packets()
        if self.on_declare_dead is not None:
            hook = self.on_declare_dead
            proto.on_declare_dead = lambda subject, t, _i=i: hook(t, _i, subject)
        self._by_addr[addr] = i
        self._by_name[name] = i
        return SimNode(i, name, addr, proto)

    def _install_converged(self) -> None:
        meta = {"role": "sim"}
        shared = {
            n.name: Member(n.name, n.addr, 0, MemberState.ALIVE, meta, 0.0) for n in self.nodes
        }
        names = list(shared)
        self.rng.shuffle(names)
        for node in self.nodes:
            cut = self.rng.randrange(len(names))
            node.proto.install_members(shared, names[cut:] + names[:cut])

    # ------------------------------------------------------------------ faults
    def crash(self, i: int) -> None:
        """Stop member ``i`` for good, as kill -9 would: no leave, packets to it vanish."""
        self.nodes[i].crashed = True

    def pause(self, i: int, duration: float) -> None:
        """Freeze member ``i`` (SIGSTOP) for ``duration``; packets and timers wait."""
        node = self.nodes[i]
        node.paused_until = max(node.paused_until, self.now + duration)

    def leave(self, i: int) -> None:
        """Member ``i`` announces a graceful leave (it keeps running to gossip it)."""
        node = self.nodes[i]
        node.proto.leave(self.now)
        self._after(node)

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Split the network: members in different groups cannot reach each other."""
        for node in self.nodes:
            node.group = -1
        for g, members in enumerate(groups):
            for i in members:
                self.nodes[i].group = g
        self._partitioned = True

    def heal(self) -> None:
        """Remove every partition."""
        for node in self.nodes:
            node.group = 0
        self._partitioned = False

    def update_meta(self, i: int, meta: dict[str, str]) -> None:
        """Member ``i`` changes its metadata."""
        node = self.nodes[i]
        node.proto.update_meta(meta, self.now)
        self._after(node)

    # ------------------------------------------------------------------ views
    def view(self, observer: int, subject: int) -> MemberState | None:
        """State of ``subject`` in ``observer``'s view (None: unknown or reaped)."""
        m = self.nodes[observer].proto.member(self.nodes[subject].name)
        return m.state if m is not None else None

    def running(self) -> list[SimNode]:
        """Members that have not crashed."""
        return [n for n in self.nodes if not n.crashed]

    # ------------------------------------------------------------------ engine
    def _push(self, t: float, kind: int, idx: int, a: object, b: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, idx, a, b))

    def _reachable(self, src: SimNode, dst: SimNode) -> bool:
        return not self._partitioned or (src.group == dst.group and src.group >= 0)

    def _arrival(self, dst: SimNode, t: float) -> float:
        """When ``dst`` gets to process something that reaches it at ``t`` (slow: later)."""
        if not dst.slow:
            return t
        while t >= dst.episode_end:
            lo, hi = self.slow_episode
            dst.episode_end = max(dst.episode_end, t) + self.rng.uniform(lo, hi)
            slow = self.rng.random() < self.slow_duty
            dst.lag = self.rng.uniform(*self.slow_lag) if slow else 0.0
        at = max(t + dst.lag, dst.last_process)
        dst.last_process = at
        return at

    def _after(self, node: SimNode) -> None:
        """Carry out what ``node``'s protocol asked for, and book its next wake-up."""
        out = node.proto.take_output()
        now = self.now
        lo, hi = self.latency
        span = hi - lo
        rng = self.rng
        random_ = rng.random
        loss = self.loss
        nodes = self.nodes
        by_addr = self._by_addr
        heap = self._heap
        partitioned = self._partitioned
        src_addr = node.addr
        packets: list[tuple[Address, object]]
        if out.decoded:
            packets, kind = out.decoded, _DELIVER_DECODED  # type: ignore[assignment]
        else:
            packets, kind = out.packets, _DELIVER  # type: ignore[assignment]
        for addr, data in packets:
            j = by_addr.get(addr)
            if j is None:
                continue
            dst = nodes[j]
            if dst.crashed or (partitioned and not self._reachable(node, dst)) or random_() < loss:
                self.traffic.dropped += 1
                continue
            t = now + lo + span * random_()
            if dst.slow:
                t = self._arrival(dst, t)
            self._seq += 1
            heapq.heappush(heap, (t, self._seq, kind, j, src_addr, data))
        for addr, join in out.syncs:
            j = self._by_addr.get(addr)
            if j is None:
                continue
            dst = self.nodes[j]
            payload = node.proto.push_pull_payload(join)
            self.traffic.tcp_bytes += len(payload)
            self.traffic.syncs += 1
            if dst.crashed or not self._reachable(node, dst):
                continue
            t = self._arrival(dst, now + 2 * hi)
            self._push(t, _SYNC_REQ, j, node.idx, payload)
        if self.on_event is not None:
            for ev in out.events:
                self.on_event(now, node.idx, ev)
        deadline = node.proto.next_deadline()
        if deadline is not None and deadline < node.wake_at:
            node.wake_at = deadline
            self._push(deadline, _WAKE, node.idx, None, None)

    def run_until(self, t_end: float, stop: Callable[[], bool] | None = None) -> None:
        """Process events up to simulated time ``t_end`` (or until ``stop()`` is true)."""
        heap = self._heap
        nodes = self.nodes
        while heap and heap[0][0] <= t_end:
            t, _, kind, idx, a, b = heapq.heappop(heap)
            node = nodes[idx]
            if node.crashed:
                continue
            if t < node.paused_until:
                if kind == _WAKE and a is None:
                    if t != node.wake_at:
                        continue  # superseded anyway
                    node.wake_at = node.paused_until
                self._push(node.paused_until, kind, idx, a, b)
                continue
            self.now = t
            if kind == _DELIVER_DECODED:
                self.traffic.delivered += 1
                node.proto.handle_decoded(a, b, t)  # type: ignore[arg-type]
            elif kind == _DELIVER:
                self.traffic.delivered += 1
                node.proto.handle_packet(a, b, t)  # type: ignore[arg-type]
            elif kind == _WAKE:
                if a == "start":
                    node.wake_at = _INF
                    node.proto.start(t)
                elif t != node.wake_at:
                    continue  # superseded by an earlier wake-up
                else:
                    node.wake_at = _INF
                    node.proto.tick(t)
            elif kind == _SYNC_REQ:
                src = nodes[a]  # type: ignore[call-overload]
                reply = node.proto.push_pull_payload(False)
                node.proto.merge_push_pull(b, t)  # type: ignore[arg-type]
                self.traffic.tcp_bytes += len(reply)
                if not src.crashed and self._reachable(node, src):
                    self._push(self._arrival(src, t + 2 * self.latency[1]), _SYNC_REPLY, src.idx, None, reply)
            else:
                node.proto.merge_push_pull(b, t)  # type: ignore[arg-type]
            self._after(node)
            if stop is not None and stop():
                return
        self.now = max(self.now, t_end)

    def run_for(self, duration: float, stop: Callable[[], bool] | None = None) -> None:
        """Advance simulated time by ``duration``."""
        self.run_until(self.now + duration, stop)

    def totals(self) -> dict[str, int]:
        """Packets and bytes sent over UDP by all members, and TCP push-pull bytes."""
        packets = sum(n.proto.stats.packets_sent for n in self.nodes)
        udp = sum(n.proto.stats.bytes_sent for n in self.nodes)
        return {
            "packets": packets,
            "udp_bytes": udp,
            "tcp_bytes": self.traffic.tcp_bytes,
            "syncs": self.traffic.syncs,
            "dropped": self.traffic.dropped,
        }


def views_of(sim: Simulator, subject: int) -> dict[MemberState | None, int]:
    """Count the running members (other than ``subject``) by how they see ``subject``."""
    counts: dict[MemberState | None, int] = {}
    for node in sim.running():
        if node.idx == subject:
            continue
        st = sim.view(node.idx, subject)
        counts[st] = counts.get(st, 0) + 1
    return counts
