"""What applying a format-3 command (or a lease's grant or revoke on another shard)
answers, as bytes: for a coordinator in another process.

In a node of several workers (``docs/workers.md``) the coordinator of a multi-shard Txn
runs in one worker and some participants' shards in others; it hands each of their
commands to the owner over the forwarding socket (``node/workers.py``), which proposes
it and sends back what its apply returned: a :class:`~xcommands.Prepared`, a
:class:`~xcommands.Committed`, a :class:`~xcommands.Decision` or None. This module
packs them (msgpack; responses as serialized protobuf, errors as their status code
and message) and unpacks them to equal objects; anything else is refused, so a new
answer type cannot travel half-understood.
"""

from __future__ import annotations

from typing import Any

import grpc
import msgpack

from accord.proto import rpc_pb2
from accord.services.kv.errors import EtcdError
from accord.services.kv.xcommands import Committed, Decision, Prepared

_NONE, _PREPARED, _COMMITTED, _DECISION, _LEASE_GRANT, _LEASE_REVOKE = 0, 1, 2, 3, 4, 5
_CODES = {c.value[0]: c for c in grpc.StatusCode}
Answer = (Prepared | Committed | Decision | rpc_pb2.LeaseGrantResponse
          | rpc_pb2.LeaseRevokeResponse | None)
"""What a command committed on another worker's shard answers."""


def _error(e: EtcdError | None) -> list[Any] | None:
    return None if e is None else [e.code.value[0], e.message]


def _unerror(v: Any) -> EtcdError | None:
    if v is None:
        return None
    code, message = v
    return EtcdError(_CODES[int(code)], str(message))


def _decision(d: Decision | None) -> list[Any] | None:
    return None if d is None else [d.state, list(d.path), d.rev]


def _undecision(v: Any) -> Decision | None:
    if v is None:
        return None
    state, path, rev = v
    return Decision(int(state), tuple(bool(p) for p in path), int(rev))


def pack(answer: Answer) -> bytes:
    """``answer`` as bytes (``ValueError`` for anything a format-3 command, or a lease's
    grant or revoke spread to another worker's shard, never answers)."""
    body: list[Any]
    if answer is None:
        body = [_NONE]
    elif isinstance(answer, Prepared):
        body = [_PREPARED, answer.ok, answer.reason, answer.rev,
                [[list(c) for c in row] for row in answer.compares],
                [[o, m] for o, m in sorted(answer.checks.items())], answer.compact_rev,
                _error(answer.error)]
    elif isinstance(answer, Committed):
        response = None if answer.response is None else answer.response.SerializeToString()
        body = [_COMMITTED, response, _decision(answer.decision), _error(answer.error)]
    elif isinstance(answer, Decision):
        body = [_DECISION, answer.state, list(answer.path), answer.rev]
    elif isinstance(answer, rpc_pb2.LeaseGrantResponse):
        body = [_LEASE_GRANT, answer.SerializeToString()]
    elif isinstance(answer, rpc_pb2.LeaseRevokeResponse):
        body = [_LEASE_REVOKE, answer.SerializeToString()]
    else:
        raise ValueError(f"not an answer of a cross-shard command: {type(answer).__name__}")
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def unpack(data: bytes) -> Answer:
    """The answer :func:`pack` packed; malformed bytes raise ``EtcdError`` (INTERNAL)."""
    try:
        body = msgpack.unpackb(data, raw=False)
        kind = body[0]
        if kind == _NONE:
            return None
        if kind == _PREPARED:
            _k, ok, reason, rev, compares, checks, compact_rev, error = body
            return Prepared(bool(ok), str(reason), int(rev),
                            [[(bool(f), bool(s)) for f, s in row] for row in compares],
                            {int(o): str(m) for o, m in checks}, int(compact_rev),
                            _unerror(error))
        if kind == _COMMITTED:
            _k, response, decision, error = body
            return Committed(None if response is None else
                             rpc_pb2.TxnResponse.FromString(response),
                             _undecision(decision), _unerror(error))
        if kind == _DECISION:
            return _undecision(body[1:])
        if kind == _LEASE_GRANT:
            return rpc_pb2.LeaseGrantResponse.FromString(body[1])
        if kind == _LEASE_REVOKE:
            return rpc_pb2.LeaseRevokeResponse.FromString(body[1])
        raise ValueError(f"unknown answer kind {kind!r}")
    except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as e:
        raise EtcdError(grpc.StatusCode.INTERNAL,
                        f"accord: malformed answer of a cross-shard command: {e}") from None
