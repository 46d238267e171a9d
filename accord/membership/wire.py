"""Wire format of the membership protocol: messages, compound packets, push-pull state.

Every message is a msgpack array whose first element is its type. A UDP packet is one
msgpack array ``[WIRE_VERSION, message-or-nil, update, update, ...]``: the protocol
message (ping, ack, ...; nil in a pure gossip packet) and then piggybacked updates
(alive, suspect, dead), each an encoded message wrapped as msgpack ``bin``. Updates are
encoded once, when queued, and spliced into packets as bytes (an array header followed
by encoded elements is itself valid msgpack), so building a packet never re-encodes;
a receiver decodes each update blob through a small cache, since the same update
reaches a member many times over.

Push-pull state goes over TCP as ``[WIRE_VERSION, join, [[name, host, port,
incarnation, state, meta], ...]]`` in a 4-byte length-prefixed frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from .state import Address, MemberState

__all__ = [
    "WIRE_VERSION",
    "Ack",
    "Alive",
    "Dead",
    "IndirectPing",
    "Message",
    "Nack",
    "Ping",
    "PushPullState",
    "Suspect",
    "WireError",
    "array_header",
    "build_packet",
    "decode_message",
    "decode_packet",
    "decode_push_pull",
    "decode_update",
    "encode_message",
    "encode_push_pull",
    "wrap_update",
]

WIRE_VERSION = 1
_VERSION_BYTES = msgpack.packb(WIRE_VERSION)

PING, INDIRECT_PING, ACK, NACK, ALIVE, SUSPECT, DEAD = range(1, 8)


class WireError(ValueError):
    """A packet or frame that is not a well-formed message of this protocol."""


@dataclass(slots=True)
class Ping:
    """Direct probe. ``target`` guards against a new member reusing an old address."""

    seq: int
    target: str
    source: str
    source_addr: Address


@dataclass(slots=True)
class IndirectPing:
    """Ask the receiver to probe ``target`` on behalf of ``source`` (ping-req)."""

    seq: int
    target: str
    target_addr: Address
    source: str
    source_addr: Address
    want_nack: bool


@dataclass(slots=True)
class Ack:
    """Answer to a ping (or forwarded answer to an indirect ping)."""

    seq: int


@dataclass(slots=True)
class Nack:
    """Lifeguard: an indirect prober heard nothing from the target in time."""

    seq: int


@dataclass(frozen=True, slots=True)
class Alive:
    """Member ``name`` is alive at ``incarnation`` with this address and metadata."""

    incarnation: int
    name: str
    addr: Address
    meta: dict[str, str]


@dataclass(frozen=True, slots=True)
class Suspect:
    """``origin`` suspects ``name`` at ``incarnation``."""

    incarnation: int
    name: str
    origin: str


@dataclass(frozen=True, slots=True)
class Dead:
    """``origin`` declares ``name`` dead at ``incarnation``; ``origin == name`` is a leave."""

    incarnation: int
    name: str
    origin: str


Message = Ping | IndirectPing | Ack | Nack | Alive | Suspect | Dead


def encode_message(msg: Message) -> bytes:
    """Encode one message as a msgpack array."""
    body: list[Any]
    if isinstance(msg, Ping):
        body = [PING, msg.seq, msg.target, msg.source, msg.source_addr[0], msg.source_addr[1]]
    elif isinstance(msg, Ack):
        body = [ACK, msg.seq]
    elif isinstance(msg, Alive):
        body = [ALIVE, msg.incarnation, msg.name, msg.addr[0], msg.addr[1], msg.meta]
    elif isinstance(msg, Suspect):
        body = [SUSPECT, msg.incarnation, msg.name, msg.origin]
    elif isinstance(msg, Dead):
        body = [DEAD, msg.incarnation, msg.name, msg.origin]
    elif isinstance(msg, IndirectPing):
        body = [
            INDIRECT_PING, msg.seq, msg.target, msg.target_addr[0], msg.target_addr[1],
            msg.source, msg.source_addr[0], msg.source_addr[1], msg.want_nack,
        ]
    else:
        body = [NACK, msg.seq]
    out: bytes = msgpack.packb(body)
    return out


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` elements."""
    if count < 16:
        return bytes((0x90 | count,))
    return b"\xdc" + struct.pack(">H", count)


_NIL = b"\xc0"


def wrap_update(encoded: bytes) -> bytes:
    """An encoded update message as a msgpack ``bin``, ready to splice into packets."""
    out: bytes = msgpack.packb(encoded, use_bin_type=True)
    return out


def build_packet(first: bytes | None, updates: list[bytes]) -> bytes:
    """Splice a pre-encoded message (or none) and wrapped updates into one packet."""
    return b"".join(
        (array_header(2 + len(updates)), _VERSION_BYTES, first or _NIL, *updates)
    )


