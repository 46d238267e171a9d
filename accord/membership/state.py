"""Member records and membership events: the values the protocol hands to its users.

A ``Member`` is immutable: the protocol replaces the record whenever something about the
member changes, so snapshots handed out by ``members()`` never change underfoot (and a
simulator can share one record among thousands of simulated members).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from .config import MAX_META_BYTES

__all__ = ["Address", "EventKind", "Member", "MemberEvent", "MemberState", "validate_meta"]

Address = tuple[str, int]
"""A UDP/TCP endpoint: host and port."""


class MemberState(enum.IntEnum):
    """Where a member stands in the local view."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


class EventKind(enum.StrEnum):
    """What happened to a member, as seen by the local node."""

    JOINED = "joined"  # first heard of
    UPDATED = "updated"  # metadata or address changed
    SUSPECT = "suspect"  # failed a probe; may still refute
    DEAD = "dead"  # suspicion timed out (or someone else's did)
    LEFT = "left"  # announced a graceful leave
    ALIVE = "alive"  # alive again after being suspect, dead or left


@dataclass(frozen=True, slots=True)
class Member:
    """One member as seen by the local node: identity, address, incarnation, state."""

    name: str
    addr: Address
    incarnation: int
    state: MemberState
    meta: Mapping[str, str]
    state_since: float

    @property
    def is_live(self) -> bool:
        """Alive or suspect: still counted as a member."""
        return self.state <= MemberState.SUSPECT

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly description (for logs, CLIs and the agent's output)."""
        return {
            "name": self.name,
            "addr": f"{self.addr[0]}:{self.addr[1]}",
            "incarnation": self.incarnation,
            "state": self.state.name.lower(),
            "meta": dict(self.meta),
        }


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """A change in the local view: ``kind`` happened to ``member`` at local time ``at``."""

    kind: EventKind
    member: Member
    at: float

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly description."""
        return {"event": self.kind.value, "at": round(self.at, 6), **self.member.to_dict()}


def validate_meta(meta: Mapping[str, object]) -> dict[str, str]:
    """Check member metadata (str keys and values, at most 512 bytes encoded); copy it."""
    out: dict[str, str] = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"metadata keys must be non-empty strings, got {key!r}")
        if not isinstance(value, str):
            raise ValueError(f"metadata value for {key!r} must be a string, got {type(value).__name__}")
        out[key] = value
    size = len(msgpack.packb(out))
    if size > MAX_META_BYTES:
        raise ValueError(f"metadata is {size} bytes encoded; the limit is {MAX_META_BYTES}")
    return out
