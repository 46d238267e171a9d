"""Differential test over shards (members of one process, and of two workers each):
random multi-key Txns, Puts, DeleteRanges and Ranges (limits, sorted by any target
either way, keys or counts only, over any span of the keys; and over every shard at a
past revision: the one an earlier step of the example made on each side), and a lease
per example that puts attach keys to and a revoke deletes on every shard, against a
real etcd and a 3-member accord with ``--shards 8`` (and with ``--shards 1``: the same
answers), answers compared.
Txns compare values, versions, mod and create revisions and leases, of keys and over
every shard, read at negative revisions (etcd's first revision of a store never
compacted is -1), and nest Txns (etcd refusing a put that overlaps another level's
write: both sides must refuse alike). Ranges over every shard also read at negative
revisions and filter by the mod or create revision a step made; the lease's keys are
listed (as a set). After the live watch, a new watch of the example's keys from its
first revision, with previous values (in some examples without deletes, or without
puts), must replay the same events in the same order, and so must one resumed from the
revision a step made.
A second test compacts at a revision a step made and reads around it: plain Ranges,
and Txns ranging at past revisions (each side's own numbers); then a watch from below
the compaction must be cancelled naming it, and one from it must not. A third sends one
revision of 2.1 MB of events over three shards to watches with and without ``fragment``:
the same pieces as etcd's.

Every example's keys (``/dN/<name>``) are each a partition of their own, so a Txn over
two or more of them spans shards, and a range (or a DeleteRange) over ``/dN/`` covers
every shard. Both
servers get the same requests in the same order. What is compared: every answer's
contents (succeeded, values, versions, counts, ``more``, prev_kvs, error codes and
messages), with the revision numbers left out: accord's numbering is not etcd's
(revisions are clock stamps striped over the shards, so the numbers skip: docs/txn.md,
"One revision order"), but the order is: a step that made a new revision on etcd made one
on accord above every revision accord answered before. Checked too on accord: the keys
one Txn wrote all carry the Txn's header revision, every
response nested in it carries the revision etcd's does in its place (the Txn's, or the
one just below before the Txn's first change; a nested Txn's own header 0: the same
shape as etcd's answer, ``test_revorder.shape``), and a compare-and-swap on the
mod_revisions each side reported behaves the same on both. And the watch: each side has
one watch over every example's keys (on a sharded accord a merged watch over all 8
shards); at the end of an example a last Put closes it, and the events each side delivered, grouped by
revision, must be the same lists in the same order: every step's events at one revision,
a multi-shard Txn's in its operation order (nested Txns in turn, a DeleteRange's keys in
key order), exactly as etcd delivers them; then a progress request is answered at or
above the revision of a Put outside the watched keys, as etcd's is at it, and so are the
created and cancel answers of a watch from a revision of the example. The seed of each run is
printed by hypothesis on failure.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.proto import rpc_pb2_grpc
from accord.services.kv.ranges import prefix_end
from tests.compat.servers import etcd_server
from tests.integration.cluster import ProcCluster
from tests.kv.test_revorder import shape

NAMES = [b"a", b"b", b"c", b"d", b"e", b"f"]
VALUES = [b"x", b"y", b"z"]
TIMEOUT = 20.0


class Events:
    """One watch over every example's keys (``/d``...) on one side, read by a thread:
    the events as ``(revision, type, key, value, previous value)`` in delivery order
    (or a watch of ``key``..``range_end`` from ``start_revision``: an example's replay)."""

    def __init__(self, channel: grpc.Channel, key: bytes = b"/d", range_end: bytes = b"/e",
                 start_revision: int = 0, prev_kv: bool = False,
                 filters: tuple[str, ...] = ()) -> None:
        self._requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        self.got: queue.Queue[tuple[int, int, bytes, bytes, bytes]] = queue.Queue()
        self.progress_answers: queue.Queue[int] = queue.Queue()
        self.created_answers: queue.Queue[tuple[int, int]] = queue.Queue()
        """(watch id, header revision) of every watch created after the first."""
        self.cancel_answers: queue.Queue[int] = queue.Queue()
        """The header revision of every cancel answered."""
        self._requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=key, range_end=range_end, start_revision=start_revision, prev_kv=prev_kv,
            filters=[getattr(pb.WatchCreateRequest, f) for f in filters])))
        self._call = rpc_pb2_grpc.WatchStub(channel).Watch(iter(self._requests.get, None))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for resp in self._call:
                if resp.watch_id == 0:  # the watch over every example's keys
                    for e in resp.events:
                        self.got.put((e.kv.mod_revision, int(e.type), e.kv.key, e.kv.value,
                                      e.prev_kv.value))
                elif resp.created:
                    self.created_answers.put((int(resp.watch_id), int(resp.header.revision)))
                elif resp.canceled:
                    self.cancel_answers.put(int(resp.header.revision))
                if resp.watch_id == -1 and not resp.created and not resp.events:
                    self.progress_answers.put(int(resp.header.revision))
        except grpc.RpcError:
            pass  # cancelled at the end

    def progress(self) -> int:
        """Ask the stream for progress; the revision it answers at."""
        self._requests.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
        return self.progress_answers.get(timeout=TIMEOUT)

    def create(self, key: bytes, start_revision: int) -> tuple[int, int]:
        """Create a watch of ``key`` from ``start_revision`` on this stream: its id and the
        revision its created answer names."""
        self._requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=key, start_revision=start_revision)))
        return self.created_answers.get(timeout=TIMEOUT)

    def cancel(self, wid: int) -> int:
        """Cancel watch ``wid``: the revision its cancel answer names."""
        self._requests.put(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=wid)))
        return self.cancel_answers.get(timeout=TIMEOUT)

    def until(self, key: bytes, prefix: bytes) -> list[list[tuple[int, bytes, bytes, bytes]]]:
        """Every event under ``prefix`` up to the one of ``key`` (excluded), grouped by
        revision (those of other prefixes: left by an earlier example that failed)."""
        groups: list[list[tuple[int, bytes, bytes, bytes]]] = []
        last = None
        while True:
            rev, kind, k, value, prev = self.got.get(timeout=TIMEOUT)
            if k == key:
                return groups
            if not k.startswith(prefix):
                continue
            if rev != last:
                groups.append([])
                last = rev
            groups[-1].append((kind, k, value, prev))

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


