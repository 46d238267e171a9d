"""The worker router's range across workers and the backend's guard on other workers'
shards (``accord/node/workers.py``, ``docs/workers.md``), with two workers' backends in
one process, each over a stand-in host that applies proposals at once, linked by real
forwarding sockets."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import crc32c
import grpc
import msgpack
import pytest

from accord.node.backend import ReplicatedBackend, kv_group
from accord.node.forward import ForwardClient, ForwardServer
from accord.node.placement import WorkerPlan, shard_of_group
from accord.node.workers import WorkerRouter
from accord.proto import rpc_pb2 as pb
from accord.raft.core.types import Role
from accord.services.cluster import snapfile
from accord.services.cluster.alarms import AlarmTable
from accord.services.kv import fanout
from accord.services.kv.backend import nth_latest
from accord.services.kv.errors import EtcdError
from accord.services.kv.sharding import shard_of
from accord.services.kv.statemachine import KVStateMachine
from accord.services.kv.txnplan import TxnPlan

SHARDS = 4
PLAN = WorkerPlan(2, SHARDS)


@dataclass
class StandInHost:
    """Proposals applied at once, barriers counted; only the worker's own groups."""

    machines: list[KVStateMachine]
    local: Sequence[int]
    barriers: list[int] = field(default_factory=list)
    groups: dict[int, Any] = field(default_factory=dict)
    transfers: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for s in self.local:
            core = SimpleNamespace(term=1, leader_id=1, role=Role.LEADER,
                                   conf_state=SimpleNamespace(voters={1, 2, 3}))
            self.groups[kv_group(s)] = SimpleNamespace(core=core, sm=self.machines[s])

    def transfer_leader(self, gid: int, target: int) -> None:
        """Leadership handed over at once (member 1 is this node)."""
        self.transfers.append((gid, target))
        core = self.groups[gid].core
        core.role, core.leader_id = Role.FOLLOWER, target

    def group(self, gid: int) -> Any:
        return self.groups[gid]

    async def propose(self, gid: int, command: bytes, timeout: float | None = None) -> Any:
        assert gid in self.groups, f"group {gid} proposed on a worker that does not host it"
        return self.machines[shard_of_group(gid)].apply(command)

    async def read_barrier(self, gid: int) -> None:
        assert gid in self.groups
        self.barriers.append(shard_of_group(gid))


class LocalOnly(WorkerRouter):
    """Broken variant: reads every shard from this worker's own machines (the other
    worker's are empty stand-ins here) instead of asking their owner."""

    async def _parts(self, worker: int, req: pb.RangeRequest, shards: list[int],
                     rev: int, fenced: int = 0) -> list[pb.RangeResponse]:
        return [self.backend.machines[s].range(fanout.per_shard_request(
            req, min(rev, int(self.backend.machines[s].revision)))) for s in shards]

    async def _txn_step(self, worker: int, method: str, fields: list[Any],
                        local: Any) -> Any:
        raw, shards, rev, last = fields
        plan = TxnPlan(pb.TxnRequest.FromString(raw))
        shares = [self.backend.machines[s].read_share(plan, rev) for s in shards]
        if method.endswith("TxnCompares"):
            return [c for c, _read in shares], 0
        return [read(last).SerializeToString() for _c, read in shares]


@dataclass
class Worker:
    backend: ReplicatedBackend
    host: StandInHost
    router: WorkerRouter
    server: ForwardServer


async def two_workers(tmp: Path, broken: bool = False) -> list[Worker]:
    out: list[Worker] = []
    socks = [tmp / f"w{k}.sock" for k in range(2)]
    for k in range(2):
        machines = [KVStateMachine(stripe=(SHARDS, i)) for i in range(SHARDS)]
        host = StandInHost(machines, PLAN.shards_of(k))
        node = SimpleNamespace(config=SimpleNamespace(cluster_id=7, data_dir=str(tmp)),
                               member_id=1, host=host,
                               # every member applies every command format: ordered stamps
                               cluster=SimpleNamespace(alarms=AlarmTable(),
                                                       min_command_format=lambda: 1 << 30))
        backend = ReplicatedBackend(node, machines, local=PLAN.shards_of(k),  # type: ignore[arg-type]
                                    worker=k)
        cls = LocalOnly if broken and k == 0 else WorkerRouter
        router = cls(PLAN, k, backend, {1 - k: ForwardClient(socks[1 - k])})
        served = router.install({})
        server = ForwardServer(socks[k], served)
        await server.start()
        out.append(Worker(backend, host, router, server))
    return out


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[list[Worker]]:
    ws = await two_workers(tmp_path)
    yield ws
    await stop(ws)


