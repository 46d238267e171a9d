"""The KV surface's typed pieces: results, range options, and the transaction builder.

Requests are built here from plain arguments and answers turned into frozen
dataclasses (:class:`KeyValue`, :class:`RangeResult`, :class:`PutResult`,
:class:`DeleteResult`, :class:`TxnResult`), so callers never touch protobuf. The
transaction builder follows the Go client's ``Txn().If().Then().Else().Commit()``::

    from accord.client import Compare, Op

    result = await (client.txn()
                    .if_(Compare.value("cfg/leader") == "n1", Compare.version("cfg/epoch") > 0)
                    .then(Op.put("cfg/epoch", "8"), Op.get("cfg/epoch"))
                    .else_(Op.get("cfg/leader"))
                    .commit())

Compares are written with Python's operators on a target (``value``, ``version``,
``mod``, ``create``, ``lease`` of a key, or of every key of a prefix with
``prefix=True``); ``==``, ``!=``, ``<`` and ``>`` are the four etcd offers. The builder
enforces etcd's shape: ``if_`` before ``then``, ``then`` before ``else_``, each once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, Union

from accord.locks.keys import prefix_end
from accord.proto import kv_pb2, rpc_pb2

R = TypeVar("R")

Data = bytes | str
"""Keys and values: ``str`` is sent as UTF-8."""


def to_bytes(x: Data) -> bytes:
    """``x`` as bytes (``str`` encoded as UTF-8)."""
    return x.encode() if isinstance(x, str) else bytes(x)


def key_range(key: Data, range_end: Data | None = None, *, prefix: bool = False,
              from_key: bool = False) -> tuple[bytes, bytes]:
    """``(key, range_end)`` on the wire for a key, a prefix, ``[key, range_end)`` or
    every key from ``key`` on; at most one of ``range_end``, ``prefix``, ``from_key``."""
    k = to_bytes(key)
    given = sum((range_end is not None, prefix, from_key))
    if given > 1:
        raise ValueError("give at most one of range_end, prefix=True and from_key=True")
    if prefix:
        return k, (prefix_end(k) if k else b"\0")
    if from_key:
        return k or b"\0", b"\0"
    return k, to_bytes(range_end) if range_end is not None else b""


# --- results ---------------------------------------------------------------------------


class EventType(enum.Enum):
    """What a watch event did to its key."""

    PUT = 0
    DELETE = 1


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key's value and its MVCC facts (etcd's ``mvccpb.KeyValue``)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_pb(cls, kv: kv_pb2.KeyValue) -> KeyValue:
        """From the wire message."""
        return cls(bytes(kv.key), bytes(kv.value), int(kv.create_revision),
                   int(kv.mod_revision), int(kv.version), int(kv.lease))


def _opt_kv(kv: kv_pb2.KeyValue, present: bool) -> KeyValue | None:
    return KeyValue.from_pb(kv) if present else None


@dataclass(frozen=True, slots=True)
class RangeResult:
    """A range's keys (at most ``limit``), whether more exist, and their total count."""

    kvs: tuple[KeyValue, ...]
    more: bool
    count: int
    revision: int
    """The store's revision the range was read at."""

    @classmethod
    def from_pb(cls, r: rpc_pb2.RangeResponse) -> RangeResult:
        """From the wire message."""
        return cls(tuple(KeyValue.from_pb(kv) for kv in r.kvs), bool(r.more), int(r.count),
                   int(r.header.revision))


@dataclass(frozen=True, slots=True)
class PutResult:
    """A put's revision and, when asked for, the key's previous value."""

    revision: int
    prev_kv: KeyValue | None

    @classmethod
    def from_pb(cls, r: rpc_pb2.PutResponse) -> PutResult:
        """From the wire message."""
        return cls(int(r.header.revision), _opt_kv(r.prev_kv, r.HasField("prev_kv")))


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """How many keys a delete removed, its revision and (when asked for) their values."""

    revision: int
    deleted: int
    prev_kvs: tuple[KeyValue, ...]

    @classmethod
    def from_pb(cls, r: rpc_pb2.DeleteRangeResponse) -> DeleteResult:
        """From the wire message."""
        return cls(int(r.header.revision), int(r.deleted),
                   tuple(KeyValue.from_pb(kv) for kv in r.prev_kvs))