class Sides:
    def __init__(self, etcd: str, accord: str) -> None:
        channels = {"etcd": grpc.insecure_channel(etcd), "accord": grpc.insecure_channel(accord)}
        self.channels = channels
        self.stubs = {side: rpc_pb2_grpc.KVStub(ch) for side, ch in channels.items()}
        self.lease_stubs = {side: rpc_pb2_grpc.LeaseStub(ch) for side, ch in channels.items()}
        self.watches = {side: Events(ch) for side, ch in channels.items()}
        self.example = 0
        self.ns = b""
        self.last = {"etcd": 0, "accord": 0}
        """Each side's highest revision answered so far (the order check)."""
        self.made: dict[str, list[int]] = {"etcd": [], "accord": []}
        """Each side's revisions made by this example's steps, in order: the k-th of
        etcd's and the k-th of accord's name the same state of the example's keys."""

    def key(self, name: bytes) -> bytes:
        return self.ns + name

    @property
    def lease_id(self) -> int:
        """The example's lease: granted with this ID on both sides, so it names the same
        lease in a compare or a put on both."""
        return 0x5EED0000 + self.example


@pytest.fixture(scope="module", params=[("--shards", "8"), ("--shards", "8", "--workers", "2"),
                                        ("--shards", "1")],
                ids=["one-worker", "two-workers", "one-shard"])
