"""Compact, versioned msgpack encoding of Raft messages, frames and handshakes.

Everything here is pure (bytes in, bytes out) so the transport, the simulator and
tests can share it. Values travel as positional msgpack arrays, never as maps of
field names:

* ``Entry``        -> ``[term, index, type, data]``
* ``ConfState``    -> ``[voters, learners, voters_outgoing, learners_next, auto_leave]``
* ``SnapshotMeta`` -> ``[index, term, conf_state]``
* ``Snapshot``     -> ``[meta, data]``
* ``Message``      -> ``[type, to, frm, term, log_term, index, entries, commit, reject,
  reject_hint, hint_term, snapshot, context]`` with trailing fields that hold their
  default value left off (a heartbeat is a handful of bytes).

A *frame payload* (what follows the 4-byte length prefix on a Raft connection) is
``[FRAME_VERSION, messages, heartbeats, heartbeat_resps]`` where ``messages`` is a
list of ``[group_id, routed_message]``. A routed message is the message array
without ``to`` and ``frm``: both are implied by the connection (the receiver is
``to``, the authenticated dialer is ``frm``), so decoding fills them back in.
``heartbeats`` is the coalesced heartbeat bundle, ``[[group_id, term, commit], ...]``,
and ``heartbeat_resps`` is ``[[group_id, term], ...]``.

Decoding is strict: every field is type- and range-checked, and any deviation
raises ``CodecError`` (never another exception), so a peer sending garbage can
only get its own connection closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accord.raft.core.types import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

FRAME_VERSION = 1
"""Version of the frame payload layout; bumped on any incompatible change."""

MAGIC = "accord-raft"
"""First field of every handshake: tells an accord peer from anything else."""

PROTOCOL_VERSION = 1
"""Version of the connection protocol (handshake, framing, snapshot streams)."""

_U64 = (1 << 64) - 1
_MESSAGE_TYPES = {int(t): t for t in MessageType}
_ENTRY_TYPES = {int(t): t for t in EntryType}

Heartbeat = tuple[int, int, int]
"""``(group_id, term, commit)`` of one coalesced HEARTBEAT."""
HeartbeatResp = tuple[int, int]
"""``(group_id, term)`` of one coalesced HEARTBEAT_RESP."""


class CodecError(ValueError):
    """Bytes that do not decode to a valid value; the message says what was wrong."""


# ---------------------------------------------------------------------------
# checks


def _int(v: object, what: str) -> int:
    if type(v) is not int or v < 0 or v > _U64:
        raise CodecError(f"{what}: expected an unsigned 64-bit integer, got {v!r:.40}")
    return v


def _bytes(v: object, what: str) -> bytes:
    if type(v) is not bytes:
        raise CodecError(f"{what}: expected bytes, got {type(v).__name__}")
    return v


def _bool(v: object, what: str) -> bool:
    if type(v) is not bool:
        raise CodecError(f"{what}: expected a boolean, got {v!r:.40}")
    return v


def _list(v: object, what: str, lo: int = 0, hi: int = 1 << 32) -> list[Any]:
    if type(v) is not list or not lo <= len(v) <= hi:
        raise CodecError(f"{what}: expected an array of {lo}..{hi} items, got {v!r:.60}")
    return v


def _ids(v: object, what: str) -> tuple[int, ...]:
    return tuple(_int(x, what) for x in _list(v, what))


# ---------------------------------------------------------------------------
# values


def entry_to_wire(e: Entry) -> list[Any]:
    """The positional form of an entry."""
    return [e.term, e.index, int(e.type), e.data]


def entry_from_wire(v: object) -> Entry:
    """Inverse of ``entry_to_wire``."""
    term, index, typ, data = _list(v, "entry", 4, 4)
    etype = _ENTRY_TYPES.get(typ) if type(typ) is int else None
    if etype is None:
        raise CodecError(f"entry type: unknown value {typ!r:.40}")
    return Entry(_int(term, "entry term"), _int(index, "entry index"), etype, _bytes(data, "entry data"))


def conf_state_to_wire(cs: ConfState) -> list[Any]:
    """The positional form of a ConfState."""
    return [list(cs.voters), list(cs.learners), list(cs.voters_outgoing),
            list(cs.learners_next), cs.auto_leave]


def conf_state_from_wire(v: object) -> ConfState:
    """Inverse of ``conf_state_to_wire``."""
    voters, learners, outgoing, nxt, auto = _list(v, "conf_state", 5, 5)
    return ConfState(
        _ids(voters, "voters"), _ids(learners, "learners"), _ids(outgoing, "voters_outgoing"),
        _ids(nxt, "learners_next"), _bool(auto, "auto_leave"),
    )


def snapshot_meta_to_wire(m: SnapshotMeta) -> list[Any]:
    """The positional form of a SnapshotMeta."""
    return [m.index, m.term, conf_state_to_wire(m.conf_state)]


def snapshot_meta_from_wire(v: object) -> SnapshotMeta:
    """Inverse of ``snapshot_meta_to_wire``."""
    index, term, cs = _list(v, "snapshot meta", 3, 3)
    return SnapshotMeta(_int(index, "snapshot index"), _int(term, "snapshot term"),
                        conf_state_from_wire(cs))


def _snapshot_to_wire(s: Snapshot) -> list[Any]:
    return [snapshot_meta_to_wire(s.meta), s.data]


def _snapshot_from_wire(v: object) -> Snapshot:
    meta, data = _list(v, "snapshot", 2, 2)
    return Snapshot(snapshot_meta_from_wire(meta), _bytes(data, "snapshot data"))


# Message fields after ``type, to, frm`` with their defaults, in wire order.
_TAIL_DEFAULTS: tuple[Any, ...] = (0, 0, 0, [], 0, False, 0, 0, None, b"")


def _message_tail(m: Message) -> list[Any]:
    tail: list[Any] = [
        m.term, m.log_term, m.index, [entry_to_wire(e) for e in m.entries], m.commit,
        m.reject, m.reject_hint, m.hint_term,
        None if m.snapshot is None else _snapshot_to_wire(m.snapshot), m.context,
    ]
    n = len(tail)
    while n and tail[n - 1] == _TAIL_DEFAULTS[n - 1]:
        n -= 1
    del tail[n:]
    return tail


_NUMERIC = ("term", "log_term", "index", "commit", "reject_hint", "hint_term")


def _message_from_parts(typ: object, to: int, frm: int, tail: list[Any]) -> Message:
    # The hot path of every inbound frame: checks are inlined rather than helper calls.
    n = len(tail)
    if n > len(_TAIL_DEFAULTS):
        raise CodecError(f"message: {n} fields after the header, at most {len(_TAIL_DEFAULTS)} known")
    mtype = _MESSAGE_TYPES.get(typ) if type(typ) is int else None
    if mtype is None:
        raise CodecError(f"message type: unknown value {typ!r:.40}")
    if n < len(_TAIL_DEFAULTS):
        tail = tail + list(_TAIL_DEFAULTS[n:])
    term, log_term, index, entries, commit, reject, hint, hint_term, snap, ctx = tail
    for what, v in zip(_NUMERIC, (term, log_term, index, commit, hint, hint_term), strict=True):
        if type(v) is not int or v < 0 or v > _U64:
            raise CodecError(f"{what}: expected an unsigned 64-bit integer, got {v!r:.40}")
    if type(reject) is not bool:
        raise CodecError(f"reject: expected a boolean, got {reject!r:.40}")
    if type(ctx) is not bytes:
        raise CodecError(f"context: expected bytes, got {type(ctx).__name__}")
    return Message(
        mtype, to, frm, term, log_term, index,
        [entry_from_wire(e) for e in _list(entries, "entries")],
        commit, reject, hint, hint_term,
        None if snap is None else _snapshot_from_wire(snap),
        ctx,
    )


def message_to_wire(m: Message) -> list[Any]:
    """The full positional form of a message (with ``to`` and ``frm``)."""
    return [int(m.type), m.to, m.frm, *_message_tail(m)]


def message_from_wire(v: object) -> Message:
    """Inverse of ``message_to_wire``."""
    parts = _list(v, "message", 3, 3 + len(_TAIL_DEFAULTS))
    return _message_from_parts(parts[0], _int(parts[1], "to"), _int(parts[2], "frm"), parts[3:])


def _pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _unpack(data: bytes, what: str, max_len: int) -> object:
    if len(data) > max_len:
        raise CodecError(f"{what}: {len(data)} bytes exceeds the limit of {max_len}")
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except CodecError:
        raise
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise CodecError(f"{what}: not valid msgpack ({type(exc).__name__}: {exc})") from exc


def encode_message(m: Message) -> bytes:
    """One message as msgpack bytes (round-trips exactly through ``decode_message``)."""
    return _pack(message_to_wire(m))


def decode_message(data: bytes) -> Message:
    """Inverse of ``encode_message``; raises ``CodecError`` on anything invalid."""
    return message_from_wire(_unpack(data, "message", 1 << 32))


# ---------------------------------------------------------------------------
# frames


@dataclass(slots=True)
class Frame:
    """The decoded content of one frame on a Raft connection."""

    messages: list[tuple[int, Message]] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    heartbeat_resps: list[HeartbeatResp] = field(default_factory=list)

    def empty(self) -> bool:
        """True when the frame carries nothing (a keepalive)."""
        return not (self.messages or self.heartbeats or self.heartbeat_resps)


_packer = msgpack.Packer(use_bin_type=True)


def pack_routed(group_id: int, m: Message) -> bytes:
    """One ``[group_id, routed_message]`` element, ready to join into a frame.

    Packing elements one at a time lets the sender measure and split batches
    without building the frame twice.
    """
    data: bytes = _packer.pack([group_id, [int(m.type), *_message_tail(m)]])
    return data


def assemble_frame(packed_messages: Sequence[bytes], heartbeats: Sequence[Heartbeat] = (),
                   heartbeat_resps: Sequence[HeartbeatResp] = ()) -> bytes:
    """A frame payload from elements made by ``pack_routed`` plus heartbeat bundles."""
    return b"".join((
        _packer.pack_array_header(4),
        _packer.pack(FRAME_VERSION),
        _packer.pack_array_header(len(packed_messages)),
        *packed_messages,
        _packer.pack([list(h) for h in heartbeats]),
        _packer.pack([list(h) for h in heartbeat_resps]),
    ))


def encode_frame(messages: Iterable[tuple[int, Message]], heartbeats: Sequence[Heartbeat] = (),
                 heartbeat_resps: Sequence[HeartbeatResp] = ()) -> bytes:
    """A frame payload carrying ``(group_id, message)`` pairs and heartbeat bundles."""
    return assemble_frame([pack_routed(g, m) for g, m in messages], heartbeats, heartbeat_resps)


def decode_frame(data: bytes, *, to: int, frm: int, max_len: int = 1 << 30) -> Frame:
    """Decode a frame payload; ``to``/``frm`` are the connection's endpoints.

    Raises ``CodecError`` if the bytes are not a valid frame of this version.
    """
    top = _list(_unpack(data, "frame", max_len), "frame", 1, 64)
    version = _int(top[0], "frame version")
    if version != FRAME_VERSION:
        raise CodecError(f"frame version {version} not supported (this node speaks {FRAME_VERSION})")
    if len(top) != 4:
        raise CodecError(f"frame: expected 4 fields, got {len(top)}")
    frame = Frame()
    for item in _list(top[1], "frame messages"):
        gid, routed = _list(item, "routed message", 2, 2)
        parts = _list(routed, "message", 1, 1 + len(_TAIL_DEFAULTS))
        frame.messages.append((_int(gid, "group id"), _message_from_parts(parts[0], to, frm, parts[1:])))
    for hb in _list(top[2], "heartbeats"):
        g, t, c = _list(hb, "heartbeat", 3, 3)
        frame.heartbeats.append((_int(g, "group id"), _int(t, "term"), _int(c, "commit")))
    for hr in _list(top[3], "heartbeat responses"):
        g, t = _list(hr, "heartbeat response", 2, 2)
        frame.heartbeat_resps.append((_int(g, "group id"), _int(t, "term")))
    return frame


# ---------------------------------------------------------------------------
# handshakes and snapshot-stream pieces


@dataclass(slots=True, frozen=True)
class Hello:
    """The handshake each side sends first on a new connection.

    ``kind`` is ``"raft"`` (message frames) or ``"snapshot"`` (a snapshot stream);
    ``to_node`` is the node the dialer expects to reach (0 in the acceptor's reply);
    ``worker`` is the sender's worker index in a node of several workers
    (``docs/workers.md``: worker ``k`` only talks to worker ``k`` of other nodes).
    """

    protocol_version: int
    node_id: int
    cluster_id: int
    kind: str
    to_node: int = 0
    worker: int = 0


def encode_hello(h: Hello) -> bytes:
    """Handshake bytes: ``[MAGIC, protocol_version, node_id, cluster_id, kind, to_node]``,
    plus ``worker`` as a seventh field when it is not 0 (so a node of one worker sends
    the same bytes as before workers existed, and older peers still understand it)."""
    fields: list[Any] = [MAGIC, h.protocol_version, h.node_id, h.cluster_id, h.kind, h.to_node]
    if h.worker:
        fields.append(h.worker)
    return _pack(fields)


def decode_hello(data: bytes) -> Hello:
    """Inverse of ``encode_hello``; ``CodecError`` names what is wrong.

    Only the magic and the version are checked for another protocol version
    (the rest is returned zeroed), so that a peer of a newer version gets a
    "version mismatch" rather than a parse error.
    """
    v = _list(_unpack(data, "handshake", 4096), "handshake", 2, 16)
    if v[0] != MAGIC:
        raise CodecError(f"handshake: bad magic {v[0]!r:.40} (not an accord peer?)")
    version = _int(v[1], "protocol version")
    if version != PROTOCOL_VERSION:
        return Hello(version, 0, 0, "")
    if len(v) not in (6, 7):
        raise CodecError(f"handshake: expected 6 or 7 fields, got {len(v)}")
    kind = v[4]
    if type(kind) is not str:
        raise CodecError("handshake: kind must be a string")
    worker = _int(v[6], "worker") if len(v) == 7 else 0
    return Hello(version, _int(v[2], "node id"), _int(v[3], "cluster id"), kind,
                 _int(v[5], "to node"), worker)


def encode_reject(reason: str) -> bytes:
    """What an acceptor sends before closing a connection it refuses."""
    return _pack(["reject", reason])


def decode_reject(data: bytes) -> str | None:
    """The reason of a rejection, or None if ``data`` is not one."""
    try:
        v = msgpack.unpackb(data, raw=False)
    except Exception:
        return None
    if type(v) is list and len(v) == 2 and v[0] == "reject" and type(v[1]) is str:
        return v[1]
    return None


@dataclass(slots=True, frozen=True)
class SnapshotPiece:
    """One piece of a snapshot stream: ``data`` belongs at byte ``offset``.

    ``done`` marks the last piece (``offset + len(data)`` is the total size). A
    piece with empty ``data`` and ``done`` False is a probe: the sender asks the
    receiver where to (re)start.
    """

    group_id: int
    meta: SnapshotMeta
    offset: int
    data: bytes
    done: bool


def encode_piece(p: SnapshotPiece, crc: int) -> bytes:
    """``[group_id, meta, offset, data, done, crc32c(data)]`` as msgpack."""
    return _pack(
        [p.group_id, snapshot_meta_to_wire(p.meta), p.offset, p.data, p.done, crc])


def decode_piece(data: bytes, max_len: int) -> tuple[SnapshotPiece, int]:
    """Inverse of ``encode_piece``: the piece and the CRC it claims (checked by the caller)."""
    gid, meta, offset, chunk, done, crc = _list(_unpack(data, "snapshot piece", max_len),
                                                "snapshot piece", 6, 6)
    piece = SnapshotPiece(_int(gid, "group id"), snapshot_meta_from_wire(meta),
                          _int(offset, "offset"), _bytes(chunk, "chunk"), _bool(done, "done"))
    return piece, _int(crc, "crc")


def encode_ack(next_offset: int, complete: bool) -> bytes:
    """Receiver's answer to a piece: the next offset it wants, and whether it is finished."""
    return _pack([next_offset, complete])


def decode_ack(data: bytes) -> tuple[int, bool]:
    """Inverse of ``encode_ack``."""
    off, complete = _list(_unpack(data, "snapshot ack", 64), "snapshot ack", 2, 2)
    return _int(off, "ack offset"), _bool(complete, "ack complete")
