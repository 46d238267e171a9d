"""Counters of one member's protocol activity (exported as metrics by the node)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["ProtocolStats"]


@dataclass(slots=True)
class ProtocolStats:
    """Monotonic counters; ``as_dict`` gives a snapshot."""

    packets_sent: int = 0
    bytes_sent: int = 0
    packets_received: int = 0
    bytes_received: int = 0
    auth_failures: int = 0  # packets or frames that failed AES-GCM authentication
    decode_errors: int = 0  # packets or frames that were not valid messages
    misdirected: int = 0  # pings meant for another member at our address
    probes: int = 0
    probe_failures: int = 0
    indirect_probes: int = 0
    nacks_sent: int = 0
    suspicions: int = 0
    dead_declared: int = 0  # suspicions of ours that timed out
    refutations: int = 0
    push_pulls: int = 0
    largest_packet: int = 0  # bytes, for checking the UDP size bound

    def as_dict(self) -> dict[str, int]:
        """A snapshot of every counter."""
        return asdict(self)