def sides(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[Sides]:
    """A fresh etcd and a 3-member accord with ``--shards 8``, each member one process or
    two workers (its shards split between them, calls forwarded: ``docs/workers.md``);
    and, the same examples, with ``--shards 1``: one Raft group, etcd's own layout."""
    with ProcCluster(tmp_path_factory.mktemp("diff-shards"), 3, extra=request.param) as c:
        c.wait_published()
        with etcd_server(tmp_path_factory.mktemp("etcd-diff-shards")) as e:
            sides = Sides(e.endpoint, c.nodes[0].endpoint)
            yield sides
            for w in sides.watches.values():
                w.close()


names = st.sampled_from(NAMES)
SORT_TARGETS = ["KEY", "KEY", "VERSION", "CREATE", "MOD", "VALUE"]
sorts = st.tuples(st.sampled_from(SORT_TARGETS), st.sampled_from(["NONE", "ASCEND", "DESCEND"]))
compare_st = st.one_of(
    st.tuples(st.just("value"), names, st.sampled_from(["EQUAL", "NOT_EQUAL", "GREATER"]),
              st.sampled_from(VALUES)),
    st.tuples(st.just("version"), names, st.sampled_from(["EQUAL", "GREATER", "LESS"]),
              st.integers(0, 2)),
    st.tuples(st.just("mod"), names, st.sampled_from(["EQUAL", "NOT_EQUAL"]), st.just(0)),
    st.tuples(st.just("range"), st.just(b""), st.sampled_from(["GREATER", "EQUAL"]),
              st.integers(0, 1)),
    # targets whose argument means the same on both sides: a create_revision or a lease
    # of 0 (the key is missing, or has no lease), a value over every shard's keys
    st.tuples(st.just("create"), names, st.sampled_from(["EQUAL", "GREATER"]), st.just(0)),
    st.tuples(st.just("lease"), names, st.sampled_from(["EQUAL", "NOT_EQUAL"]), st.just(0)),
    st.tuples(st.just("leaseis"), names, st.sampled_from(["EQUAL", "NOT_EQUAL"]), st.just(0)),
    # over part of the keys, [a, b): some shards hold none of it
    st.tuples(st.just("subrange"), st.tuples(names, names),
              st.sampled_from(["EQUAL", "NOT_EQUAL", "GREATER", "LESS"]),
              st.sampled_from(["VALUE", "VERSION", "MOD", "CREATE", "LEASE"])),
    st.tuples(st.just("rangevalue"), st.just(b""), st.sampled_from(["EQUAL", "NOT_EQUAL",
                                                                    "GREATER", "LESS"]),
              st.sampled_from(VALUES)),
)
op_st = st.one_of(
    st.tuples(st.just("put"), names, st.sampled_from(VALUES), st.booleans()),
    st.tuples(st.just("del"), names, st.booleans()),
    st.tuples(st.just("delall"), st.just(b""), st.booleans()),
    st.tuples(st.just("get"), names, st.just(0)),
    # at a negative revision: -1 reads the latest (etcd's first revision of a store never
    # compacted is -1), -2 fails the Txn as compacted
    st.tuples(st.just("get"), names, st.sampled_from([-1, -1, -2])),
    st.tuples(st.just("getall"), st.just(b""), st.integers(0, 3)),
    # over every shard, keys or a count only, in either key order, or sorted by another
    # target either way (or not: etcd then sorts ascending)
    st.tuples(st.just("getallas"), st.just(b""), st.sampled_from(
        ["keys_only", "count_only", "ASCEND", "DESCEND"])),
    st.tuples(st.just("getsorted"), st.sampled_from(SORT_TARGETS[2:]),
              st.sampled_from(["NONE", "ASCEND", "DESCEND"]), st.integers(0, 2)),
    # a put keeping the key's value, its lease or both (etcd fails the Txn when the key
    # is missing)
    st.tuples(st.just("putkeep"), names, st.sampled_from(["value", "lease", "both"])),
    # a DeleteRange over part of the keys, [a, b): some shards hold none of it (etcd
    # refuses a put of the same level inside it)
    st.tuples(st.just("delsub"), st.tuples(names, names), st.booleans()),
    # a put attached to the example's lease (fails the Txn while it is not granted)
    st.tuples(st.just("putlease"), names, st.sampled_from(VALUES)),
)
# a nested Txn (etcd 3.3+) of plain ops: its branch is taken by its own compares, its
# writes are the outer Txn's (one revision), and etcd refuses a put that overlaps a put or
# a delete of another level ("duplicate key"): both sides must refuse it alike
nested_st = st.tuples(st.just("nest"), st.lists(compare_st, max_size=2),
                      st.lists(op_st, max_size=2), st.lists(op_st, max_size=2))
txn_op_st = st.one_of(op_st, op_st, op_st, nested_st)
txn_st = st.tuples(st.just("txn"), st.lists(compare_st, max_size=3),
                   st.lists(txn_op_st, max_size=4), st.lists(txn_op_st, max_size=3))
# A Range over several shards, merged: from a name (or the example's first key) to a
# later one (or the end of the example's keys, or of the whole keyspace: "\0", over the
# keys earlier examples and tests left too, the same on both sides), with a limit,
# sorted by any target either way (or not), keys or a count only. Ties of a sort by version, value or revision:
# etcd sorts its key-ordered result with Go's sort.Sort, which for the few keys of an
# example (six at most: an insertion sort) keeps tied keys in key order, ascending and
# descending alike; merged over shards they must come out the same.
range_st = st.tuples(st.just("range"), st.sampled_from([b"", *NAMES]),
                     st.sampled_from([b"", *NAMES, b"\0"]), st.integers(0, 3),
                     st.sampled_from(["NONE", "ASCEND", "DESCEND"]),
                     st.sampled_from(["plain", "keys_only", "count_only"]),
                     st.sampled_from(SORT_TARGETS))
steps = st.one_of(txn_st, txn_st, st.tuples(st.just("put"), names, st.sampled_from(VALUES),
                                            st.booleans()),
                  st.tuples(st.just("delrange"), st.booleans()), range_st,
                  # a Range over every shard at a past revision: the state a step made
                  st.tuples(st.just("rangeat"), st.integers(0, 3), st.sampled_from([b"", *NAMES]),
                            st.integers(0, 3)),
                  # the example's lease granted, or revoked (its keys deleted on every
                  # shard at one revision)
                  st.tuples(st.just("grant")), st.tuples(st.just("revoke")),
                  st.tuples(st.just("putlease"), names, st.sampled_from(VALUES)),
                  # the lease's keys (a set: etcd lists them in no set order)
                  st.tuples(st.just("ttl")),
                  # a Range over every shard at a negative revision (the latest), or
                  # filtered by a revision a step made (mod or create, from or up to it),
                  # sorted by any target either way (or not)
                  st.tuples(st.just("rangeneg"), st.sampled_from([-1, -2])),
                  st.tuples(st.just("rangefilt"), st.integers(0, 3),
                            st.sampled_from(["min_mod_revision", "max_mod_revision",
                                             "min_create_revision", "max_create_revision"]),
                            st.integers(0, 3), sorts))


def _compare(s: Sides, side: str, c: tuple[Any, ...], mods: dict[str, dict[bytes, int]]
             ) -> pb.Compare:
    kind, name, result, arg = c
    r = getattr(pb.Compare, result)
    if kind == "range":
        return pb.Compare(key=s.ns, range_end=prefix_end(s.ns), target=pb.Compare.VERSION,
                          result=r, version=arg)
    if kind == "subrange":  # arg: the target
        low, high = sorted(name)
        target = getattr(pb.Compare, arg)
        if target == pb.Compare.VALUE:
            return pb.Compare(key=s.key(low), range_end=s.key(high), target=target, result=r,
                              value=b"y")
        if target == pb.Compare.VERSION:
            return pb.Compare(key=s.key(low), range_end=s.key(high), target=target, result=r,
                              version=1)
        # revisions against 0 (the same on both sides), leases against the example's
        return pb.Compare(key=s.key(low), range_end=s.key(high), target=target, result=r,
                          mod_revision=0, create_revision=0,
                          lease=s.lease_id if target == pb.Compare.LEASE else 0)
    if kind == "rangevalue":
        return pb.Compare(key=s.ns, range_end=prefix_end(s.ns), target=pb.Compare.VALUE,
                          result=r, value=arg)
    key = s.key(name)
    if kind == "create":
        return pb.Compare(key=key, target=pb.Compare.CREATE, result=r, create_revision=arg)
    if kind == "lease":
        return pb.Compare(key=key, target=pb.Compare.LEASE, result=r, lease=arg)
    if kind == "leaseis":  # attached to the example's lease
        return pb.Compare(key=key, target=pb.Compare.LEASE, result=r, lease=s.lease_id)
    if kind == "value":
        return pb.Compare(key=key, target=pb.Compare.VALUE, result=r, value=arg)
    if kind == "version":
        return pb.Compare(key=key, target=pb.Compare.VERSION, result=r, version=arg)
    # mod: against the mod_revision this side last reported for the key (a CAS)
    return pb.Compare(key=key, target=pb.Compare.MOD, result=r,
                      mod_revision=mods[side].get(key, 0))


def _op(s: Sides, side: str, o: tuple[Any, ...], mods: dict[str, dict[bytes, int]]
        ) -> pb.RequestOp:
    kind, name, arg = o[0], o[1], o[2]
    if kind == "nest":
        return pb.RequestOp(request_txn=pb.TxnRequest(
            compare=[_compare(s, side, c, mods) for c in o[1]],
            success=[_op(s, side, x, mods) for x in o[2]],
            failure=[_op(s, side, x, mods) for x in o[3]]))
    if kind == "put":
        return pb.RequestOp(request_put=pb.PutRequest(key=s.key(name), value=arg, prev_kv=o[3]))
    if kind == "del":
        return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=s.key(name),
                                                                       prev_kv=arg))
    if kind == "delall":
        return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(
            key=s.ns, range_end=prefix_end(s.ns), prev_kv=arg))
    if kind == "get":
        return pb.RequestOp(request_range=pb.RangeRequest(key=s.key(name), revision=arg))
    if kind == "getat":  # at the revision a step ``arg`` steps ago made on this side
        return pb.RequestOp(request_range=pb.RangeRequest(
            key=s.key(name), revision=_made(s, side, arg)))
    if kind == "putlease":
        return pb.RequestOp(request_put=pb.PutRequest(key=s.key(name), value=arg,
                                                      lease=s.lease_id))
    if kind == "putkeep":  # arg: what it keeps
        return pb.RequestOp(request_put=pb.PutRequest(
            key=s.key(name), value=b"" if arg != "lease" else b"k",
            ignore_value=arg != "lease", ignore_lease=arg != "value"))
    if kind == "delsub":  # name: the range's ends, in either order; arg: prev_kv
        low, high = sorted(name)
        return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(
            key=s.key(low), range_end=s.key(high), prev_kv=arg))
    if kind == "getsorted":  # name: the target; arg: the order; o[3]: the limit
        return pb.RequestOp(request_range=pb.RangeRequest(
            key=s.ns, range_end=prefix_end(s.ns), sort_target=getattr(pb.RangeRequest, name),
            sort_order=getattr(pb.RangeRequest, arg), limit=o[3]))
    if kind == "getallas":
        return pb.RequestOp(request_range=pb.RangeRequest(
            key=s.ns, range_end=prefix_end(s.ns), keys_only=arg == "keys_only",
            count_only=arg == "count_only", sort_target=pb.RangeRequest.KEY,
            sort_order=pb.RangeRequest.DESCEND if arg == "DESCEND" else
            pb.RangeRequest.ASCEND if arg == "ASCEND" else pb.RangeRequest.NONE))
    return pb.RequestOp(request_range=pb.RangeRequest(key=s.ns, range_end=prefix_end(s.ns),
                                                      limit=arg))


