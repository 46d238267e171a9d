"""The simulator's decoded-packet fast path is the wire path without msgpack: same history.

The simulator hands packets over as decoded messages plus their exact encoded size
(``SwimProtocol.use_decoded_packets``). These tests run one churning group both ways and
require the same events, declarations, counters (bytes included) and largest packet,
with packets filled up to the UDP budget so the size accounting is exercised.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from accord.membership.broadcast import TransmitQueue
from accord.membership.config import SwimConfig
from accord.membership.protocol import SwimProtocol
from accord.membership.simulator import Simulator
from accord.membership.state import MemberEvent


def _history(wire: bool) -> tuple[str, dict[str, int], list[dict[str, int]]]:
    h = hashlib.sha256()

    def on_event(t: float, i: int, ev: MemberEvent) -> None:
        h.update(f"{t!r} {i} {ev.kind.value} {ev.member.name} {ev.member.incarnation}\n".encode())

    def on_declare(t: float, i: int, subject: str) -> None:
        h.update(f"declare {t!r} {i} {subject}\n".encode())

    sim = Simulator(
        SwimConfig.lan().with_lifeguard(False), 120, seed=7, loss=0.03, slow_fraction=0.15,
        slow_lag=(0.0, 20.0), slow_episode=(5.0, 20.0), on_event=on_event,
        on_declare_dead=on_declare, wire=wire,
    )
    assert sim.wire is wire
    sim.run_until(4.0)
    sim.crash(next(n.idx for n in sim.nodes if not n.slow))
    sim.run_until(22.0)
    return h.hexdigest(), sim.totals(), [n.proto.stats.as_dict() for n in sim.nodes]


def test_decoded_packets_give_the_same_history_and_byte_counts_as_the_wire() -> None:
    fast, wire = _history(wire=False), _history(wire=True)
    assert fast[0] == wire[0]
    assert fast[1] == wire[1]
    assert fast[2] == wire[2]
    # Churn filled packets to the UDP budget: the computed sizes met the bound exactly.
    largest = max(s["largest_packet"] for s in fast[2])
    assert SwimConfig.lan().udp_buffer_size - 40 < largest <= SwimConfig.lan().udp_buffer_size
    assert fast[1]["udp_bytes"] > 0 and fast[1]["dropped"] > 0


def test_encrypted_groups_keep_the_wire_path() -> None:
    cfg = replace(SwimConfig.lan(), secret_keys=(b"k" * 32,))
    assert Simulator(cfg, 3, seed=1).wire
    proto = SwimProtocol(cfg, "a", ("10.0.0.1", 7946))
    with pytest.raises(ValueError, match="encryption"):
        proto.use_decoded_packets()


def test_take_updates_reports_the_bytes_it_took_when_the_budget_stops_it() -> None:
    q = TransmitQueue()
    for i, size in enumerate([30, 20, 10, 40]):
        q.queue(f"m{i}", bytes(size))
    taken, used = q.take_updates(75, limit=5)
    # Newest first: 40 + 10 + 20 fit in 75, the oldest (30) does not and stops the take.
    assert [len(u.blob) for u in taken] == [40, 10, 20]
    assert used == 70
    assert q.transmits("m3") == 1 and q.transmits("m0") == 0
    rest, used = q.take_updates(1000, limit=5)
    assert [len(u.blob) for u in rest] == [30, 20, 10, 40] and used == 100