OpResult = Union[RangeResult, PutResult, DeleteResult, "TxnResult"]
"""The result of one op of a transaction branch."""


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Whether the compares held, the revision after the txn, and each op's result."""

    succeeded: bool
    revision: int
    responses: tuple[OpResult, ...]

    @classmethod
    def from_pb(cls, r: rpc_pb2.TxnResponse) -> TxnResult:
        """From the wire message (nested txns included)."""
        out: list[OpResult] = []
        for op in r.responses:
            which = op.WhichOneof("response")
            if which == "response_range":
                out.append(RangeResult.from_pb(op.response_range))
            elif which == "response_put":
                out.append(PutResult.from_pb(op.response_put))
            elif which == "response_delete_range":
                out.append(DeleteResult.from_pb(op.response_delete_range))
            else:
                out.append(TxnResult.from_pb(op.response_txn))
        return cls(bool(r.succeeded), int(r.header.revision), tuple(out))


@dataclass(frozen=True, slots=True)
class CompactResult:
    """The revision of the store when it was compacted."""

    revision: int


# --- range options ---------------------------------------------------------------------


class SortOrder(enum.Enum):
    """Order of a range's keys (``NONE``: key order, etcd's default)."""

    NONE = rpc_pb2.RangeRequest.NONE
    ASCEND = rpc_pb2.RangeRequest.ASCEND
    DESCEND = rpc_pb2.RangeRequest.DESCEND


class SortTarget(enum.Enum):
    """What a sorted range sorts by."""

    KEY = rpc_pb2.RangeRequest.KEY
    VERSION = rpc_pb2.RangeRequest.VERSION
    CREATE = rpc_pb2.RangeRequest.CREATE
    MOD = rpc_pb2.RangeRequest.MOD
    VALUE = rpc_pb2.RangeRequest.VALUE


def range_request(
    key: Data, range_end: Data | None = None, *, prefix: bool = False, from_key: bool = False,
    limit: int = 0, revision: int = 0, sort_order: SortOrder = SortOrder.NONE,
    sort_target: SortTarget = SortTarget.KEY, serializable: bool = False,
    keys_only: bool = False, count_only: bool = False, min_mod_revision: int = 0,
    max_mod_revision: int = 0, min_create_revision: int = 0, max_create_revision: int = 0,
) -> rpc_pb2.RangeRequest:
    """A RangeRequest with every etcd option (``limit`` 0: all; ``revision`` 0: latest)."""
    if limit < 0 or revision < 0:
        raise ValueError(f"limit and revision must be >= 0, got limit={limit} revision={revision}")
    k, end = key_range(key, range_end, prefix=prefix, from_key=from_key)
    return rpc_pb2.RangeRequest(
        key=k, range_end=end, limit=limit, revision=revision,
        sort_order=sort_order.value, sort_target=sort_target.value,
        serializable=serializable, keys_only=keys_only, count_only=count_only,
        min_mod_revision=min_mod_revision, max_mod_revision=max_mod_revision,
        min_create_revision=min_create_revision, max_create_revision=max_create_revision,
    )


def put_request(key: Data, value: Data, *, lease: int = 0, prev_kv: bool = False,
                ignore_value: bool = False, ignore_lease: bool = False) -> rpc_pb2.PutRequest:
    """A PutRequest (``ignore_value``/``ignore_lease`` keep the key's current ones)."""
    if ignore_value and value not in (b"", ""):
        raise ValueError("ignore_value=True keeps the current value: pass an empty value")
    if ignore_lease and lease:
        raise ValueError("ignore_lease=True keeps the current lease: pass no lease")
    return rpc_pb2.PutRequest(key=to_bytes(key), value=to_bytes(value), lease=lease,
                              prev_kv=prev_kv, ignore_value=ignore_value,
                              ignore_lease=ignore_lease)