def _valid(ops: list[tuple[Any, ...]]) -> bool:
    """etcd refuses a branch putting one key twice (or a put inside a deleted range)."""
    puts = [o[1] for o in ops if o[0] in ("put", "putkeep", "putlease")]
    return len(puts) == len(set(puts))


def _strip(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items()
                if k not in ("header", "mod_revision", "create_revision")}
    if isinstance(d, list):
        return [_strip(x) for x in d]
    return d


def _norm(msg: Any) -> Any:
    return _strip(json_format.MessageToDict(msg, preserving_proto_field_name=True))


def _made(s: Sides, side: str, back: int) -> int:
    """The revision a step ``back`` steps before the example's last made on ``side`` (0:
    none yet)."""
    made = s.made[side]
    return made[max(0, len(made) - 1 - back)] if made else 0


def _send(s: Sides, step: tuple[Any, ...], mods: dict[str, dict[bytes, int]]) -> None:
    outcomes: dict[str, Any] = {}
    for side, stub in s.stubs.items():
        if step[0] == "put":
            req: Any = pb.PutRequest(key=s.key(step[1]), value=step[2], prev_kv=step[3])
            call = stub.Put
        elif step[0] == "putlease":
            req = pb.PutRequest(key=s.key(step[1]), value=step[2], lease=s.lease_id)
            call = stub.Put
        elif step[0] == "grant":
            req = pb.LeaseGrantRequest(ID=s.lease_id, TTL=600)
            call = s.lease_stubs[side].LeaseGrant
        elif step[0] == "revoke":
            req = pb.LeaseRevokeRequest(ID=s.lease_id)
            call = s.lease_stubs[side].LeaseRevoke
        elif step[0] == "delrange":  # over every shard: one revision on accord
            req = pb.DeleteRangeRequest(key=s.ns, range_end=prefix_end(s.ns), prev_kv=step[1])
            call = stub.DeleteRange
        elif step[0] == "rangeat":  # at the revision a step ``back`` steps ago made
            _kind, back, start, limit = step
            req = pb.RangeRequest(key=s.key(start), range_end=prefix_end(s.ns), limit=limit,
                                  revision=_made(s, side, back))
            call = stub.Range
        elif step[0] == "ttl":
            req = pb.LeaseTimeToLiveRequest(ID=s.lease_id, keys=True)
            call = s.lease_stubs[side].LeaseTimeToLive
        elif step[0] == "rangeneg":
            req = pb.RangeRequest(key=s.ns, range_end=prefix_end(s.ns), revision=step[1])
            call = stub.Range
        elif step[0] == "rangefilt":  # filtered by the revision a step ``back`` ago made
            _kind, back, field, limit, (target, order) = step
            req = pb.RangeRequest(key=s.ns, range_end=prefix_end(s.ns), limit=limit,
                                  sort_target=getattr(pb.RangeRequest, target),
                                  sort_order=getattr(pb.RangeRequest, order),
                                  **{field: _made(s, side, back)})
            call = stub.Range
        elif step[0] == "compact":  # history up to the revision a step ``back`` ago made
            req = pb.CompactionRequest(revision=_made(s, side, step[1]))
            call = stub.Compact
        elif step[0] == "range":
            _kind, start, end, limit, order, only, target = step
            req = pb.RangeRequest(
                key=s.key(start),
                range_end=b"\0" if end == b"\0" else s.key(end) if end else prefix_end(s.ns),
                limit=limit, sort_order=getattr(pb.RangeRequest, order),
                sort_target=getattr(pb.RangeRequest, target), keys_only=only == "keys_only",
                count_only=only == "count_only")
            call = stub.Range
        else:
            req = pb.TxnRequest(compare=[_compare(s, side, c, mods) for c in step[1]],
                                success=[_op(s, side, o, mods) for o in step[2]],
                                failure=[_op(s, side, o, mods) for o in step[3]])
            call = stub.Txn
        try:
            outcomes[side] = ("ok", call(req, timeout=TIMEOUT))
        except grpc.RpcError as e:
            outcomes[side] = ("error", e.code(), e.details())
    e, a = outcomes["etcd"], outcomes["accord"]
    assert e[0] == a[0], (step, e, a)
    if e[0] == "error":
        assert e[1:] == a[1:], (step, e, a)
        return
    if step[0] == "ttl":
        assert (e[1].ID, e[1].grantedTTL, sorted(e[1].keys)) == (
            a[1].ID, a[1].grantedTTL, sorted(a[1].keys)), (step, e[1], a[1])
        return
    assert _norm(e[1]) == _norm(a[1]), (step, e[1], a[1])
    # The order: a step that made a revision on etcd (its header revision rose) made one on
    # accord above every revision accord answered before (docs/txn.md, "One revision
    # order": gaps allowed, the order is etcd's).
    e_rev, a_rev = int(e[1].header.revision), int(a[1].header.revision)
    if e_rev > s.last["etcd"] and s.last["etcd"]:
        assert a_rev > s.last["accord"], (step, s.last, e_rev, a_rev)
    if e_rev > s.last["etcd"]:
        s.made["etcd"].append(e_rev)
        s.made["accord"].append(a_rev)
    s.last = {"etcd": max(s.last["etcd"], e_rev), "accord": max(s.last["accord"], a_rev)}
    if step[0] == "txn":
        # Every part's revision in the same place against the Txn's own as etcd's (R, or
        # R - 1 before its first change, a nested Txn's header 0).
        assert shape(a[1]) == shape(e[1]), (step, e[1], a[1])
    for side, stub in s.stubs.items():
        got = stub.Range(pb.RangeRequest(key=s.ns, range_end=prefix_end(s.ns)), timeout=TIMEOUT)
        mods[side] = {kv.key: kv.mod_revision for kv in got.kvs}
    states = {side: {kv.key: (kv.value, kv.version) for kv in
                     s.stubs[side].Range(pb.RangeRequest(key=s.ns, range_end=prefix_end(s.ns)),
                                         timeout=TIMEOUT).kvs}
              for side in s.stubs}
    assert states["etcd"] == states["accord"], step
    if step[0] == "txn" and a[1].succeeded is not None:
        written = {s.key(o[1]) for o in (step[2] if a[1].succeeded else step[3])
                   if o[0] == "put"}
        if written and not any(o[0] in ("del", "delall", "delsub")
                               for o in step[2] + step[3]):
            assert {mods["accord"][k] for k in written} == {a[1].header.revision}


