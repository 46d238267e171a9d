"""The Raft commands of a multi-shard Txn (format 3) and what applying them answers.

``[3, kind, txn_id, ...]``, msgpack, beside formats 1 and 2 (``codec.py``,
``statemachine.py``); see ``docs/txn.md`` for the protocol:

* ``PREPARE``: ``[3, 1, txn_id, rev, record, shard, shards, deadline_ms, now_ms, request]``
  write an intent (and, on the record shard, the PENDING record), reserve ``rev``;
* ``COMMIT``: ``[3, 2, txn_id, path, shard, shards, now_ms]``: on the record shard the
  decision, on every participant its share of the writes at the reserved revision;
* ``ABORT``: ``[3, 3, txn_id, is_record, now_ms]``: on the record shard, abort unless
  committed (a missing record becomes an ABORTED tombstone) and answer the decision; on
  a participant, drop the intent;
* ``RESERVE``: ``[3, 4, txn_id, rev]``: move a prepared intent's reserved revision up to
  ``rev`` (when the participants reserved different ones);
* ``LEASE``: ``[3, 5, txn_id, lease_id, rev, shard, deadline_ms, now_ms, term, expire]``:
  the prepare of a lease revoke (``expire``: an expiry) over every shard, record on shard
  0: an intent holding the lease's keys on this shard *and the lease id* (a Put attaching
  a key to it waits), reserving ``rev``; then ``COMMIT`` (path ``[]``) deletes those keys
  at that revision and forgets the lease, ``ABORT`` drops the intent (``xlease.py``);
* ``DECIDE``: ``[3, 6, txn_id, path, shard, shards, now_ms, rev]``: ``COMMIT`` on a
  participant other than the record shard at ``rev``, the revision the record shard's
  ``PREPARE_DECIDE`` took (ordered stamps only, :data:`XDECIDE_GATE`): at or above the
  one it reserved, in the record shard's stripe, which no other shard writes
  (``docs/txn.md``);
* ``PREPARE_DECIDE``: ``[3, 7, txn_id, stamp, record, shards, deadline_ms, now_ms,
  request, want, compares, checks, compact_rev]``: the record shard's prepare and
  decision in one entry, once every other participant prepared (ordered stamps only,
  :data:`XDECIDE_GATE`): refused on a conflict like a ``PREPARE``, else its own compares
  and put checks joined with the others' (``compares``: theirs folded into one,
  ``checks``: ``[[op, message], ...]``, ``compact_rev``: their highest), the branch taken,
  etcd's checks along it, and if they pass the record COMMITTED at the lowest revision of
  its stripe >= ``want`` (the others' highest reserved) and above its own, with its
  share of the writes there; no intent on the record shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

from accord.proto import rpc_pb2
from accord.services.kv import errors

XFORMAT = 3
XTXN_GATE = 4
"""The command format a member advertises (the cluster-version gate,
``ClusterStateMachine.min_command_format``) once it applies format-3 commands; a Txn over
several shards is refused, as before, until every member does."""
XLEASE_GATE = 6
"""The format a member advertises once it applies the ``LEASE`` command (a lease revoke
at one revision across shards); until every member does, a revoke takes the older path
(shard 0 first, then each other shard at its own revision)."""
XDECIDE_GATE = 7
"""The format a member advertises once it applies ``PREPARE_DECIDE`` and ``DECIDE``; until
every member does, a multi-shard Txn with ordered stamps prepares every participant, agrees
on its revision through ``RESERVE`` rounds and decides with ``COMMIT``."""


class XKind(IntEnum):
    """What a format-3 command does."""

    PREPARE = 1
    COMMIT = 2
    ABORT = 3
    RESERVE = 4
    LEASE = 5
    DECIDE = 6
    PREPARE_DECIDE = 7


def _pack(body: list[Any]) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def encode_prepare(
    txn_id: int, rev: int, record: int, shard: int, shards: int, deadline_ms: int,
    now_ms: int, request: bytes,
) -> bytes:
    """A PREPARE of ``request`` (a serialized TxnRequest) on ``shard``."""
    return _pack([XFORMAT, XKind.PREPARE.value, txn_id, rev, record, shard, shards,
                  deadline_ms, now_ms, request])


def encode_commit(txn_id: int, path: list[bool], shard: int, shards: int, now_ms: int) -> bytes:
    """A COMMIT of the branch ``path`` on ``shard``."""
    return _pack([XFORMAT, XKind.COMMIT.value, txn_id, list(path), shard, shards, now_ms])


def encode_decide(txn_id: int, path: list[bool], shard: int, shards: int, now_ms: int,
                  rev: int) -> bytes:
    """A DECIDE of the branch ``path`` on ``shard``: on the record shard the decision at a
    revision >= ``rev`` of its stripe, elsewhere the commit at the decided ``rev``."""
    return _pack([XFORMAT, XKind.DECIDE.value, txn_id, list(path), shard, shards, now_ms,
                  rev])


def encode_prepare_decide(
    txn_id: int, stamp: int, record: int, shards: int, deadline_ms: int, now_ms: int,
    request: bytes, want: int, compares: list[list[tuple[bool, bool]]],
    checks: dict[int, str], compact_rev: int,
) -> bytes:
    """The record shard's PREPARE_DECIDE of ``request`` after the others prepared."""
    return _pack([XFORMAT, XKind.PREPARE_DECIDE.value, txn_id, stamp, record, shards,
                  deadline_ms, now_ms, request, want,
                  [[list(c) for c in row] for row in compares],
                  [[o, m] for o, m in sorted(checks.items())], compact_rev])


