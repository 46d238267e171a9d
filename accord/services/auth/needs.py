"""What each request needs: the (key, range end, READ|WRITE) triples etcd checks.

Pure functions of the request, one per API; :class:`~accord.services.auth.guard.AuthGuard`
checks every triple. They follow etcd's auth applier:

* Range: READ on its range. Put: WRITE on its key, and READ too with ``prev_kv``.
  DeleteRange: WRITE on its range, READ too with ``prev_kv``.
* Txn: READ on every compare's key or range, and the needs of *every* request of both
  branches, nested Txns included (etcd checks what a Txn could do, not what it did).
* Watch create: READ on its range. LeaseRevoke: WRITE on every key attached to the lease,
  and a Put with a lease the same (the guard looks the keys up).
* Lock/Campaign: WRITE on the contender key ``name/<lease hex>`` and READ on the
  prefix ``name/`` (the queue); Unlock: WRITE on the key; Proclaim/Resign: READ and WRITE
  on the leader key; Leader/Observe: READ on the prefix ``name/``.
"""

from __future__ import annotations

from collections.abc import Iterator

from accord.proto import rpc_pb2, v3election_pb2, v3lock_pb2
from accord.services.auth.perms import PermType
from accord.services.kv.ranges import prefix_end

Need = tuple[bytes, bytes, PermType]
READ, WRITE = PermType.READ, PermType.WRITE


def range_needs(req: rpc_pb2.RangeRequest) -> Iterator[Need]:
    """Range."""
    yield (req.key, req.range_end, READ)


def put_needs(req: rpc_pb2.PutRequest) -> Iterator[Need]:
    """Put (the lease's keys are the guard's to add)."""
    yield (req.key, b"", WRITE)
    if req.prev_kv:
        yield (req.key, b"", READ)


def delete_needs(req: rpc_pb2.DeleteRangeRequest) -> Iterator[Need]:
    """DeleteRange."""
    yield (req.key, req.range_end, WRITE)
    if req.prev_kv:
        yield (req.key, req.range_end, READ)


def txn_needs(req: rpc_pb2.TxnRequest) -> Iterator[Need]:
    """Txn: compares, then every op of both branches, recursively."""
    for cmp in req.compare:
        yield (cmp.key, cmp.range_end, READ)
    for op in (*req.success, *req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_range":
            yield from range_needs(op.request_range)
        elif kind == "request_put":
            yield from put_needs(op.request_put)
        elif kind == "request_delete_range":
            yield from delete_needs(op.request_delete_range)
        elif kind == "request_txn":
            yield from txn_needs(op.request_txn)


def txn_leases(req: rpc_pb2.TxnRequest) -> Iterator[int]:
    """The leases Puts anywhere in a Txn attach."""
    for op in (*req.success, *req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put" and op.request_put.lease:
            yield op.request_put.lease
        elif kind == "request_txn":
            yield from txn_leases(op.request_txn)


def watch_needs(req: rpc_pb2.WatchCreateRequest) -> Iterator[Need]:
    """Watch create (an empty key is the smallest key, as the watch itself reads it)."""
    yield (req.key or b"\x00", req.range_end, READ)


def _queue(name: bytes) -> bytes:
    return name + b"/"


def contender_needs(name: bytes, lease: int) -> Iterator[Need]:
    """Lock or Campaign on ``name`` with ``lease``."""
    queue = _queue(name)
    yield (queue + f"{lease:x}".encode(), b"", WRITE)
    yield (queue, prefix_end(queue), READ)


def lock_needs(req: v3lock_pb2.LockRequest) -> Iterator[Need]:
    """Lock."""
    yield from contender_needs(req.name, req.lease)


def unlock_needs(req: v3lock_pb2.UnlockRequest) -> Iterator[Need]:
    """Unlock."""
    yield (req.key, b"", WRITE)


def campaign_needs(req: v3election_pb2.CampaignRequest) -> Iterator[Need]:
    """Campaign."""
    yield from contender_needs(req.name, req.lease)


def leader_key_needs(req: v3election_pb2.ProclaimRequest | v3election_pb2.ResignRequest
                     ) -> Iterator[Need]:
    """Proclaim or Resign: the leader key is read (compared) and written."""
    yield (req.leader.key, b"", READ)
    yield (req.leader.key, b"", WRITE)


def leader_needs(req: v3election_pb2.LeaderRequest) -> Iterator[Need]:
    """Leader or Observe."""
    queue = _queue(req.name)
    yield (queue, prefix_end(queue), READ)