async def stop(ws: list[Worker]) -> None:
    for w in ws:
        for c in w.router.clients.values():
            await c.close()
    for w in ws:
        await w.server.stop()


def keys_of(worker: int, n: int) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        key = f"k{i}".encode()
        if PLAN.worker_of_shard(shard_of(key, SHARDS)) == worker:
            out.append(key)
        i += 1
    return out


async def fill(ws: list[Worker]) -> dict[bytes, int]:
    revs = {}
    for k, w in enumerate(ws):
        for key in keys_of(k, 5):
            resp = await w.backend.put(pb.PutRequest(key=key, value=b"v" + key))
            revs[key] = int(resp.header.revision)
    return revs


EVERY = pb.RangeRequest(key=b"k", range_end=b"l")


@pytest.mark.parametrize("broken", [False, True])
async def test_a_range_over_both_workers_reads_every_shard_from_its_owner(
        tmp_path: Path, broken: bool) -> None:
    ws = await two_workers(tmp_path, broken)
    try:
        revs = await fill(ws)
        resp = await ws[0].router.range_across(EVERY, list(range(SHARDS)))
        got = [kv.key for kv in resp.kvs]
        if broken:
            assert got != sorted(revs), "the broken variant should miss worker 1's keys"
            return
        assert got == sorted(revs)
        rev = int(resp.header.revision)
        assert rev >= max(revs.values())  # the read's revision: its clock, above every write
        # Every shard passed a barrier on its owner; none is floored (the read's fences
        # hold its revision: no write lands at or below it afterwards).
        for k, w in enumerate(ws):
            assert set(w.host.barriers) == set(PLAN.shards_of(k))
            for s in PLAN.shards_of(k):
                assert w.backend.machines[s].revision < rev
        later = await ws[0].backend.put(pb.PutRequest(key=keys_of(0, 1)[0], value=b"later"))
        assert later.header.revision > rev
        counted = await ws[1].router.range_across(
            pb.RangeRequest(key=b"k", range_end=b"l", count_only=True), list(range(SHARDS)))
        assert counted.count == len(revs) and not counted.kvs
    finally:
        await stop(ws)


async def test_a_range_at_a_revision_sees_the_store_as_it_was(workers: list[Worker]) -> None:
    revs = await fill(workers)
    order = sorted(revs, key=revs.__getitem__)
    mid = revs[order[4]]
    for w in workers:
        at = await w.router.range_across(pb.RangeRequest(key=b"k", range_end=b"l", revision=mid),
                                         list(range(SHARDS)))
        assert sorted(kv.key for kv in at.kvs) == sorted(order[:5])
        # One shard, at a revision another worker's shard made: readable once floored.
        first = order[0]
        one = await w.router.range_across(pb.RangeRequest(key=first, revision=mid),
                                          [shard_of(first, SHARDS)])
        assert [kv.key for kv in one.kvs] == [first]
    with pytest.raises(EtcdError) as e:
        await workers[0].router.range_across(
            pb.RangeRequest(key=b"k", range_end=b"l",  # an hour ahead of the clock
                            revision=(time.time_ns() // 1000 + 3_600_000_000) * SHARDS),
            list(range(SHARDS)))
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE


async def test_a_worker_refuses_to_write_or_read_another_workers_shard(
        workers: list[Worker]) -> None:
    """The guard under the router: an empty stand-in machine is never written or read
    as if it held the shard."""
    b0 = workers[0].backend
    theirs = keys_of(1, 1)[0]
    shard = shard_of(theirs, SHARDS)
    before = b0.machines[shard].revision
    with pytest.raises(EtcdError) as e:
        await b0.put(pb.PutRequest(key=theirs, value=b"x"))
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "--workers" in e.value.message
    with pytest.raises(EtcdError):
        await b0.range(pb.RangeRequest(key=theirs))
    with pytest.raises(EtcdError):
        await workers[0].router.local_parts(pb.RangeRequest(key=theirs), [shard], 1)
    assert b0.machines[shard].revision == before
    assert not b0.leads(shard) and b0.leads(PLAN.shards_of(0)[0])


def cas_both(keys: list[bytes], revs: list[int], values: list[bytes]) -> pb.TxnRequest:
    """Compare both keys' mod revisions, then put both (else read both)."""
    return pb.TxnRequest(
        compare=[pb.Compare(key=k, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                            mod_revision=r) for k, r in zip(keys, revs, strict=True)],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=v))
                 for k, v in zip(keys, values, strict=True)],
        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in keys])