@settings(deadline=None, max_examples=40, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.lists(steps.filter(lambda t: t[0] != "txn" or (_valid(t[2]) and _valid(t[3]))),
                min_size=1, max_size=8),
       st.sampled_from([(), ("NODELETE",), ("NOPUT",)]), st.integers(0, 3))
# Ties of a sort by value, by mod and create revision (one Txn's keys) and by version,
# merged over shards: in key order, whichever way the sort goes, as etcd answers them.
@example(program=[("txn", [], [("put", b"a", b"x", False), ("put", b"c", b"x", False),
                               ("put", b"e", b"y", False)], []),
                  ("put", b"b", b"x", False),
                  ("range", b"", b"", 0, "DESCEND", "plain", "VALUE"),
                  ("range", b"", b"", 2, "DESCEND", "keys_only", "MOD"),
                  ("range", b"", b"", 0, "NONE", "plain", "CREATE"),
                  ("txn", [], [("getsorted", "VERSION", "DESCEND", 0),
                               ("getsorted", "VALUE", "ASCEND", 2)], [])],
         filters=("NOPUT",), resume=2)
def test_multi_shard_txns_answer_as_etcd(sides: Sides, program: list[tuple[Any, ...]],
                                         filters: tuple[str, ...], resume: int) -> None:
    sides.example += 1
    sides.ns = b"/d%05d/" % sides.example
    sides.made = {"etcd": [], "accord": []}
    mods: dict[str, dict[bytes, int]] = {"etcd": {}, "accord": {}}
    first = {side: sides.last[side] + 1 for side in sides.stubs}
    for step in [("grant",), *program]:  # the example's lease, for its puts to attach to
        _send(sides, step, mods)
    end = sides.ns + b"~end"
    events = {}
    written = {}
    for side, stub in sides.stubs.items():
        written[side] = int(stub.Put(pb.PutRequest(key=end, value=b""),
                                     timeout=TIMEOUT).header.revision)
        events[side] = sides.watches[side].until(end, sides.ns)
    assert events["accord"] == events["etcd"], program
    if filters == ("NOPUT",):  # a replay without puts ends at the end key's delete
        for stub in sides.stubs.values():
            stub.DeleteRange(pb.DeleteRangeRequest(key=end), timeout=TIMEOUT)
    # The same again from history: a new watch of the example's keys from its first
    # revision, with the previous values (and, in some examples, without deletes or
    # without puts), replays every shard merged in etcd's order; and so does one resumed
    # from the revision a step made (each side's own number for it), as a client
    # reconnecting after that step would.
    starts = [first]
    if sides.made["etcd"]:
        starts.append({side: _made(sides, side, resume) for side in sides.stubs})
    for start in starts:
        replays = {side: Events(sides.channels[side], sides.ns, prefix_end(sides.ns),
                                start[side], prev_kv=True, filters=filters)
                   for side in sides.stubs}
        try:
            replayed = {side: r.until(end, sides.ns) for side, r in replays.items()}
        finally:
            for r in replays.values():
                r.close()
        assert replayed["accord"] == replayed["etcd"], (program, start)
    # A created answer and a progress request name the store's current revision: at or
    # above a write the watch does not see (another prefix, so no event of it closes the watched
    # shards; on etcd exactly at it), though every other shard of accord was idle since.
    for side, stub in sides.stubs.items():
        written[side] = int(stub.Put(pb.PutRequest(key=b"/x" + sides.ns, value=b""),
                                     timeout=TIMEOUT).header.revision)
    # The created answer of a watch from a revision of the example, on a key of its own
    # (one shard of accord's, idle since) and on the example's keys; then, after another
    # write outside the watched keys, the cancel answers:
    created = {side: [w.create(key, first[side]) for key in (b"/y" + sides.ns, sides.ns)]
               for side, w in sides.watches.items()}
    assert [rev for _wid, rev in created["etcd"]] == [written["etcd"]] * 2
    assert min(rev for _wid, rev in created["accord"]) >= written["accord"], program
    for side, stub in sides.stubs.items():
        written[side] = int(stub.Put(pb.PutRequest(key=b"/z" + sides.ns, value=b""),
                                     timeout=TIMEOUT).header.revision)
    canceled = {side: [sides.watches[side].cancel(wid) for wid, _rev in created[side]]
                for side in sides.watches}
    assert canceled["etcd"] == [written["etcd"]] * 2
    assert min(canceled["accord"]) >= written["accord"], program
    # and a progress request on the stream:
    assert sides.watches["etcd"].progress() == written["etcd"]
    assert sides.watches["accord"].progress() >= written["accord"], program


