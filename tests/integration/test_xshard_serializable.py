"""Serializable reads over shards during two-shard Txns, on real daemons (3 members,
``--shards 8``, one process each and two workers each).

etcd's serializable read is served by the member it reaches, possibly stale, but it
shows one revision of the store: a Txn whole or not at all. Here two clients write the
same two keys, on different shards, by two-shard Txns through two members, and a client
on every member reads both keys serializably in a loop. On each member a shard's
replica applies its own log at its own pace and a participant's share lands after the
record shard's decision (``docs/txn.md``); no answer may show one key of a Txn without
the other. Before the fix, a third of these reads did.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.proto import rpc_pb2_grpc
from accord.services.kv.ranges import prefix_end
from accord.services.kv.sharding import shard_of
from tests.integration.cluster import ProcCluster

SHARDS = 8
SECONDS = 4.0
PREFIX = b"/sertorn/"


@pytest.fixture(scope="module", params=[(), ("--workers", "2")], ids=["one-worker", "two-workers"])
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("sertorn"), 3,
                     extra=("--shards", str(SHARDS), *request.param)) as c:
        c.wait_published()
        yield c


def test_a_serializable_read_over_shards_never_shows_part_of_a_txn(cluster: ProcCluster) -> None:
    names = [PREFIX + b"%d" % i for i in range(40)]
    k0 = names[0]
    k1 = next(n for n in names if shard_of(n, SHARDS) != shard_of(k0, SHARDS))
    stop = time.monotonic() + SECONDS
    written = [0, 0]
    reads: dict[str, list[int]] = {}
    torn: list[tuple[str, int, dict[bytes, bytes]]] = []
    errors: list[BaseException] = []

    def write(member: int) -> None:
        try:
            with grpc.insecure_channel(cluster.nodes[member].endpoint) as ch:
                kv = rpc_pb2_grpc.KVStub(ch)
                while time.monotonic() < stop:
                    value = b"%d-%d" % (member, written[member])
                    kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
                        key=k, value=value)) for k in (k0, k1)]), timeout=10)
                    written[member] += 1
        except BaseException as e:  # reported below
            errors.append(e)

    def read(member: int) -> None:
        name = cluster.nodes[member].name
        reads[name] = [0, 0]
        try:
            with grpc.insecure_channel(cluster.nodes[member].endpoint) as ch:
                kv = rpc_pb2_grpc.KVStub(ch)
                while time.monotonic() < stop:
                    got = kv.Range(pb.RangeRequest(key=PREFIX, range_end=prefix_end(PREFIX),
                                                   serializable=True), timeout=10)
                    values = {x.key: x.value for x in got.kvs}
                    reads[name][0] += 1
                    reads[name][1] += len(values) == 2
                    if values and (len(values) != 2 or values[k0] != values[k1]):
                        torn.append((name, int(got.header.revision), values))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(m,)) for m in (0, 1)]
    threads += [threading.Thread(target=read, args=(m,)) for m in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SECONDS + 30)
    assert not errors, errors
    assert not torn, torn[:5]
    assert min(written) > 10, written
    # every member answered, and saw the Txns' writes (not only the state before them)
    assert all(n > 50 and whole > 0 for n, whole in reads.values()), reads