async def settled(ws: list[Worker]) -> None:
    for w in ws:
        await w.backend.xcoord.drain()


def record_worker_and_keys() -> tuple[int, list[bytes]]:
    """A key on each worker; the worker whose shard is the lower (the Txn's record)."""
    keys = [keys_of(0, 1)[0], keys_of(1, 1)[0]]
    shards = [shard_of(k, SHARDS) for k in keys]
    return PLAN.worker_of_shard(min(shards)), keys


@pytest.mark.parametrize("broken", [False, True])
async def test_a_txn_over_both_workers_commits_on_each_owner_at_one_revision(
        workers: list[Worker], broken: bool) -> None:
    """The coordinator (the record shard's worker) commits the other worker's steps
    through it (``remote_commit``): both keys written at one revision, each by its owner.
    The broken variant applies the other worker's step to the coordinator's own empty
    copy of the shard: the owner never sees the write, and the check fails."""
    home, keys = record_worker_and_keys()
    coordinator = workers[home].backend
    workers[home].router.broken_local_commits = broken
    first = await coordinator.txn(cas_both(keys, [0, 0], [b"a", b"b"]))
    assert first.succeeded
    await settled(workers)
    owners = [workers[PLAN.worker_of_shard(shard_of(k, SHARDS))].backend for k in keys]
    got = [o.machines[shard_of(k, SHARDS)].range(pb.RangeRequest(key=k))
           for o, k in zip(owners, keys, strict=True)]
    if broken:
        assert [len(g.kvs) for g in got] != [1, 1]
        return
    assert [g.kvs[0].value for g in got] == [b"a", b"b"]
    assert {g.kvs[0].mod_revision for g in got} == {first.header.revision}
    # A compare that fails on the other worker's key takes the failure branch there too.
    lost = await coordinator.txn(cas_both(keys, [first.header.revision, 1], [b"x", b"y"]))
    assert not lost.succeeded
    assert [r.response_range.kvs[0].value for r in lost.responses] == [b"a", b"b"]
    # A DeleteRange over both workers' shards: one revision, every key.
    gone = await coordinator.delete_range(pb.DeleteRangeRequest(key=b"k", range_end=b"l"))
    await settled(workers)
    assert gone.deleted == 2
    for o, k in zip(owners, keys, strict=True):
        assert o.machines[shard_of(k, SHARDS)].range(pb.RangeRequest(key=k)).count == 0


async def test_a_remote_step_is_refused_unless_it_is_a_txn_step_on_the_owner(
        workers: list[Worker]) -> None:
    """The internal commit carries only a multi-shard Txn's step, to the shard's owner;
    anything else is refused, nothing proposed."""
    theirs = shard_of(keys_of(1, 1)[0], SHARDS)
    mine = shard_of(keys_of(0, 1)[0], SHARDS)
    put = workers[0].backend.sm.encode_put(pb.PutRequest(key=b"k0", value=b"v"))
    client = workers[0].router.clients[1]
    before = workers[1].backend.machines[theirs].revision
    for shard, command in ((theirs, put), (mine, b"\x93\x03\x03\x01")):
        with pytest.raises(Exception) as e:
            await client.call("/accord.worker/Commit", msgpack.packb([shard, command]), 5.0)
        assert getattr(e.value, "code", None) in (grpc.StatusCode.INVALID_ARGUMENT,
                                                  grpc.StatusCode.FAILED_PRECONDITION)
    assert workers[1].backend.machines[theirs].revision == before


@pytest.mark.parametrize("broken", [False, True])
async def test_a_read_only_txn_over_both_workers_reads_each_owner_at_one_revision(
        tmp_path: Path, broken: bool) -> None:
    """A read-only Txn over both workers' shards (``txn_across``): the compares of each
    owner's keys at one revision decide the branch, and each owner reads its keys there,
    as one etcd answers. The broken variant (worker 0 reads every shard from its own
    machines, the other worker's empty stand-ins) misses worker 1's key."""
    workers = await two_workers(tmp_path, broken)
    try:
        await _read_only_txn_across(workers, broken)
    finally:
        await stop(workers)


