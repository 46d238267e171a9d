"""A multi-shard Txn's request, parsed and walked once per member, not once per use.

Every member applies each command of a two-shard Txn on its replica of each shard: the
prepare on one participant, the prepare-and-decide on the record shard, the decision on
the first participant again. Each of them carries (or finds in its intent) the same
request bytes, and each used to parse them into a ``TxnRequest`` and walk its tree for the
same things: which key ranges a shard holds, which puts are its own, which leases they
use, the compares of every node. All of that is a pure function of the bytes (and of the
shard), so a :class:`TxnPlan` computes it once and :func:`plan_of` keeps the plans of the
requests seen last, keyed by their bytes. The state-dependent work (reading the store,
writing, answering) stays in ``xtxn.py`` and ``statemachine.py``.

A plan is shared by every use of the same bytes: nothing may change its ``req`` (no
caller does: requests are only read while a Txn is applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from accord.proto import rpc_pb2
from accord.services.kv import errors, sharding, xtxn
from accord.services.kv.mvcc import MVCCStore
from accord.services.kv.ops import Executor
from accord.services.kv.ranges import KeyRange

PLAN_CACHE_SIZE = 1024
"""Plans kept (the requests of the multi-shard Txns applied last on this member)."""
PLAN_CACHE_MAX_BYTES = 16 * 1024
"""A request larger than this is parsed for each use and not kept (the cache then holds
at most ``PLAN_CACHE_SIZE`` x this many bytes of requests)."""


class Share:
    """What one shard holds of a Txn: its key ranges (the intent's), its own puts (op
    number and request) and the leases they use."""

    __slots__ = ("leases", "puts", "ranges", "shard", "shards")

    def __init__(self, plan: TxnPlan, shard: int, shards: int) -> None:
        self.shard = shard
        self.shards = shards
        held: dict[tuple[bytes, bytes], None] = {}  # in order, once each
        for pair in plan.ranges:
            if pair not in held and shard in sharding.shards_of_range(pair[0], pair[1], shards):
                held[pair] = None
        self.ranges = tuple(KeyRange.of(key, end) for key, end in held)
        self.puts = tuple((o, p) for o, p in plan.puts
                          if sharding.shard_of(p.key, shards) == shard)
        self.leases = frozenset(p.lease for _o, p in self.puts if p.lease)

    def owns(self, key: bytes) -> bool:
        """Whether ``key`` is on this shard."""
        return sharding.shard_of(key, self.shards) == self.shard


class TxnPlan:
    """A Txn request parsed, with what every participant derives from the request alone
    (``xtxn.py``'s fixed order: a node's compares, its success ops, its failure ops,
    nested Txns depth first)."""

    __slots__ = ("_shares", "compares", "nodes", "puts", "ranges", "req")

    def __init__(self, req: rpc_pb2.TxnRequest) -> None:
        self.req = req
        self.nodes = xtxn.nodes(req)
        self.ranges = tuple(xtxn.all_ranges(req))
        """``(key, range_end)`` of every compare and op of the tree."""
        self.compares = tuple(
            tuple((KeyRange.of(c.key, c.range_end), c) for c in node.compare)
            for node in self.nodes)
        """Per node, per compare: its key range and the compare."""
        self.puts = tuple((o, op.request_put) for o, op in enumerate(xtxn.ops(req))
                          if op.WhichOneof("request") == "request_put")
        """``(op number, put)`` of every put of the tree (all branches)."""
        self._shares: dict[tuple[int, int], Share] = {}

    def share(self, shard: int, shards: int) -> Share:
        """What ``shard`` (of ``shards``) holds of this Txn (computed once)."""
        got = self._shares.get((shard, shards))
        if got is None:
            got = self._shares[(shard, shards)] = Share(self, shard, shards)
        return got

    def partial_compares(self, store: MVCCStore, rev: int) -> list[list[tuple[bool, bool]]]:
        """``xtxn.partial_compares`` of this Txn over ``store`` at ``rev``."""
        return xtxn.compare_rows(store, self.compares, rev)

    def path(self, parts: Sequence[Sequence[Sequence[tuple[bool, bool]]]]) -> list[bool]:
        """The branch path from every participant's partial compares
        (``xtxn.path_of(req, xtxn.combine(req, parts))``)."""
        return xtxn.path_of(self.req, xtxn.combine_nodes(self.nodes, parts))

    @staticmethod
    def put_checks(ex: Executor, share: Share) -> dict[int, str]:
        """``xtxn.put_checks`` of the puts ``share`` holds."""
        return xtxn.check_puts(ex, share.puts)


def _parse(request: bytes) -> TxnPlan:
    req = rpc_pb2.TxnRequest()
    try:
        req.ParseFromString(request)
    except Exception as exc:  # protobuf raises DecodeError (a plain Exception subclass)
        raise errors.bad_request(f"malformed TxnRequest: {exc}") from exc
    return TxnPlan(req)


_cached = lru_cache(maxsize=PLAN_CACHE_SIZE)(_parse)


def plan_of(request: bytes) -> TxnPlan:
    """The plan of a serialized ``TxnRequest`` (kept for the next use of the same bytes
    unless it is large); a malformed one is etcd's bad request."""
    if len(request) > PLAN_CACHE_MAX_BYTES:
        return _parse(request)
    return _cached(request)
