"""The SWIM + Lifeguard protocol as a pure state machine: no sockets, no clock, no tasks.

A driver feeds it packets (``handle_packet(src, data, now)``), push-pull frames and the
passage of time (``tick(now)``, due at ``next_deadline()``), and drains what it wants
done (``take_output()``): UDP packets to send, TCP push-pull exchanges to start, and
membership events. The asyncio node (``node.py``) and the deterministic simulator
(``simulator.py``) are two such drivers of this one codebase.

Reading order, as the protocol runs:

1. **Probe** (``_probe_round``): every probe interval (stretched by the local health
   multiplier) ping the next member of a shuffled round-robin list. If no ack comes
   within the probe timeout, ask ``indirect_checks`` random members to ping it for us
   (ping-req; with Lifeguard they answer "nack" if the target stays silent).
2. **Suspect** (``_suspect``): a probe that ends without an ack makes the target suspect.
   The suspicion spreads by gossip; the suspected member refutes by raising its
   incarnation. The timer shrinks as independent members confirm the suspicion.
3. **Dead** (``_dead``): a suspicion that times out makes the member dead; a member that
   leaves declares itself dead (state "left"). Dead members are kept for
   ``gossip_to_dead_time`` and then reaped.
4. **Disseminate**: every update is queued once and piggybacked on outgoing packets,
   newest first, until it has been sent ``retransmit_mult * ceil(log10(n+1))`` times.
5. **Anti-entropy**: a periodic TCP push-pull of the full state with a random member,
   and re-join attempts toward seeds and lost members after failures (so two sides of a
   long partition find each other again).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Mapping

from .awareness import LocalHealth
from .broadcast import TransmitQueue, Update
from .config import SwimConfig
from .crypto import SEAL_OVERHEAD, AuthError, Keyring
from .probes import DecodedPacket, Forward, Output, Probe, sample_members
from .state import Address, EventKind, Member, MemberEvent, MemberState, validate_meta
from .stats import ProtocolStats
from .suspicion import Suspicion
from .wire import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    Message,
    Nack,
    Ping,
    PushPullState,
    Suspect,
    WireError,
    array_header,
    build_packet,
    decode_packet,
    decode_push_pull,
    encode_message,
    encode_push_pull,
    wrap_update,
)

__all__ = ["Output", "SwimProtocol"]

_ALIVE, _SUSPECT, _DEAD, _LEFT = (
    MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT,
)
# Timer kinds.
_T_PROBE, _T_PROBE_TIMEOUT, _T_SUSPICION, _T_NACK, _T_FORWARD_END = range(5)
_T_GOSSIP, _T_PUSH_PULL, _T_REAP, _T_REJOIN = range(5, 9)
# The event a change of state publishes, indexed by the new state.
_STATE_EVENT = (EventKind.ALIVE, EventKind.SUSPECT, EventKind.DEAD, EventKind.LEFT)
_PACKET_SLACK = 4  # array header and version byte of a compound packet
_VERSION_LEN = len(build_packet(None, [])) - len(array_header(2)) - 1  # the version's bytes


class SwimProtocol:
    """One member's view of the group and the SWIM + Lifeguard rules that update it."""

    def __init__(
        self,
        config: SwimConfig,
        name: str,
        addr: Address,
        meta: Mapping[str, str] | None = None,
        *,
        seeds: Iterable[Address] = (),
        rng: random.Random | None = None,
    ) -> None:
        if not name:
            raise ValueError("member name must be non-empty")
        self.config = config
        self.name = name
        self.addr = addr
        self.stats = ProtocolStats()
        self._meta = validate_meta(meta or {})
        self._rng = rng or random.Random()
        self._seeds = [s for s in seeds if s != addr]
        self._keyring = Keyring(config.secret_keys) if config.secret_keys else None
        self._members: dict[str, Member] = {}
        self._live = 0
        self._queue = TransmitQueue()
        self._health = LocalHealth(config.awareness_max_multiplier, config.lifeguard_local_health)
        self._suspicions: dict[str, Suspicion] = {}
        self._timers: list[tuple[float, int, int, object]] = []
        self._timer_seq = 0
        self._seq = self._rng.randrange(1 << 20)
        self._probe: Probe | None = None
        self._forwards: dict[int, Forward] = {}
        self._order: list[str] = []
        self._order_index = 0
        self._lost: dict[str, tuple[Address, float]] = {}
        self._gossip_armed = False
        self._leaving = False
        self._started = False
        self._packets: list[tuple[Address, bytes]] = []
        self._decoded: list[tuple[Address, DecodedPacket]] = []
        # In-process drivers (the simulator) may ask for packets as decoded messages
        # plus their exact encoded size instead of bytes: see ``use_decoded_packets``.
        self._decoded_mode = False
        self._limit_for: tuple[int, int] = (-1, 0)  # (live count, retransmit limit)
        self._timeout_for: tuple[int, float] = (-1, 0.0)  # (live count, suspicion timeout)
        self._syncs: list[tuple[Address, bool]] = []
        self._events: list[MemberEvent] = []
        self._now = 0.0
        # Optional hook(name, now) called when one of our suspicions times out (simulators).
        self.on_declare_dead: Callable[[str, float], None] | None = None

    # ----------------------------------------------------------------- public surface
    @property
    def local_member(self) -> Member:
        """This member's own record."""
        return self._members[self.name]

    @property
    def health_score(self) -> int:
        """Lifeguard local health score (0 = healthy)."""
        return self._health.score

    @property
    def live_count(self) -> int:
        """Members alive or suspect, this one included."""
        return self._live

    def members(self) -> list[Member]:
        """Every member known, whatever its state (dead ones until reaped)."""
        return list(self._members.values())

    def member(self, name: str) -> Member | None:
        """The record of ``name``, if known."""
        return self._members.get(name)

    def start(self, now: float, *, incarnation: int = 0) -> None:
        """Announce ourselves, ask the seeds for their state, start the timers."""
        if self._started:
            raise RuntimeError("protocol already started")
        self._started = True
        self._now = now
        if self.name not in self._members:  # else installed by a simulator, already known
            self._set_local(incarnation, now)
        cfg = self.config
        self._at(now + self._rng.uniform(0, cfg.probe_interval), _T_PROBE, None)
        if cfg.push_pull_interval > 0:
            # Staggered over a whole (size-scaled) period, so a group started together
            # does not exchange full state all at once.
            period = cfg.push_pull_period(self._live)
            self._at(now + self._rng.uniform(0.1, 1.0) * period, _T_PUSH_PULL, None)
        if cfg.rejoin_interval > 0:
            self._at(now + cfg.rejoin_interval, _T_REJOIN, None)
        for seed in self._seeds:
            self._syncs.append((seed, True))

    def install_members(self, members: Mapping[str, Member], order: list[str]) -> None:
        """Adopt an already converged view (simulators bootstrapping thousands of members)."""
        self._members = dict(members)
        self._members.setdefault(self.name, members[self.name])
        self._live = sum(1 for m in self._members.values() if m.is_live)
        self._order = [n for n in order if n != self.name]

    def update_meta(self, meta: Mapping[str, str], now: float) -> None:
        """Replace our metadata and disseminate it (under a new incarnation)."""
        self._meta = validate_meta(meta)
        self._now = now
        self._set_local(self.local_member.incarnation + 1, now)

    def leave(self, now: float) -> None:
        """Announce a graceful leave; keep gossiping it until the driver stops us."""
        if self._leaving:
            return
        self._leaving = True
        self._now = now
        self._dead(self.local_member.incarnation, self.name, self.name, now)
        self._gossip(now)

    @property
    def leave_gossiped(self) -> bool:
        """Whether the leave announced by :meth:`leave` has ridden as many packets as
        gossip gives an update (``retransmit_limit``): waiting longer carries it no
        further (memberlist's ``Leave`` waits for the same)."""
        return self._leaving and self._queue.pending(self.name) is None

    def use_decoded_packets(self, enabled: bool = True) -> None:
        """Emit packets as ``DecodedPacket`` (in ``Output.decoded``) instead of bytes.

        For in-process drivers only: the receiver gets the sender's message objects
        through ``handle_decoded`` and skips msgpack entirely, while every update and
        message is still encoded once, so packet sizes (the UDP budget, byte counts)
        are exactly those of the wire. Refused with encryption, whose sealing needs the
        real bytes.
        """
        if enabled and self._keyring is not None:
            raise ValueError("decoded packets cannot be used with encryption (secret_keys set)")
        self._decoded_mode = enabled

    def take_output(self) -> Output:
        """Hand over (and forget) what the driver must send, start and publish."""
        out = Output(self._packets, self._syncs, self._events, self._decoded)
        self._packets, self._syncs, self._events = [], [], []
        if self._decoded:
            self._decoded = []
        return out

    def next_deadline(self) -> float | None:
        """When ``tick`` should next be called (None: nothing scheduled)."""
        return self._timers[0][0] if self._timers else None

    def tick(self, now: float) -> None:
        """Run every timer due at ``now``."""
        self._now = now
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, key = heapq.heappop(timers)
            self._fire(kind, key, now)

    # ------------------------------------------------------------------ UDP input
    def handle_packet(self, src: Address, data: bytes, now: float) -> None:
        """Process one UDP packet from ``src``; bad or unauthenticated ones are counted and dropped."""
        self._now = now
        self.stats.packets_received += 1
        self.stats.bytes_received += len(data)
        if self._keyring is not None:
            try:
                data = self._keyring.open(data)
            except AuthError:
                self.stats.auth_failures += 1
                return
        try:
            main, updates = decode_packet(data)
        except WireError:
            self.stats.decode_errors += 1
            return
        # Updates first: a ping that carries news about its target is answered knowing it.
        for upd in updates:
            kind = type(upd)
            if kind is Suspect:
                self._suspect(upd.incarnation, upd.name, upd.origin, now)  # type: ignore[union-attr]
            elif kind is Alive:
                self._alive(upd, now)  # type: ignore[arg-type]
            else:
                self._dead(upd.incarnation, upd.name, upd.origin, now)  # type: ignore[union-attr]
        if main is not None:
            self._dispatch(src, main, now)

    def handle_decoded(self, src: Address, packet: DecodedPacket, now: float) -> None:
        """Process a packet handed over decoded by an in-process driver (see ``use_decoded_packets``).

        Same effect as ``handle_packet`` on the packet's bytes. Updates that are old news
        (the common case: each update reaches a member many times) are filtered here with
        the very tests ``_alive``, ``_suspect`` and ``_dead`` start with; the others go
        through those methods, which re-queue the received ``Update``'s encoding as is.
        """
        self._now = now
        stats = self.stats
        stats.packets_received += 1
        stats.bytes_received += packet.size
        members = self._members
        suspicions = self._suspicions
        me = self.name
        for upd in packet.updates:
            msg: Alive | Suspect | Dead = upd.msg  # type: ignore[assignment]
            old = members.get(msg.name)
            if type(msg) is Alive:
                if old is not None and msg.incarnation <= old.incarnation and msg.name != me:
                    continue
                self._alive(msg, now, upd)
            elif old is None or msg.incarnation < old.incarnation or old.state >= _DEAD:
                continue
            elif type(msg) is Suspect:
                if old.state == _SUSPECT and msg.name != me:
                    # A confirmation (or repeat) of a suspicion we hold: _suspect's branch.
                    susp = suspicions.get(msg.name)
                    if susp is not None and susp.confirm(msg.origin):
                        self._at(susp.deadline(), _T_SUSPICION, msg.name)
                        self._requeue(msg.name, upd)
                    continue
                self._suspect(msg.incarnation, msg.name, msg.origin, now, upd)
            else:
                self._dead(msg.incarnation, msg.name, msg.origin, now, upd)  # type: ignore[union-attr]
        if packet.main is not None:
            self._dispatch(src, packet.main, now)

    def _dispatch(self, src: Address, msg: object, now: float) -> None:
        if isinstance(msg, Ping):
            self._on_ping(src, msg)
        elif isinstance(msg, Ack):
            self._on_ack(msg.seq)
        elif isinstance(msg, IndirectPing):
            self._on_indirect_ping(src, msg, now)
        elif isinstance(msg, Nack):
            probe = self._probe
            if probe is not None and probe.seq == msg.seq:
                probe.nacks += 1

    def _on_ping(self, src: Address, ping: Ping) -> None:
        if ping.target and ping.target != self.name:
            self.stats.misdirected += 1
            return
        priority = []
        sender = self._members.get(ping.source)
        if sender is not None and sender.state in (_SUSPECT, _DEAD) and self.config.lifeguard_buddy:
            # A member we consider suspect or dead is talking to us: tell it, so it refutes.
            priority.append(self._state_message(sender))
        self._send(src, Ack(ping.seq), priority)

    def _on_ack(self, seq: int) -> None:
        probe = self._probe
        if probe is not None and probe.seq == seq:
            probe.acked = True
            return
        fwd = self._forwards.get(seq)
        if fwd is not None and not fwd.done:
            fwd.done = True
            self._send(fwd.requester, Ack(fwd.requester_seq))

    def _on_indirect_ping(self, src: Address, req: IndirectPing, now: float) -> None:
        seq = self._next_seq()
        self._forwards[seq] = Forward(req.seq, src, req.want_nack)
        self._send(req.target_addr, Ping(seq, req.target, self.name, self.addr))
        if req.want_nack:
            self._at(now + 0.8 * self.config.probe_timeout, _T_NACK, seq)
        self._at(now + self.config.probe_interval, _T_FORWARD_END, seq)

    # ------------------------------------------------------------------ probing
    def _probe_round(self, now: float) -> None:
        cfg = self.config
        self._finish_probe()
        if self._leaving:
            return
        self._at(now + self._health.scale(cfg.probe_interval), _T_PROBE, None)
        target = self._next_probe_target()
        if target is None:
            return
        seq = self._next_seq()
        self._probe = Probe(seq, target.name, target.incarnation)
        self.stats.probes += 1
        priority = []
        if target.state == _SUSPECT and cfg.lifeguard_buddy:
            priority.append(self._state_message(target))
        self._send(target.addr, Ping(seq, target.name, self.name, self.addr), priority)
        self._at(now + self._health.scale(cfg.probe_timeout), _T_PROBE_TIMEOUT, seq)

    def _probe_timeout(self, seq: int) -> None:
        probe = self._probe
        if probe is None or probe.seq != seq or probe.acked:
            return
        target = self._members.get(probe.target)
        if target is None:
            return
        helpers = self._random_live(self.config.indirect_checks, exclude=probe.target)
        want_nack = self.config.lifeguard_nack
        req = IndirectPing(seq, target.name, target.addr, self.name, self.addr, want_nack)
        for helper in helpers:
            self._send(helper.addr, req)
        self.stats.indirect_probes += len(helpers)
        probe.expected_nacks = len(helpers) if want_nack else 0

    def _finish_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is None:
            return
        if probe.acked:
            self._health.apply(-1)
            return
        # No ack at all. Missing nacks mean *we* are the one not hearing (Lifeguard).
        missed = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
        self._health.apply(missed)
        self.stats.probe_failures += 1
        target = self._members.get(probe.target)
        if target is not None and target.incarnation == probe.incarnation:
            self._suspect(probe.incarnation, probe.target, self.name, self._now)

    def _next_probe_target(self) -> Member | None:
        for _ in range(len(self._order) + 1):
            if self._order_index >= len(self._order):
                self._order = [n for n, m in self._members.items() if m.is_live and n != self.name]
                self._rng.shuffle(self._order)
                self._order_index = 0
                if not self._order:
                    return None
            name = self._order[self._order_index]
            self._order_index += 1
            m = self._members.get(name)
            if m is not None and m.is_live and name != self.name:
                return m
        return None

    # ------------------------------------------------------------- state changes
    def _alive(self, msg: Alive, now: float, src: Update | None = None) -> None:
        name = msg.name
        old = self._members.get(name)
        if old is not None and msg.incarnation <= old.incarnation and name != self.name:
            return  # the common case: old news
        if name == self.name:
            # Someone speaks for us: outbid anything newer than, or different from, the truth.
            if old is not None and (
                msg.incarnation > old.incarnation
                or (msg.incarnation == old.incarnation and (msg.meta != old.meta or msg.addr != old.addr))
            ):
                self._refute(msg.incarnation, now)
            return
        if old is not None and msg.incarnation <= old.incarnation:
            return
        since = old.state_since if old is not None and old.state == _ALIVE else now
        self._set(Member(name, msg.addr, msg.incarnation, _ALIVE, msg.meta, since), old, now)
        self._suspicions.pop(name, None)
        self._lost.pop(name, None)
        if src is not None:
            self._requeue(name, src)
        else:
            self._broadcast(name, msg)

    def _suspect(
        self, incarnation: int, name: str, origin: str, now: float, src: Update | None = None
    ) -> None:
        old = self._members.get(name)
        if old is None or incarnation < old.incarnation or old.state >= _DEAD:
            return
        if name == self.name:
            self._refute(incarnation, now)
            return
        if old.state == _SUSPECT:
            susp = self._suspicions.get(name)
            if susp is not None and susp.confirm(origin):
                self._at(susp.deadline(), _T_SUSPICION, name)
                if src is not None:
                    self._requeue(name, src)
                else:
                    self._broadcast(name, Suspect(incarnation, name, origin))
            return
        cfg = self.config
        self._set(Member(name, old.addr, incarnation, _SUSPECT, old.meta, now), old, now)
        self.stats.suspicions += 1
        n = self._live
        k = cfg.suspicion_mult - 2 if cfg.lifeguard_dynamic_suspicion else 0
        if n - 2 < k:
            k = 0
        cached_n, base = self._timeout_for
        if cached_n != n:
            base = cfg.suspicion_timeout(n)
            self._timeout_for = (n, base)
        top = base * cfg.suspicion_max_timeout_mult if cfg.lifeguard_dynamic_suspicion else base
        susp = Suspicion(origin, incarnation, now, k, base, top)
        self._suspicions[name] = susp
        self._at(susp.deadline(), _T_SUSPICION, name)
        if src is not None:
            self._requeue(name, src)
        else:
            self._broadcast(name, Suspect(incarnation, name, origin))

    def _dead(
        self, incarnation: int, name: str, origin: str, now: float, src: Update | None = None
    ) -> None:
        old = self._members.get(name)
        if old is None or incarnation < old.incarnation or old.state >= _DEAD:
            return
        if name == self.name and not self._leaving:
            self._refute(incarnation, now)
            return
        state = _LEFT if origin == name else _DEAD
        self._set(Member(name, old.addr, incarnation, state, old.meta, now), old, now)
        self._suspicions.pop(name, None)
        if state == _DEAD:
            self._lost[name] = (old.addr, now)
        if src is not None:
            self._requeue(name, src)
        else:
            self._broadcast(name, Dead(incarnation, name, origin))
        self._at(now + self.config.gossip_to_dead_time, _T_REAP, name)

    def _refute(self, incarnation: int, now: float) -> None:
        """Someone thinks we are suspect or dead (or newer than we are): outbid them."""
        if self._leaving:
            return
        me = self.local_member
        inc = max(incarnation, me.incarnation) + 1
        self.stats.refutations += 1
        self._health.apply(1)
        self._set_local(inc, now)

    def _set_local(self, incarnation: int, now: float) -> None:
        """Record and announce ourselves alive at ``incarnation`` with our metadata."""
        old = self._members.get(self.name)
        since = old.state_since if old is not None else now
        self._set(Member(self.name, self.addr, incarnation, _ALIVE, self._meta, since), old, now)
        self._broadcast(self.name, Alive(incarnation, self.name, self.addr, self._meta))

    def _set(self, new: Member, old: Member | None, now: float) -> None:
        """Store ``new`` and publish what changed from ``old``."""
        name = new.name
        self._members[name] = new
        state = new.state
        was_live = old is not None and old.state <= _SUSPECT
        if state <= _SUSPECT:
            if not was_live:
                self._live += 1
                if name != self.name and self._order:
                    self._order.insert(self._rng.randrange(len(self._order) + 1), name)
        elif was_live:
            self._live -= 1
        if old is None:
            kind: EventKind | None = EventKind.JOINED
        elif name == self.name and state == old.state == _ALIVE:
            kind = EventKind.UPDATED if new.meta != old.meta else None
        elif state != old.state:
            kind = _STATE_EVENT[state]
        else:
            kind = None
        if kind is not None:
            self._events.append(MemberEvent(kind, new, now))
        if old is not None and kind is not EventKind.UPDATED and (
            (new.meta is not old.meta and new.meta != old.meta) or new.addr != old.addr
        ):
            self._events.append(MemberEvent(EventKind.UPDATED, new, now))

    def _state_message(self, m: Member) -> Update:
        msg: Suspect | Dead
        if m.state == _SUSPECT:
            msg = Suspect(m.incarnation, m.name, self.name)
        else:
            msg = Dead(m.incarnation, m.name, self.name)
        return Update(m.name, wrap_update(encode_message(msg)), msg)

    # ------------------------------------------------------------- dissemination
    def _requeue(self, name: str, src: Update) -> None:
        """Queue for dissemination a received update we repeat as is (same message, same
        bytes: its encoding is reused, not redone)."""
        self._queue.queue_update(Update(name, src.blob, src.msg))
        if not self._gossip_armed and self.config.gossip_interval > 0 and self.config.gossip_nodes:
            self._gossip_armed = True
            self._at(self._now + self.config.gossip_interval, _T_GOSSIP, None)

    def _broadcast(self, name: str, msg: Alive | Suspect | Dead) -> None:
        """Queue ``msg`` for dissemination (piggybacked, and gossiped while queued)."""
        self._queue.queue_update(Update(name, wrap_update(encode_message(msg)), msg))
        if not self._gossip_armed and self.config.gossip_interval > 0 and self.config.gossip_nodes:
            self._gossip_armed = True
            self._at(self._now + self.config.gossip_interval, _T_GOSSIP, None)

    def _gossip(self, now: float) -> None:
        self._gossip_armed = False
        cfg = self.config
        if not self._queue:
            return
        for m in self._random_live(cfg.gossip_nodes, exclude=None, dead_grace=cfg.gossip_to_dead_time, now=now):
            updates, size = self._take_updates(cfg.udp_buffer_size - _PACKET_SLACK)
            if not updates:
                break
            self._send(m.addr, None, updates, piggyback=False, priority_bytes=size)
        if self._queue and cfg.gossip_interval > 0 and cfg.gossip_nodes:
            self._gossip_armed = True
            self._at(now + cfg.gossip_interval, _T_GOSSIP, None)

    def _take_updates(self, budget: int) -> tuple[list[Update], int]:
        if self._keyring is not None:
            budget -= SEAL_OVERHEAD
        live = self._live
        cached_live, limit = self._limit_for
        if cached_live != live:
            limit = self.config.retransmit_limit(live)
            self._limit_for = (live, limit)
        return self._queue.take_updates(budget, limit)

    def _send(
        self,
        addr: Address,
        first_msg: Message | None,
        priority: list[Update] | None = None,
        *,
        piggyback: bool = True,
        priority_bytes: int = -1,
    ) -> None:
        """Send ``first_msg`` (or pure gossip) with ``priority`` updates and, if
        ``piggyback``, as many queued updates as fit; ``priority_bytes``: their encoded
        size when the caller knows it."""
        first = encode_message(first_msg) if first_msg is not None else None
        rest = list(priority) if priority else []
        if priority_bytes >= 0:
            rest_bytes = priority_bytes
        else:
            rest_bytes = sum(len(u.blob) for u in rest) if rest else 0
        if piggyback:
            used = (len(first) if first else 1) + rest_bytes
            budget = self.config.udp_buffer_size - _PACKET_SLACK - used
            taken, taken_bytes = self._take_updates(budget)
            rest.extend(taken)
            rest_bytes += taken_bytes
        stats = self.stats
        if self._decoded_mode:
            # The exact length build_packet would give, without joining the bytes.
            size = (
                len(array_header(2 + len(rest))) + _VERSION_LEN + (len(first) if first else 1) + rest_bytes
            )
            stats.packets_sent += 1
            stats.bytes_sent += size
            if size > stats.largest_packet:
                stats.largest_packet = size
            self._decoded.append((addr, DecodedPacket(first_msg, rest, size)))
            return
        data = build_packet(first, [u.blob for u in rest])
        if self._keyring is not None:
            data = self._keyring.seal(data)
        stats.packets_sent += 1
        stats.bytes_sent += len(data)
        if len(data) > stats.largest_packet:
            stats.largest_packet = len(data)
        self._packets.append((addr, data))

    # ------------------------------------------------------------- push-pull (TCP)
    def push_pull_payload(self, join: bool = False) -> bytes:
        """Our full state, encoded (and sealed) for a TCP push-pull exchange."""
        rows = [(m.name, m.addr, m.incarnation, m.state, dict(m.meta)) for m in self._members.values()]
        data = encode_push_pull(PushPullState(join, rows))
        return self._keyring.seal(data) if self._keyring is not None else data

    def merge_push_pull(self, data: bytes, now: float) -> bool:
        """Merge a peer's full state; False (counted) if it fails authentication or decoding."""
        self._now = now
        self.stats.bytes_received += len(data)
        if self._keyring is not None:
            try:
                data = self._keyring.open(data)
            except AuthError:
                self.stats.auth_failures += 1
                return False
        try:
            state = decode_push_pull(data)
        except WireError:
            self.stats.decode_errors += 1
            return False
        self.stats.push_pulls += 1
        for name, addr, inc, st, meta in state.members:
            if st == _ALIVE:
                self._alive(Alive(inc, name, addr, meta), now)
            elif st == _LEFT:
                self._dead(inc, name, name, now)
            else:
                # A remote "dead" is only a suspicion here: it can still be refuted.
                self._suspect(inc, name, self.name, now)
        return True

    # ------------------------------------------------------------------ timers
    def _at(self, when: float, kind: int, key: object) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, kind, key))

    def _fire(self, kind: int, key: object, now: float) -> None:
        if kind == _T_PROBE:
            self._probe_round(now)
        elif kind == _T_PROBE_TIMEOUT:
            assert isinstance(key, int)
            self._probe_timeout(key)
        elif kind == _T_SUSPICION:
            assert isinstance(key, str)
            self._suspicion_expired(key, now)
        elif kind == _T_NACK:
            fwd = self._forwards.get(key)  # type: ignore[call-overload]
            if fwd is not None and not fwd.done:
                self.stats.nacks_sent += 1
                self._send(fwd.requester, Nack(fwd.requester_seq))
        elif kind == _T_FORWARD_END:
            self._forwards.pop(key, None)  # type: ignore[call-overload]
        elif kind == _T_GOSSIP:
            self._gossip(now)
        elif kind == _T_PUSH_PULL:
            self._push_pull_round(now)
        elif kind == _T_REAP:
            assert isinstance(key, str)
            m = self._members.get(key)
            if m is not None and m.state >= _DEAD and now - m.state_since >= self.config.gossip_to_dead_time - 1e-9:
                del self._members[key]
        elif kind == _T_REJOIN:
            self._rejoin_round(now)

    def _suspicion_expired(self, name: str, now: float) -> None:
        susp = self._suspicions.get(name)
        if susp is None or susp.deadline() > now + 1e-9:
            return  # refuted, or the deadline moved (a re-armed timer is pending)
        m = self._members.get(name)
        if m is None or m.state != _SUSPECT or m.incarnation != susp.incarnation:
            return
        self.stats.dead_declared += 1
        if self.on_declare_dead is not None:
            self.on_declare_dead(name, now)
        self._dead(m.incarnation, name, self.name, now)

    def _push_pull_round(self, now: float) -> None:
        self._at(now + self.config.push_pull_period(self._live), _T_PUSH_PULL, None)
        peers = self._random_live(1, exclude=None)
        if peers:
            self._syncs.append((peers[0].addr, False))

    def _rejoin_round(self, now: float) -> None:
        """After failures, or alone, reach out to seeds and lost members (partition healing)."""
        cfg = self.config
        self._at(now + cfg.rejoin_interval, _T_REJOIN, None)
        for name in [n for n, (_, t) in self._lost.items() if now - t > cfg.rejoin_window]:
            del self._lost[name]
        targets: list[Address] = []
        if self._live <= 1:
            targets.extend(self._seeds)
        elif self._lost:
            lost = [a for n, (a, _) in self._lost.items() if not self._is_live(n)]
            if lost:
                targets.append(self._rng.choice(lost))
            if self._seeds:
                targets.append(self._rng.choice(self._seeds))
        for addr in dict.fromkeys(targets):
            self._syncs.append((addr, False))

    # ------------------------------------------------------------------ helpers
    def _is_live(self, name: str) -> bool:
        m = self._members.get(name)
        return m is not None and m.is_live

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def _random_live(
        self, k: int, exclude: str | None, dead_grace: float = -1.0, now: float = 0.0
    ) -> list[Member]:
        """Up to ``k`` distinct random members other than us (and ``exclude``)."""
        me = self.name

        def ok(m: Member) -> bool:
            if m.name == me or m.name == exclude:
                return False
            return m.is_live or (m.state == _DEAD and now - m.state_since < dead_grace)

        return sample_members(self._members, self._order, k, ok, self._rng)
