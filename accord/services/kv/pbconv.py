"""Conversions from the store's internal version tuples to etcd protobuf messages."""

from __future__ import annotations

from accord.proto import kv_pb2
from accord.services.kv.mvcc import CREATE, LEASE, MOD, VALUE, VERSION, Rec

KeyValue = kv_pb2.KeyValue
Event = kv_pb2.Event


def kv_pb(key: bytes, rec: Rec, keys_only: bool = False) -> kv_pb2.KeyValue:
    """The ``mvccpb.KeyValue`` of a live version (``keys_only`` omits the value)."""
    return KeyValue(
        key=key,
        create_revision=rec[CREATE],
        mod_revision=rec[MOD],
        version=rec[VERSION],
        value=b"" if keys_only else (rec[VALUE] or b""),
        lease=rec[LEASE],
    )


def event_pb(key: bytes, rec: Rec, prev: Rec | None, with_prev: bool) -> kv_pb2.Event:
    """The watch event of one change; a DELETE's kv carries only key and mod_revision."""
    if rec[VALUE] is None:
        ev = Event(type=Event.DELETE, kv=KeyValue(key=key, mod_revision=rec[MOD]))
    else:
        ev = Event(type=Event.PUT, kv=kv_pb(key, rec))
    if with_prev and prev is not None:
        ev.prev_kv.CopyFrom(kv_pb(key, prev))
    return ev