def encode_abort(txn_id: int, is_record: bool, now_ms: int) -> bytes:
    """An ABORT (on the record shard: unless committed; elsewhere: drop the intent)."""
    return _pack([XFORMAT, XKind.ABORT.value, txn_id, bool(is_record), now_ms])


def encode_reserve(txn_id: int, rev: int) -> bytes:
    """A RESERVE of ``rev`` for ``txn_id``'s intent."""
    return _pack([XFORMAT, XKind.RESERVE.value, txn_id, rev])


def encode_lease(
    txn_id: int, lease_id: int, rev: int, shard: int, deadline_ms: int, now_ms: int,
    term: int, expire: bool,
) -> bytes:
    """The prepare of revoking (``expire``: expiring) ``lease_id``, on ``shard``."""
    return _pack([XFORMAT, XKind.LEASE.value, txn_id, lease_id, rev, shard, deadline_ms,
                  now_ms, term, bool(expire)])


def is_cross_shard(command: bytes) -> bool:
    """Whether ``command`` is a format-3 command (a msgpack array whose first element is
    :data:`XFORMAT`), without decoding it."""
    return len(command) > 1 and command[1] == XFORMAT


_SIZES: dict[int, int] = {XKind.PREPARE: 10, XKind.COMMIT: 7, XKind.ABORT: 5, XKind.RESERVE: 4,
                         XKind.LEASE: 10, XKind.DECIDE: 8, XKind.PREPARE_DECIDE: 13}
"""Fields of each kind of format-3 command, the format number included."""


def decode(command: bytes) -> tuple[Any, ...]:
    """The fields of a format-3 command after the format number; bad input raises."""
    try:
        body = msgpack.unpackb(command, raw=False, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise errors.bad_request(f"malformed KV command: {exc}") from exc
    if type(body) is not tuple or len(body) < 3 or body[0] != XFORMAT:
        raise errors.bad_request("malformed KV command: not a format-3 command")
    kind = body[1]
    if type(kind) is not int or len(body) != _SIZES.get(kind):
        raise errors.bad_request(f"malformed KV command: bad cross-shard command {kind!r:.40}")
    return body[1:]


@dataclass(slots=True)
class Prepared:
    """What a PREPARE or a RESERVE answers: ``ok``, or why not (``conflict``: another
    Txn's intent, ``decided``: the record was decided before this prepare, ``again``: a
    second prepare of one Txn, ``behind``: a RESERVE below this shard's revision, ``gone``:
    a RESERVE of an intent no longer here)."""

    ok: bool
    reason: str = ""
    rev: int = 0
    """The revision reserved here (after a refused RESERVE: the lowest it could take)."""
    compares: list[list[tuple[bool, bool]]] = field(default_factory=list)
    checks: dict[int, str] = field(default_factory=dict)
    compact_rev: int = -1
    """The shard's first revision (``KVStateMachine.first_revision``: -1 if never
    compacted), for etcd's check of a range's revision along the branch taken."""
    error: errors.EtcdError | None = None
    """A refused PREPARE_DECIDE (``reason`` ``invalid``): etcd's error along the taken
    branch, for the client."""


@dataclass(slots=True)
class Decision:
    """The record's state after a COMMIT or an ABORT on the record shard."""

    state: int
    path: tuple[bool, ...] = ()
    rev: int = 0
    """The revision the record shard decided (a ``PREPARE_DECIDE``: the others commit
    there with ``DECIDE``); 0: every participant commits at the revision it reserved (a
    ``COMMIT`` after ``RESERVE`` agreement)."""


@dataclass(slots=True)
class Committed:
    """A participant's share of a committed Txn (``response`` None: resolved before)."""

    response: rpc_pb2.TxnResponse | None
    decision: Decision | None = None
    error: errors.EtcdError | None = None
    """A range of the share that could not be answered (``xtxn.run_share``): the
    coordinator's answer to the client, although the Txn is committed."""