async def _read_only_txn_across(workers: list[Worker], broken: bool) -> None:
    home, keys = record_worker_and_keys()
    first = await workers[home].backend.txn(cas_both(keys, [0, 0], [b"a", b"b"]))
    await settled(workers)

    def read_both(revs: list[int]) -> pb.TxnRequest:
        return pb.TxnRequest(
            compare=[pb.Compare(key=k, target=pb.Compare.MOD, result=pb.Compare.EQUAL,
                                mod_revision=r) for k, r in zip(keys, revs, strict=True)],
            success=[pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in keys],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=keys[1]))])

    at = first.header.revision
    if broken:
        wrong = await workers[0].router.txn_across(read_both([at, at]))
        assert not wrong.succeeded, "the broken variant should miss worker 1's key"
        return
    for w in workers:
        assert w.router._read_across(read_both([at, at]))
        both = await w.router.txn_across(read_both([at, at]))
        assert both.succeeded and both.header.revision >= at
        assert [r.response_range.kvs[0].value for r in both.responses] == [b"a", b"b"]
        one = await w.router.txn_across(read_both([at, at - 1]))  # fails on one worker's key
        assert not one.succeeded
        assert [kv.value for r in one.responses for kv in r.response_range.kvs] == [b"b"]
        # etcd's first revision of a store never compacted is -1: a range there reads
        # the latest, one below it is refused as compacted (whichever worker holds it).
        latest = await w.router.txn_across(pb.TxnRequest(success=[pb.RequestOp(
            request_range=pb.RangeRequest(key=k, revision=-1)) for k in keys]))
        assert [r.response_range.kvs[0].value for r in latest.responses] == [b"a", b"b"]
        with pytest.raises(EtcdError, match="compacted"):
            await w.router.txn_across(pb.TxnRequest(success=[pb.RequestOp(
                request_range=pb.RangeRequest(key=k, revision=-2)) for k in keys]))
    later = await workers[1 - home].backend.put(pb.PutRequest(key=keys[1], value=b"c"))
    assert later.header.revision > both.header.revision


@pytest.mark.parametrize("broken", [False, True])
async def test_a_lease_granted_on_worker_0_is_known_on_every_workers_shards(
        workers: list[Worker], broken: bool) -> None:
    """The grant reaches the other worker's shards through it (``remote_commit``), so a
    Put with the lease there applies; a keepalive and a TimeToLive from the other worker
    go to worker 0. The broken variant applies the grant to worker 0's empty copy of the
    other worker's shards: the Put there fails with lease-not-found."""
    home = workers[PLAN.worker_of_shard(0)]
    other = workers[1 - PLAN.worker_of_shard(0)]
    home.router.broken_local_commits = broken
    lid = (await home.backend.lease_grant(pb.LeaseGrantRequest(TTL=60))).ID
    theirs = keys_of(other.router.index, 1)[0]
    if broken:
        with pytest.raises(EtcdError) as e:
            await other.backend.put(pb.PutRequest(key=theirs, value=b"v", lease=lid))
        assert "requested lease not found" in e.value.message
        return
    await other.backend.put(pb.PutRequest(key=theirs, value=b"v", lease=lid))
    assert await other.backend.lease_keepalive(lid) == 60
    ttl = await home.backend.lease_time_to_live(pb.LeaseTimeToLiveRequest(ID=lid, keys=True))
    assert list(ttl.keys) == [theirs]


async def test_hash_covers_every_shard_of_both_workers_as_one_process_frames_it(
        workers: list[Worker]) -> None:
    """etcd's Hash through either worker: the CRC-32C of every shard's image in shard
    order, framed as a node of one process frames its shards (``_image``), each image
    from the shard's owner; a revision floor of every shard does not change it, a write on
    either worker's shard does."""
    await fill(workers)

    def one_process() -> int:
        images = [workers[PLAN.worker_of_shard(s)].backend.machines[s].prepare_hash()()
                  for s in range(SHARDS)]
        return int(crc32c.crc32c(msgpack.packb(["accord-shards", images], use_bin_type=True)))

    want = one_process()
    for w in workers:
        assert (await w.router.hash_across(pb.HashRequest())).hash == want
    # A revision floor on every shard (a fence after answered reads, a watch closing
    # idle shards) changes no key: the Hash stays, as a quiet etcd's does.
    top = max(int(w.backend.latest_revision()) for w in workers) + 1000
    for w in workers:
        mine = [s for s in range(SHARDS) if PLAN.worker_of_shard(s) == workers.index(w)]
        await w.backend.floor(mine, top)
    for w in workers:
        assert (await w.router.hash_across(pb.HashRequest())).hash == want
    await workers[1].backend.put(pb.PutRequest(key=keys_of(1, 1)[0], value=b"changed"))
    changed = one_process()
    assert changed != want
    assert (await workers[0].router.hash_across(pb.HashRequest())).hash == changed


