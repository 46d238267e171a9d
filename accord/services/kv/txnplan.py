"""A multi-shard Txn request read once: its tree walked into the tuples the protocol uses.

Every member applies every entry of a multi-shard Txn on each shard it touches (a
``PREPARE`` and a ``DECIDE`` on one, a ``PREPARE_DECIDE`` on the other: ``docs/txn.md``),
and each of them needs the same facts about the request: its compares, node by node,
its operations in the fixed order (``xtxn.py``), the key ranges it names, which of its
puts and leases a shard holds. Parsing the request and walking its protobuf tree for
each of those (every field read from a protobuf message costs a lookup and an
allocation) was a third of a member's time under cross-shard load. A :class:`TxnPlan`
does the walk once; :func:`plan_of` keeps the plans of recent requests by their bytes, so
the three entries of one Txn on one member share one.

A plan is a pure function of the request's bytes, so sharing it is deterministic; it is
read-only: nothing may change its request message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from accord.proto import rpc_pb2
from accord.services.kv import errors, sharding
from accord.services.kv.ranges import KeyRange

CACHE_ENTRIES = 512
"""Plans :func:`plan_of` keeps (the oldest goes first): a few per Txn in flight."""
CACHE_MAX_REQUEST = 8 << 10
"""Requests above this many bytes are parsed every time, not kept: the cache stays
within a few MiB whatever the Txns carry."""


@dataclass(frozen=True, slots=True)
class ShardPart:
    """What one shard holds of a Txn (all branches)."""

    ranges: tuple[KeyRange, ...]
    """The key ranges it may hold, in order, once each: its intent's ranges."""
    leases: frozenset[int]
    """The leases of the puts of keys it holds."""


class TxnPlan:
    """One TxnRequest, walked once (see the module docstring)."""

    __slots__ = ("_participants", "_parts", "compares", "flat", "kinds", "ops", "puts",
                 "ranges", "req")

    def __init__(self, req: rpc_pb2.TxnRequest) -> None:
        self.req = req
        compares: list[tuple[tuple[bytes, bytes, rpc_pb2.Compare], ...]] = []
        by_node: list[list[tuple[bytes, bytes]]] = []
        flat_ops: list[rpc_pb2.RequestOp] = []
        kinds: list[str] = []
        puts: list[tuple[int, bytes, int, bool]] = []
        _visit(req, compares, by_node, flat_ops, kinds, puts)
        self.compares = tuple(compares)
        """Per node of the tree in the fixed order (:func:`nodes`), its compares as
        ``(key, range_end, compare)``."""
        self.ops = tuple(flat_ops)
        """Every non-Txn op of the tree in the fixed order: the op numbers (:func:`ops`)."""
        self.kinds = tuple(kinds)
        """Per op number, which request it holds (``request_put``, ...; empty if none)."""
        self.ranges = tuple(pair for node in by_node for pair in node)
        """:func:`all_ranges`."""
        self.puts = tuple(puts)
        """Every put as ``(op number, key, lease, ignore_value or ignore_lease)``."""
        self.flat = len(compares) == 1
        """No nested Txn: the path is one decision, the op numbers run through success,
        then failure."""
        self._parts: dict[tuple[int, int], ShardPart] = {}
        self._participants: dict[int, tuple[int, ...]] = {}

    def participants(self, shards: int) -> tuple[int, ...]:
        """The shards (of ``shards``) this Txn touches, in order."""
        found = self._participants.get(shards)
        if found is None:
            found = self._participants[shards] = tuple(sorted({
                s for key, end in dict.fromkeys(self.ranges)
                for s in sharding.shards_of_range(key, end, shards)}))
        return found

    def part(self, shard: int, shards: int) -> ShardPart:
        """What ``shard`` (of ``shards``) holds of this Txn."""
        found = self._parts.get((shard, shards))
        if found is None:
            held = [pair for pair in dict.fromkeys(self.ranges)
                    if shard in sharding.shards_of_range(pair[0], pair[1], shards)]
            leases = frozenset(lease for _o, key, lease, _i in self.puts
                               if lease and sharding.shard_of(key, shards) == shard)
            found = self._parts[(shard, shards)] = ShardPart(
                tuple(KeyRange.of(k, e) for k, e in held), leases)
        return found

    def taken(self, path: Sequence[bool]) -> list[tuple[int, rpc_pb2.RequestOp]]:
        """``(op number, op)`` of the ops ``path`` runs, in execution order."""
        if self.flat:
            n = len(self.req.success)
            if path[0]:
                return list(enumerate(self.ops[:n]))
            return list(enumerate(self.ops[n:], n))
        out: list[tuple[int, rpc_pb2.RequestOp]] = []
        _taken(self.req, path, [0], 0, out)
        return out


