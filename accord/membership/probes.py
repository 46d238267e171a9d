"""Small records the protocol keeps per probe, and random member sampling."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .broadcast import Update
from .state import Address, Member, MemberEvent

__all__ = ["DecodedPacket", "Forward", "Output", "Probe", "sample_members"]


@dataclass(slots=True)
class Probe:
    """The probe round in progress: whom we pinged, and what came back."""

    seq: int
    target: str
    incarnation: int
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class Forward:
    """An indirect probe this member runs on behalf of ``requester``."""

    requester_seq: int
    requester: Address
    want_nack: bool
    done: bool = False


@dataclass(slots=True)
class DecodedPacket:
    """A UDP packet as an in-process driver may carry it: messages, not bytes.

    ``main`` is the protocol message (a ``wire`` Ping, Ack, ... or None for pure
    gossip), ``updates`` the piggybacked updates (each with its decoded ``msg`` and
    its encoding), ``size`` the exact length of the packet's encoding.
    """

    main: object
    updates: list[Update]
    size: int


@dataclass(slots=True)
class Output:
    """What a driver must do after feeding the protocol."""

    packets: list[tuple[Address, bytes]]
    syncs: list[tuple[Address, bool]]  # push-pull exchanges to start: (address, join)
    events: list[MemberEvent]
    # Packets as DecodedPacket, in send order, when the protocol was asked for them
    # (``SwimProtocol.use_decoded_packets``); then ``packets`` stays empty.
    decoded: list[tuple[Address, DecodedPacket]] = field(default_factory=list)


def sample_members(
    members: Mapping[str, Member],
    order: list[str],
    k: int,
    ok: Callable[[Member], bool],
    rng: random.Random,
) -> list[Member]:
    """Up to ``k`` distinct random members passing ``ok``.

    Small groups are sampled exactly; large ones by drawing from the probe order with
    rejection (a bounded number of draws), which avoids scanning thousands of members.
    """
    if k <= 0:
        return []
    if len(members) <= 64 or len(order) < 4 * k:
        pool = [m for m in members.values() if ok(m)]
        return rng.sample(pool, min(k, len(pool)))
    chosen: dict[str, Member] = {}
    for _ in range(8 * k):
        m = members.get(order[rng.randrange(len(order))])
        if m is not None and m.name not in chosen and ok(m):
            chosen[m.name] = m
            if len(chosen) == k:
                break
    return list(chosen.values())