# After a compaction (this test runs last: it compacts the whole store): writes, a
# compaction at a revision one of them made, then reads at revisions around it (plain
# Ranges over every shard, Txns that write one key and read another at a past revision,
# and at revision -1, which is below etcd's first revision once it compacted).
written_st = st.lists(st.one_of(
    st.tuples(st.just("put"), names, st.sampled_from(VALUES), st.just(False)),
    st.tuples(st.just("txn"), st.just([]), st.lists(
        st.tuples(st.just("put"), names, st.sampled_from(VALUES), st.just(False)),
        min_size=2, max_size=3, unique_by=lambda o: o[1]), st.just([]))),
    min_size=2, max_size=5)
reads_st = st.lists(st.one_of(
    st.tuples(st.just("rangeat"), st.integers(0, 5), st.sampled_from([b"", *NAMES]),
              st.integers(0, 3)),
    st.tuples(st.just("txn"), st.just([]), st.tuples(
        st.tuples(st.just("put"), names, st.sampled_from(VALUES), st.just(False)),
        st.tuples(st.just("getat"), names, st.integers(0, 5))).map(list), st.just([])),
    st.tuples(st.just("txn"), st.just([]), st.tuples(
        st.tuples(st.just("getat"), names, st.integers(0, 5)),
        st.tuples(st.just("get"), names, st.just(-1))).map(list), st.just([])),
    st.tuples(st.just("rangeneg"), st.sampled_from([-1, -2])),
    st.tuples(st.just("rangefilt"), st.integers(0, 5),
              st.sampled_from(["min_mod_revision", "max_mod_revision",
                               "min_create_revision", "max_create_revision"]),
              st.integers(0, 3), sorts),
    st.tuples(st.just("compact"), st.integers(0, 5))),
    min_size=1, max_size=4)