async def test_move_leader_hands_both_workers_groups_to_the_target(
        workers: list[Worker]) -> None:
    """MoveLeader through either worker: checked by worker 0 (its home group's leader is
    the node's), then every group each worker leads handed to the target; once this
    member leads nothing, refused as etcd refuses a follower, nothing handed over."""
    with pytest.raises(EtcdError) as e:
        await workers[1].router.move_leader_across(pb.MoveLeaderRequest(targetID=9))
    assert "transferee" in e.value.message
    assert not any(w.host.transfers for w in workers)
    await workers[1].router.move_leader_across(pb.MoveLeaderRequest(targetID=2))
    for k, w in enumerate(workers):
        assert sorted(w.host.transfers) == [(kv_group(s), 2) for s in PLAN.shards_of(k)]
    with pytest.raises(EtcdError) as e:
        await workers[0].router.move_leader_across(pb.MoveLeaderRequest(targetID=3))
    assert "not leader" in e.value.message
    assert all(t == 2 for w in workers for _g, t in w.host.transfers)


async def test_a_backup_through_either_worker_holds_both_workers_shards_at_one_cut(
        workers: list[Worker]) -> None:
    """A Snapshot through either worker (``workerbackup.py``): every shard captured by
    its owner, cut back to one revision at or above every write before it, a write
    after it absent; the file is a node of one process's (``snapfile``), every KV shard
    in it. The broken variant captures the other worker's shards from this worker's
    empty copies: their keys are missing."""
    revs = await fill(workers)
    for k, w in enumerate(workers):
        rev, blob = await w.backend.snapshot()
        assert rev >= max(revs.values())
        snap = snapfile.decode(blob)
        assert snap.revision == rev
        assert snap.kv_groups == tuple(kv_group(s) for s in range(SHARDS))
        got = {}
        for gid in snap.kv_groups:
            m = KVStateMachine()
            m.restore(snap.groups[gid])
            got.update({kv.key: kv.mod_revision for kv in m.range(EVERY).kvs})
        assert got == revs, k
    later = await workers[1].backend.put(pb.PutRequest(key=keys_of(1, 1)[0], value=b"later"))
    rev, blob = await workers[0].backend.snapshot()
    assert rev >= later.header.revision

    async def from_empty_copies(rev: int) -> dict[int, bytes]:
        b = workers[0].backend
        return {kv_group(s): KVStateMachine.image_at(b.machines[s].prepare_snapshot()(), rev)
                for s in range(SHARDS)}

    workers[0].router.backups.local_capture = from_empty_copies  # type: ignore[method-assign]
    workers[0].router.backups._capture = (  # type: ignore[method-assign]
        lambda _worker, rev: from_empty_copies(rev))
    _rev, blob = await workers[0].backend.snapshot()
    snap = snapfile.decode(blob)
    keys = set()
    for gid in snap.kv_groups:
        m = KVStateMachine()
        m.restore(snap.groups[gid])
        keys.update(kv.key for kv in m.range(EVERY).kvs)
    assert keys != set(revs)


@pytest.mark.parametrize("n", [1, 3, 6])
async def test_automatic_compaction_counts_the_writes_of_both_workers(
        workers: list[Worker], n: int) -> None:
    """Worker 0 runs a node's automatic compaction (``Node._compaction_loop``): revision
    mode's "``n`` writes ago" is gathered from both workers (``RevisionsWritten``), a Txn
    over both counted once, as one process counts it; periodic mode's sample is the
    store's latest over both (``RevisionState``). What worker 0 alone holds gives another
    answer: without the gather, compaction would keep the wrong history."""
    written: list[int] = []
    for key in [*keys_of(0, 3), *keys_of(1, 2)]:
        owner = workers[PLAN.worker_of_shard(shard_of(key, SHARDS))].backend
        written.append(int((await owner.put(pb.PutRequest(key=key, value=b"v"))).header.revision))
    home, keys = record_worker_and_keys()
    txn = await workers[home].backend.txn(pb.TxnRequest(success=[
        pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"t")) for k in keys]))
    assert txn.succeeded
    written.append(int(txn.header.revision))
    for key in keys_of(1, 4)[2:]:  # the latest writes on worker 1's shards
        written.append(int((await workers[1].backend.put(
            pb.PutRequest(key=key, value=b"w"))).header.revision))
    await settled(workers)
    assert len(set(written)) == len(written) == 8
    want = sorted(written)[-(n + 1)]
    for w in workers:
        assert await w.router.revision_writes_ago(n) == want
        assert await w.router.revision_writes_ago(len(written)) == 0  # the whole history
        assert await w.router.store_revision() >= max(written)
    alone = workers[0].backend
    assert nth_latest(alone.revisions_written(PLAN.shards_of(0), n + 1), n) != want
