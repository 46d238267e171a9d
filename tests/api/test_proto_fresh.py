"""The committed generated protobuf modules match their .proto sources, and the
wire names clients depend on (services, packages, key field numbers) are etcd's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from accord.proto import kv_pb2, rpc_pb2, v3election_pb2, v3lock_pb2

REPO = Path(__file__).resolve().parents[2]


def test_generated_modules_are_fresh() -> None:
    proc = subprocess.run(
        [str(REPO / "scripts" / "check-proto")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_service_full_names_are_etcds() -> None:
    services = {
        s.full_name
        for mod in (rpc_pb2, v3lock_pb2, v3election_pb2)
        for s in mod.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "etcdserverpb.KV",
        "etcdserverpb.Watch",
        "etcdserverpb.Lease",
        "etcdserverpb.Cluster",
        "etcdserverpb.Maintenance",
        "etcdserverpb.Auth",
        "v3lockpb.Lock",
        "v3electionpb.Election",
    }
    methods = {m.name for m in rpc_pb2.DESCRIPTOR.services_by_name["Maintenance"].methods}
    assert {"Downgrade", "Snapshot", "HashKV", "MoveLeader"} <= methods
    assert "AuthStatus" in {m.name for m in rpc_pb2.DESCRIPTOR.services_by_name["Auth"].methods}
    assert "MemberPromote" in {
        m.name for m in rpc_pb2.DESCRIPTOR.services_by_name["Cluster"].methods
    }


def test_known_etcd_encodings() -> None:
    # Byte strings as etcd's Go client encodes them (field numbers and wire types).
    assert kv_pb2.KeyValue(key=b"k", lease=5).SerializeToString() == b"\n\x01k0\x05"
    assert (
        rpc_pb2.Compare(key=b"k", range_end=b"l").SerializeToString() == b"\x1a\x01k\x82\x04\x01l"
    )
    req = rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())
    assert req.SerializeToString() == b"\x1a\x00"
    create = rpc_pb2.WatchCreateRequest(key=b"a", watch_id=3, fragment=True)
    assert create.SerializeToString() == b"\n\x01a8\x03@\x01"
    assert rpc_pb2.WatchResponse(events=[kv_pb2.Event()]).SerializeToString() == b"Z\x00"
    assert rpc_pb2.StatusResponse(isLearner=True).SerializeToString() == b"P\x01"
    assert rpc_pb2.Member(isLearner=True).SerializeToString() == b"(\x01"