@settings(deadline=None, max_examples=15, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(written_st, st.integers(0, 4), reads_st)
def test_reads_after_a_compaction_answer_as_etcd(
        sides: Sides, writes: list[tuple[Any, ...]], back: int,
        reads: list[tuple[Any, ...]]) -> None:
    sides.example += 1
    sides.ns = b"/c%05d/" % sides.example
    sides.made = {"etcd": [], "accord": []}
    mods: dict[str, dict[bytes, int]] = {"etcd": {}, "accord": {}}
    for step in writes:
        _send(sides, step, mods)
    at = {side: _made(sides, side, back) for side in sides.stubs}
    for step in [("compact", back), *reads]:
        _send(sides, step, mods)
    if any(step[0] == "compact" for step in reads):
        return  # compacted again: the checks below are about the first one
    # A watch from below the compaction is cancelled, naming it (each side its own
    # number); one from the compaction's own revision is not.
    for start in ("below", "at"):
        answers = {side: _watch_answer(sides.channels[side], sides.ns,
                                       at[side] - 1 if start == "below" else at[side])
                   for side in sides.stubs}
        for side, (canceled, compact_revision) in answers.items():
            assert canceled == (start == "below"), (side, start, answers)
            if canceled:
                assert compact_revision == at[side], (side, start, answers, at)


def _watch_answer(channel: grpc.Channel, prefix: bytes, start_revision: int
                  ) -> tuple[bool, int]:
    """Create a watch of ``prefix`` from ``start_revision`` on a stream of its own:
    ``(cancelled, compact_revision)`` of the answers up to the first that cancels it or
    carries events (or, after one second without either, the created answer's)."""
    requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
    requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
        key=prefix, range_end=prefix_end(prefix), start_revision=start_revision)))
    call = rpc_pb2_grpc.WatchStub(channel).Watch(iter(requests.get, None), timeout=TIMEOUT)
    found: list[tuple[bool, int]] = []
    done = threading.Event()

    def read() -> None:
        try:
            for resp in call:
                found.append((bool(resp.canceled), int(resp.compact_revision)))
                if resp.canceled or resp.events:
                    break
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(1.0)
    requests.put(None)
    call.cancel()
    done.wait(TIMEOUT)
    canceled = [f for f in found if f[0]]
    return canceled[0] if canceled else (False, 0)


