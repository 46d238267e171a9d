"""Configuration of the SWIM + Lifeguard membership protocol, with three profiles.

Every default below is explained with what it costs and what it buys, because the
knobs trade detection time against bandwidth and false positives. The formulas the
protocol uses (``n`` = number of live members):

* **Probe rate.** Each member probes one member per ``probe_interval``, so each member
  is probed about once per interval (round-robin over a shuffled list bounds the worst
  case at ``n`` intervals). Steady-state traffic per member is one ping and one ack per
  interval: ~2 packets/s sent and received on LAN, independent of ``n``.
* **Suspicion timeout.** ``suspicion_mult * max(1, log10(n)) * probe_interval``. With
  Lifeguard the timer starts at ``suspicion_max_timeout_mult`` times that and shrinks
  toward it as independent members confirm the suspicion (``suspicion_mult - 2``
  confirmations are expected).
* **Detection time** of a crash is about one to two probe intervals until somebody
  probes it and fails, plus the suspicion timeout, plus dissemination.
* **Dissemination.** Each update is piggybacked on up to
  ``retransmit_mult * ceil(log10(n + 1))`` outgoing packets, newest first, and also sent
  to ``gossip_nodes`` random members every ``gossip_interval`` while any update is
  queued: O(log n) intervals for everyone to learn it.
* **Local health (Lifeguard).** A member that misses acks and nacks raises its local
  health score up to ``awareness_max_multiplier``; its probe interval and probe timeout
  are multiplied by ``score + 1``, so a slow member probes less often and waits longer
  instead of accusing healthy members.

``lan()`` suits one data centre, ``wan()`` links across regions, ``local()`` one host
(tests, demos): detection in a couple of seconds at the price of ~10 packets/s/member.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

__all__ = ["SwimConfig"]

# The largest metadata a member may carry, encoded; it must fit one UDP packet with room
# to spare for the headers and piggybacked updates.
MAX_META_BYTES = 512


@dataclass(slots=True)
class SwimConfig:
    """Tunables of one member; all durations are in seconds.

    Members of one cluster should share the profile (mixed probe intervals work, but
    suspicion timeouts then differ between observers).
    """

    # --- probing -------------------------------------------------------------------
    # One probe per interval. LAN 1 s: a crash is noticed within ~1-2 s, at 2 packets/s.
    probe_interval: float = 1.0
    # How long to wait for a direct ack before asking others. Must be well above the
    # network's 99th-percentile round trip (LAN: 0.5 s, generous for sub-ms RTTs).
    probe_timeout: float = 0.5
    # k members asked to ping an unresponsive target (ping-req). More means fewer false
    # suspicions from a single lossy path, at k extra packet pairs per failed probe.
    indirect_checks: int = 3

    # --- suspicion -------------------------------------------------------------------
    # Suspicion timeout = mult * max(1, log10(n)) * probe_interval (LAN 4: 8 s at n=100).
    # Longer means fewer false deaths for slow members and slower detection.
    suspicion_mult: int = 4
    # Lifeguard: the suspicion timer starts at this multiple of the timeout above and
    # shrinks as independent confirmations arrive.
    suspicion_max_timeout_mult: int = 6

    # --- dissemination -----------------------------------------------------------------
    # Each update rides on mult * ceil(log10(n + 1)) packets (LAN 4: 12 at n=100); higher
    # means more reliable dissemination under loss, more bytes per packet.
    retransmit_mult: int = 4
    # While updates are queued, send them to gossip_nodes random members this often, on
    # top of piggybacking on probes. 0 disables the extra gossip (pure SWIM).
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    # Dead members still receive gossip this long, so they can learn they were declared
    # dead and refute; after it they are forgotten (reaped).
    gossip_to_dead_time: float = 30.0
    # Full-state TCP exchange with one random member this often (scaled up slowly for
    # large clusters): repairs whatever gossip missed. 0 disables it.
    push_pull_interval: float = 30.0
    # Largest UDP packet, bytes. 1400 stays under a 1500-byte Ethernet MTU.
    udp_buffer_size: int = 1400

    # --- partitions ----------------------------------------------------------------------
    # Try a push-pull with the seeds and with a member lost to failure this often, so two
    # sides of a healed partition find each other again. 0 disables it.
    rejoin_interval: float = 30.0
    # Remember addresses of members lost to failure for re-join attempts this long.
    rejoin_window: float = 3600.0

    # --- Lifeguard (each part can be switched off to compare with plain SWIM) ---------------
    # Local health multiplier: slow members probe less often and wait longer.
    lifeguard_local_health: bool = True
    # Indirect probers answer "nack" when the target is silent, so the requester can tell
    # "the target is down" from "I am the one not hearing anything".
    lifeguard_nack: bool = True
    # Suspicion timeouts that start long and shrink with independent confirmations.
    lifeguard_dynamic_suspicion: bool = True
    # Buddy system: a ping to a suspected member carries the suspicion, so it can refute.
    lifeguard_buddy: bool = True
    # Highest local health score (the multiplier is score + 1).
    awareness_max_multiplier: int = 8

    # --- transport ----------------------------------------------------------------------
    # Timeout of a TCP push-pull exchange.
    tcp_timeout: float = 10.0
    # Optional shared keys for AES-GCM (16, 24 or 32 bytes each). The first encrypts; all
    # are tried for decryption, which lets a cluster rotate keys without downtime.
    secret_keys: tuple[bytes, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range."""
        positive = {
            "probe_interval": self.probe_interval,
            "probe_timeout": self.probe_timeout,
            "tcp_timeout": self.tcp_timeout,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.probe_timeout >= self.probe_interval:
            raise ValueError(
                f"probe_timeout ({self.probe_timeout}) must be shorter than "
                f"probe_interval ({self.probe_interval})"
            )
        non_negative = {
            "indirect_checks": self.indirect_checks,
            "gossip_interval": self.gossip_interval,
            "gossip_nodes": self.gossip_nodes,
            "gossip_to_dead_time": self.gossip_to_dead_time,
            "push_pull_interval": self.push_pull_interval,
            "rejoin_interval": self.rejoin_interval,
            "rejoin_window": self.rejoin_window,
            "awareness_max_multiplier": self.awareness_max_multiplier,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if self.suspicion_mult < 1:
            raise ValueError(f"suspicion_mult must be >= 1, got {self.suspicion_mult}")
        if self.suspicion_max_timeout_mult < 1:
            raise ValueError(
                f"suspicion_max_timeout_mult must be >= 1, got {self.suspicion_max_timeout_mult}"
            )
        if self.retransmit_mult < 1:
            raise ValueError(f"retransmit_mult must be >= 1, got {self.retransmit_mult}")
        if self.udp_buffer_size < 576:
            raise ValueError(f"udp_buffer_size must be >= 576 bytes, got {self.udp_buffer_size}")
        for key in self.secret_keys:
            if len(key) not in (16, 24, 32):
                raise ValueError(f"secret keys must be 16, 24 or 32 bytes, got {len(key)}")

    # --- derived values ------------------------------------------------------------------
    def suspicion_timeout(self, n: int) -> float:
        """The base (shortest) suspicion timeout for a cluster of ``n`` live members."""
        return self.suspicion_mult * max(1.0, math.log10(max(1, n))) * self.probe_interval

    def retransmit_limit(self, n: int) -> int:
        """How many packets each update rides on before it is dropped from the queue."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def push_pull_period(self, n: int) -> float:
        """Push-pull interval scaled for large clusters (TCP load grows with ``n``)."""
        if n <= 32:
            return self.push_pull_interval
        return self.push_pull_interval * (math.ceil(math.log2(n) - math.log2(32)) + 1)

    @property
    def lifeguard(self) -> bool:
        """True when every Lifeguard extension is on."""
        return (
            self.lifeguard_local_health
            and self.lifeguard_nack
            and self.lifeguard_dynamic_suspicion
            and self.lifeguard_buddy
        )

    def with_lifeguard(self, enabled: bool) -> SwimConfig:
        """A copy with all Lifeguard extensions switched on or off (plain SWIM)."""
        return replace(
            self,
            lifeguard_local_health=enabled,
            lifeguard_nack=enabled,
            lifeguard_dynamic_suspicion=enabled,
            lifeguard_buddy=enabled,
        )

    # --- profiles -------------------------------------------------------------------------
    @classmethod
    def lan(cls) -> SwimConfig:
        """One data centre: the defaults above.

        Crash detection ~ 1-2 s + 4*log10(n) s (n=100: ~10 s; n=1000: ~14 s), a little
        longer with Lifeguard until confirmations arrive. ~2 probe packets/s/member plus
        gossip while updates are in flight; one push-pull per 30 s (scaled) per member.
        """
        return cls()

    @classmethod
    def wan(cls) -> SwimConfig:
        """Across regions: tolerate 100+ ms RTTs and lossier paths.

        Probes every 5 s with a 3 s timeout, suspicion 6*log10(n)*5 s: detection takes
        ~1-2 minutes at n=100, and each member sends ~0.4 probe packets/s.
        """
        return cls(
            probe_interval=5.0,
            probe_timeout=3.0,
            suspicion_mult=6,
            gossip_interval=0.5,
            gossip_nodes=4,
            gossip_to_dead_time=60.0,
            push_pull_interval=60.0,
            rejoin_interval=60.0,
            tcp_timeout=30.0,
        )

    @classmethod
    def local(cls) -> SwimConfig:
        """One host (tests, demos): loopback RTTs are microseconds.

        Probes every 0.2 s with a 0.1 s timeout, suspicion 3*0.2 s = 0.6 s for small
        clusters (up to 3.6 s before confirmations with Lifeguard): a crash is detected
        within ~1-4 s, at ~10 probe packets/s/member.
        """
        return cls(
            probe_interval=0.2,
            probe_timeout=0.1,
            suspicion_mult=3,
            gossip_interval=0.1,
            gossip_to_dead_time=15.0,
            push_pull_interval=10.0,
            rejoin_interval=5.0,
            tcp_timeout=2.0,
        )

    @classmethod
    def profile(cls, name: str) -> SwimConfig:
        """The profile called ``name``: ``lan``, ``wan`` or ``local``."""
        makers = {"lan": cls.lan, "wan": cls.wan, "local": cls.local}
        if name not in makers:
            raise ValueError(f"unknown membership profile {name!r}; expected one of {sorted(makers)}")
        return makers[name]()
