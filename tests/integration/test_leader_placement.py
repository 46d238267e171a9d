"""Leaderships follow the workload: a shard whose clients all talk to one member ends up
led by that member, so its requests stop paying a hop to another node's leader, and
the writes made while it moves all succeed and are applied once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc

from accord.node.backend import kv_group
from accord.node.members import DEBUG_GROUPS_METHOD
from accord.proto import rpc_pb2 as pb
from accord.services.kv.sharding import shard_of
from tests.integration.cluster import ProcCluster, ProcNode

SHARDS = 4


def _leaders(node: ProcNode) -> dict[int, int]:
    raw = node.channel().unary_unary(DEBUG_GROUPS_METHOD)(b"", timeout=2.0)
    report = json.loads(raw)
    return {int(gid): g["leader"] for gid, g in report["groups"].items()}


def _member_id(cluster: ProcCluster, node: ProcNode) -> int:
    return int(cluster.status(node).header.member_id)


def test_a_shard_written_through_one_member_comes_to_be_led_by_it(tmp_path: Path) -> None:
    cluster = ProcCluster(tmp_path, 3, extra=(
        "--shards", str(SHARDS), "--leader-balance-interval", "200",
        "--leader-follow-requests", "10"))
    try:
        cluster.start_all()
        key = b"placement/key"
        gid = kv_group(shard_of(key, SHARDS))
        cluster.put(key, b"0")
        ids = {_member_id(cluster, n): n for n in cluster.nodes}
        puts = 1
        for round_ in range(2):  # to one member, then on to another
            leader = _leaders(cluster.nodes[0])[gid]
            client = next(n for i, n in ids.items() if i != leader)
            kv = client.kv()
            deadline = time.monotonic() + 20
            written = 0
            while time.monotonic() < deadline:
                value = f"{round_}-{written}".encode()
                r = kv.Put(pb.PutRequest(key=key, value=value), timeout=5.0)
                assert r.header.revision > 0
                written += 1
                puts += 1
                if written % 20 == 0 and _leaders(client)[gid] == _member_id(cluster, client):
                    break
            assert _leaders(client)[gid] == _member_id(cluster, client), (
                f"round {round_}: {written} puts through {client.name} and it does not "
                f"lead group {gid}")
            # Every put was applied exactly once: the key's version counts them.
            got = kv.Range(pb.RangeRequest(key=key), timeout=5.0).kvs[0]
            assert (got.value, got.version) == (f"{round_}-{written - 1}".encode(), puts)
    except grpc.RpcError as e:
        raise AssertionError(f"a put failed while leadership moved: {e}") from e
    finally:
        cluster.stop_all()