def test_a_large_revision_over_shards_is_fragmented_as_etcd_fragments_it(sides: Sides) -> None:
    """A DeleteRange over three shards whose events carry 700 KiB previous values each
    (2.1 MB at one revision, over etcd's 1.5 MiB request limit): a watch created with
    ``fragment`` gets it in the same pieces as from etcd (the last one not marked), and
    one created without gets it whole, in one response; the merged watch of the
    sharded layout too."""
    sides.example += 1
    prefix = b"/f%05d/" % sides.example
    big = b"x" * (700 * 1024)
    seen = {}
    for side, stub in sides.stubs.items():
        for name in (b"a", b"b", b"c"):
            stub.Put(pb.PutRequest(key=prefix + name, value=big), timeout=TIMEOUT)
        watches = [_Pieces(sides.channels[side], prefix, fragment) for fragment in (True, False)]
        stub.DeleteRange(pb.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix)),
                         timeout=TIMEOUT)
        seen[side] = [w.pieces(3) for w in watches]
    assert seen["accord"] == seen["etcd"]
    assert [len(pieces) for pieces in seen["etcd"]] == [2, 1]


class _Pieces:
    """A watch of ``prefix`` from now, with previous values, on a stream of its own: the
    responses that carry its events, as ``(fragment, [(type, key, previous value's
    size)])``."""

    def __init__(self, channel: grpc.Channel, prefix: bytes, fragment: bool) -> None:
        self._requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        self._requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=prefix, range_end=prefix_end(prefix), prev_kv=True, fragment=fragment)))
        self._call = rpc_pb2_grpc.WatchStub(channel).Watch(iter(self._requests.get, None),
                                                           timeout=TIMEOUT)
        self._got: queue.Queue[pb.WatchResponse] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._got.get(timeout=TIMEOUT).created

    def _read(self) -> None:
        try:
            for resp in self._call:
                self._got.put(resp)
        except grpc.RpcError:
            pass  # cancelled at the end

    def pieces(self, events: int) -> list[tuple[bool, list[tuple[int, bytes, int]]]]:
        """The responses up to the one that brings the count of events to ``events``."""
        out: list[tuple[bool, list[tuple[int, bytes, int]]]] = []
        try:
            while sum(len(evs) for _f, evs in out) < events:
                resp = self._got.get(timeout=TIMEOUT)
                if resp.events:
                    out.append((bool(resp.fragment), [
                        (int(e.type), e.kv.key[-1:], len(e.prev_kv.value)) for e in resp.events]))
        finally:
            self._requests.put(None)
            self._call.cancel()
        return out