def _visit(req: rpc_pb2.TxnRequest,
           compares: list[tuple[tuple[bytes, bytes, rpc_pb2.Compare], ...]],
           by_node: list[list[tuple[bytes, bytes]]], flat_ops: list[rpc_pb2.RequestOp],
           kinds: list[str], puts: list[tuple[int, bytes, int, bool]]) -> None:
    """One pass over the tree for :class:`TxnPlan`: each node's compares in the fixed
    order of nodes, ops in op order, and each node's ranges (its compares, then its own
    ops) kept apart, since a nested node's come after all of its parent's."""
    row = tuple((c.key, c.range_end, c) for c in req.compare)
    compares.append(row)
    own = [(key, end) for key, end, _c in row]
    by_node.append(own)
    for branch in (req.success, req.failure):
        for op in branch:
            which = op.WhichOneof("request")
            if which == "request_txn":
                _visit(op.request_txn, compares, by_node, flat_ops, kinds, puts)
                continue
            pair = sharding.op_range(op, which)
            if pair is not None:
                own.append(pair)
            if which == "request_put":
                p = op.request_put
                puts.append((len(flat_ops), p.key, p.lease, p.ignore_value or p.ignore_lease))
            flat_ops.append(op)
            kinds.append(which or "")


def nodes(req: rpc_pb2.TxnRequest) -> list[rpc_pb2.TxnRequest]:
    """Every Txn node of the tree (``req`` first), in the fixed order: a node, then the
    nested Txns of its success ops, then those of its failure ops, depth first."""
    out = [req]
    for branch in (req.success, req.failure):
        for op in branch:
            if op.WhichOneof("request") == "request_txn":
                out.extend(nodes(op.request_txn))
    return out


def ops(req: rpc_pb2.TxnRequest) -> list[tuple[rpc_pb2.RequestOp, str]]:
    """Every non-Txn op of the tree in the fixed order (the op numbers), with the request
    it holds (``request_put``, ...; empty if none)."""
    out: list[tuple[rpc_pb2.RequestOp, str]] = []
    for branch in (req.success, req.failure):
        for op in branch:
            which = op.WhichOneof("request")
            if which == "request_txn":
                out.extend(ops(op.request_txn))
            else:
                out.append((op, which or ""))
    return out


def all_ranges(req: rpc_pb2.TxnRequest) -> list[tuple[bytes, bytes]]:
    """``(key, range_end)`` of every compare and op of the tree (all branches), node by
    node in the fixed order: a node's compares, then its own ops."""
    pairs: list[tuple[bytes, bytes]] = []
    for node in nodes(req):
        pairs.extend((c.key, c.range_end) for c in node.compare)
        for op in (*node.success, *node.failure):
            pair = sharding.op_range(op, op.WhichOneof("request"))
            if pair is not None:
                pairs.append(pair)
    return pairs


def _taken(req: rpc_pb2.TxnRequest, path: Sequence[bool], p: list[int],
           o: int, out: list[tuple[int, rpc_pb2.RequestOp]]) -> int:
    ok = path[p[0]]
    p[0] += 1
    for branch, taken in ((req.success, ok), (req.failure, not ok)):
        for op in branch:
            nested = op.WhichOneof("request") == "request_txn"
            if not taken:
                o += len(ops(op.request_txn)) if nested else 1
            elif nested:
                o = _taken(op.request_txn, path, p, o, out)
            else:
                out.append((o, op))
                o += 1
    return o


_cache: dict[bytes, TxnPlan] = {}


def plan_of(request: bytes) -> TxnPlan:
    """The plan of a serialized TxnRequest (kept for the next entry of the same Txn);
    a request that does not parse raises etcd's invalid-argument error."""
    found = _cache.get(request)
    if found is not None:
        return found
    try:
        plan = TxnPlan(rpc_pb2.TxnRequest.FromString(request))
    except DecodeError as exc:
        raise errors.bad_request(f"malformed TxnRequest: {exc}") from exc
    if len(request) <= CACHE_MAX_REQUEST:
        if len(_cache) >= CACHE_ENTRIES:
            del _cache[next(iter(_cache))]
        _cache[request] = plan
    return plan