_update_cache: dict[bytes, Message] = {}
_CACHE_LIMIT = 65536


def decode_update(blob: bytes) -> Message:
    """Decode one piggybacked update (cached: the same blob arrives many times)."""
    msg = _update_cache.get(blob)
    if msg is None:
        try:
            body = msgpack.unpackb(blob, raw=False, strict_map_key=True)
        except Exception as exc:
            raise WireError(f"undecodable update: {exc}") from exc
        msg = decode_message(body)
        if not isinstance(msg, Alive | Suspect | Dead):
            raise WireError(f"{type(msg).__name__} cannot be piggybacked as an update")
        if len(_update_cache) >= _CACHE_LIMIT:
            _update_cache.clear()
        _update_cache[blob] = msg
    return msg


def _addr(host: Any, port: Any) -> Address:
    if not isinstance(host, str) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise WireError(f"bad address {host!r}:{port!r}")
    return (host, port)


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise WireError(f"expected a non-negative integer, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise WireError(f"expected a string, got {v!r}")
    return v


def _meta(v: Any) -> dict[str, str]:
    if not isinstance(v, dict) or not all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
    ):
        raise WireError("metadata must map strings to strings")
    return v


def decode_message(body: Any) -> Message:
    """Turn one decoded msgpack array back into a message; ``WireError`` if malformed."""
    if not isinstance(body, list) or not body:
        raise WireError("message is not a non-empty array")
    kind = body[0]
    try:
        if kind == PING:
            _, seq, target, source, host, port = body
            return Ping(_int(seq), _str(target), _str(source), _addr(host, port))
        if kind == ACK:
            _, seq = body
            return Ack(_int(seq))
        if kind == ALIVE:
            _, inc, name, host, port, meta = body
            return Alive(_int(inc), _str(name), _addr(host, port), _meta(meta))
        if kind == SUSPECT:
            _, inc, name, origin = body
            return Suspect(_int(inc), _str(name), _str(origin))
        if kind == DEAD:
            _, inc, name, origin = body
            return Dead(_int(inc), _str(name), _str(origin))
        if kind == INDIRECT_PING:
            _, seq, target, th, tp, source, sh, sp, nack = body
            return IndirectPing(
                _int(seq), _str(target), _addr(th, tp), _str(source), _addr(sh, sp), bool(nack)
            )
        if kind == NACK:
            _, seq = body
            return Nack(_int(seq))
    except ValueError as exc:  # wrong arity while unpacking, or a field check
        raise WireError(f"malformed message of type {kind!r}: {exc}") from exc
    raise WireError(f"unknown message type {kind!r}")


def decode_packet(data: bytes) -> tuple[Message | None, list[Message]]:
    """Decode a packet into its protocol message (or None) and its updates."""
    try:
        parts = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise WireError(f"undecodable packet: {exc}") from exc
    if not isinstance(parts, list) or len(parts) < 2 or parts[0] != WIRE_VERSION:
        raise WireError("not a version-1 membership packet")
    first = parts[1]
    main = None if first is None else decode_message(first)
    updates = []
    for blob in parts[2:]:
        if not isinstance(blob, bytes):
            raise WireError("piggybacked update is not a bin blob")
        updates.append(decode_update(blob))
    return main, updates


@dataclass(slots=True)
class PushPullState:
    """A full-state exchange: every member the sender knows, and whether it is joining."""

    join: bool
    members: list[tuple[str, Address, int, MemberState, dict[str, str]]]


def encode_push_pull(state: PushPullState) -> bytes:
    """Encode a push-pull state message."""
    rows = [[n, a[0], a[1], inc, int(st), meta] for n, a, inc, st, meta in state.members]
    out: bytes = msgpack.packb([WIRE_VERSION, state.join, rows])
    return out


def decode_push_pull(data: bytes) -> PushPullState:
    """Decode a push-pull state message; ``WireError`` if malformed."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"undecodable push-pull state: {exc}") from exc
    if not isinstance(obj, list) or len(obj) != 3 or obj[0] != WIRE_VERSION:
        raise WireError("not a version-1 push-pull state")
    _, join, rows = obj
    if not isinstance(rows, list):
        raise WireError("push-pull rows must be an array")
    members = []
    for row in rows:
        try:
            name, host, port, inc, st, meta = row
            members.append(
                (_str(name), _addr(host, port), _int(inc), MemberState(_int(st)), _meta(meta))
            )
        except (ValueError, TypeError) as exc:
            raise WireError(f"malformed push-pull row {row!r}: {exc}") from exc
    return PushPullState(bool(join), members)