def delete_request(key: Data, range_end: Data | None = None, *, prefix: bool = False,
                   from_key: bool = False, prev_kv: bool = False) -> rpc_pb2.DeleteRangeRequest:
    """A DeleteRangeRequest for a key, a prefix or a range."""
    k, end = key_range(key, range_end, prefix=prefix, from_key=from_key)
    return rpc_pb2.DeleteRangeRequest(key=k, range_end=end, prev_kv=prev_kv)


# --- transactions ----------------------------------------------------------------------


_C = rpc_pb2.Compare


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction; build it as ``Compare.value(key) == x``."""

    pb: rpc_pb2.Compare

    @staticmethod
    def value(key: Data, *, prefix: bool = False) -> CompareTarget[Data]:
        """The key's value (compared as bytes)."""
        return CompareTarget(key, _C.VALUE, "value", prefix)

    @staticmethod
    def version(key: Data, *, prefix: bool = False) -> CompareTarget[int]:
        """The key's version (0: the key does not exist)."""
        return CompareTarget(key, _C.VERSION, "version", prefix)

    @staticmethod
    def mod(key: Data, *, prefix: bool = False) -> CompareTarget[int]:
        """The key's mod revision."""
        return CompareTarget(key, _C.MOD, "mod_revision", prefix)

    @staticmethod
    def create(key: Data, *, prefix: bool = False) -> CompareTarget[int]:
        """The key's create revision (0: the key does not exist)."""
        return CompareTarget(key, _C.CREATE, "create_revision", prefix)

    @staticmethod
    def lease(key: Data, *, prefix: bool = False) -> CompareTarget[int]:
        """The key's lease id (0: none)."""
        return CompareTarget(key, _C.LEASE, "lease", prefix)


T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)
class CompareTarget(Generic[T]):
    """A key's field waiting for its operator (``==``, ``!=``, ``<``, ``>``)."""

    key: Data
    target: int
    field_name: str
    prefix: bool = False

    def _cmp(self, result: int, other: T) -> Compare:
        k, end = key_range(self.key, prefix=self.prefix)
        c = rpc_pb2.Compare(result=result, target=self.target, key=k,  # type: ignore[arg-type]
                            range_end=end)
        if self.target == _C.VALUE:
            if not isinstance(other, bytes | str):
                raise TypeError(f"a value compares with bytes or str, not {type(other).__name__}")
            c.value = to_bytes(other)
        else:
            if not isinstance(other, int) or isinstance(other, bool):
                raise TypeError(f"{self.field_name} compares with an int, not "
                                f"{type(other).__name__}")
            setattr(c, self.field_name, other)
        return Compare(c)

    def __eq__(self, other: T) -> Compare:  # type: ignore[override]
        return self._cmp(_C.EQUAL, other)

    def __ne__(self, other: T) -> Compare:  # type: ignore[override]
        return self._cmp(_C.NOT_EQUAL, other)

    def __lt__(self, other: T) -> Compare:
        return self._cmp(_C.LESS, other)

    def __gt__(self, other: T) -> Compare:
        return self._cmp(_C.GREATER, other)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a transaction branch: ``Op.get``, ``Op.put``, ``Op.delete``, ``Op.txn``."""

    pb: rpc_pb2.RequestOp

    @staticmethod
    def get(key: Data, range_end: Data | None = None, *, prefix: bool = False,
            from_key: bool = False, limit: int = 0, revision: int = 0,
            sort_order: SortOrder = SortOrder.NONE, sort_target: SortTarget = SortTarget.KEY,
            keys_only: bool = False, count_only: bool = False) -> Op:
        """A range inside the txn (always at the txn's revision, so never serializable)."""
        return Op(rpc_pb2.RequestOp(request_range=range_request(
            key, range_end, prefix=prefix, from_key=from_key, limit=limit, revision=revision,
            sort_order=sort_order, sort_target=sort_target, keys_only=keys_only,
            count_only=count_only)))

    @staticmethod
    def put(key: Data, value: Data, *, lease: int = 0, prev_kv: bool = False,
            ignore_value: bool = False, ignore_lease: bool = False) -> Op:
        """A put inside the txn."""
        return Op(rpc_pb2.RequestOp(request_put=put_request(
            key, value, lease=lease, prev_kv=prev_kv, ignore_value=ignore_value,
            ignore_lease=ignore_lease)))

    @staticmethod
    def delete(key: Data, range_end: Data | None = None, *, prefix: bool = False,
               from_key: bool = False, prev_kv: bool = False) -> Op:
        """A delete inside the txn."""
        return Op(rpc_pb2.RequestOp(request_delete_range=delete_request(
            key, range_end, prefix=prefix, from_key=from_key, prev_kv=prev_kv)))

    @staticmethod
    def txn(compares: Sequence[Compare], success: Sequence[Op] = (),
            failure: Sequence[Op] = ()) -> Op:
        """A nested txn."""
        return Op(rpc_pb2.RequestOp(request_txn=rpc_pb2.TxnRequest(
            compare=[c.pb for c in compares], success=[o.pb for o in success],
            failure=[o.pb for o in failure])))


@dataclass(slots=True)
class TxnBuilder:
    """Collects ``if_``/``then``/``else_`` into a TxnRequest, in etcd's order."""

    _compares: list[Compare] = field(default_factory=list)
    _success: list[Op] = field(default_factory=list)
    _failure: list[Op] = field(default_factory=list)
    _stage: int = 0
    """0: nothing yet; 1: after if_; 2: after then; 3: after else_."""

    def _advance(self, to: int, name: str) -> None:
        if self._stage >= to:
            order = "if_(...).then(...).else_(...)"
            raise ValueError(f"txn: {name}() called after a later step or twice; the order "
                             f"is {order}, each at most once")
        self._stage = to

    def if_(self, *compares: Compare) -> TxnBuilder:
        """The conditions, all of which must hold for ``then`` to run."""
        self._advance(1, "if_")
        for c in compares:
            if not isinstance(c, Compare):
                raise TypeError(f"if_ takes Compare conditions (Compare.value(k) == v), "
                                f"not {type(c).__name__}")
        self._compares.extend(compares)
        return self

    def then(self, *ops: Op) -> TxnBuilder:
        """What runs when every condition holds."""
        self._advance(2, "then")
        self._success.extend(_ops(ops))
        return self

    def else_(self, *ops: Op) -> TxnBuilder:
        """What runs otherwise."""
        self._advance(3, "else_")
        self._failure.extend(_ops(ops))
        return self

    def request(self) -> rpc_pb2.TxnRequest:
        """The TxnRequest built so far."""
        return rpc_pb2.TxnRequest(compare=[c.pb for c in self._compares],
                                  success=[o.pb for o in self._success],
                                  failure=[o.pb for o in self._failure])


def _ops(ops: Sequence[Op]) -> Sequence[Op]:
    for o in ops:
        if not isinstance(o, Op):
            raise TypeError(f"txn branches take Op.get/put/delete/txn, not {type(o).__name__}")
    return ops


class Txn(TxnBuilder, Generic[R]):
    """A transaction builder bound to a client; ``commit()`` sends it.

    ``R`` is what the client's send returns: an awaitable :class:`TxnResult` for
    :class:`~accord.client.AccordClient`, a :class:`TxnResult` for the sync twin."""

    __slots__ = ("_send",)

    def __init__(self, send: Callable[[rpc_pb2.TxnRequest], R]) -> None:
        TxnBuilder.__init__(self)
        self._send = send

    def if_(self, *compares: Compare) -> Txn[R]:
        """See :meth:`TxnBuilder.if_`."""
        TxnBuilder.if_(self, *compares)
        return self

    def then(self, *ops: Op) -> Txn[R]:
        """See :meth:`TxnBuilder.then`."""
        TxnBuilder.then(self, *ops)
        return self

    def else_(self, *ops: Op) -> Txn[R]:
        """See :meth:`TxnBuilder.else_`."""
        TxnBuilder.else_(self, *ops)
        return self

    def commit(self) -> R:
        """Send the transaction; its result."""
        return self._send(self.request())


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A granted lease: its id and the TTL the cluster gave it (seconds)."""

    id: int
    ttl: int
