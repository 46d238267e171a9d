"""Leases: grant, revoke, keepalive, time-to-live, list, leader-decided expiry, checkpoints."""

from __future__ import annotations

import grpc
import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError
from accord.services.kv.limits import Limits
from accord.services.kv.statemachine import ExpireResult
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.kv.helpers import get, put


def grant(sm: SM, ttl: int, now_ms: int = 0, lease_id: int = 0, term: int = 0) -> pb.LeaseGrantResponse:
    resp = sm.apply(SM.encode_lease_grant(pb.LeaseGrantRequest(TTL=ttl, ID=lease_id), now_ms, term))
    assert isinstance(resp, pb.LeaseGrantResponse)
    return resp


def ttl_of(sm: SM, lease_id: int, now_ms: int | None = None, keys: bool = False) -> pb.LeaseTimeToLiveResponse:
    return sm.lease_time_to_live(pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys), now_ms)


def test_grant_clamps_ttl_up_to_the_minimum() -> None:
    sm = SM()
    resp = grant(sm, 1)
    assert resp.TTL == 2 and resp.ID != 0
    assert grant(SM(limits=Limits(min_lease_ttl_s=5)), 3).TTL == 5


def test_grant_too_large_ttl_and_id_collision() -> None:
    sm = SM()
    with pytest.raises(EtcdError) as ei:
        grant(sm, 9_000_000_001)
    assert ei.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert ei.value.message == "etcdserver: too large lease TTL"
    assert grant(sm, 10, lease_id=42).ID == 42
    with pytest.raises(EtcdError) as ei:
        sm.validate_lease_grant(pb.LeaseGrantRequest(TTL=10, ID=42))
    assert ei.value == errors.LEASE_EXISTS
    with pytest.raises(EtcdError) as ei:
        grant(sm, 10, lease_id=42)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert ei.value.message == "etcdserver: lease already exists"


def test_server_chosen_ids_are_deterministic_and_distinct() -> None:
    a, b = SM(), SM()
    ids_a = [grant(a, 10).ID for _ in range(20)]
    ids_b = [grant(b, 10).ID for _ in range(20)]
    assert ids_a == ids_b and len(set(ids_a)) == 20 and all(i > 0 for i in ids_a)
    assert grant(SM(lease_id_seed=7), 10).ID != ids_a[0]


def test_lease_count_limit() -> None:
    sm = SM(limits=Limits(max_leases=2))
    grant(sm, 10)
    grant(sm, 10)
    with pytest.raises(EtcdError) as ei:
        grant(sm, 10)
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(sm.lease_leases().leases) == 2


def test_revoke_deletes_attached_keys_in_one_revision() -> None:
    sm = SM()
    lid = grant(sm, 60).ID
    put(sm, b"a", lease=lid)
    put(sm, b"b", lease=lid)
    put(sm, b"c")
    put(sm, b"b", lease=0)  # detached: survives the revoke
    rev = sm.revision
    resp = sm.apply(SM.encode_lease_revoke(pb.LeaseRevokeRequest(ID=lid)))
    assert isinstance(resp, pb.LeaseRevokeResponse) and resp.header.revision == rev + 1
    assert sm.revision == rev + 1
    assert get(sm, b"a").count == 0 and get(sm, b"b").count == 1 and get(sm, b"c").count == 1
    assert ttl_of(sm, lid).TTL == -1
    with pytest.raises(EtcdError) as ei:
        sm.apply(SM.encode_lease_revoke(pb.LeaseRevokeRequest(ID=lid)))
    assert ei.value.code == grpc.StatusCode.NOT_FOUND
    assert ei.value.message == "etcdserver: requested lease not found"


def test_revoke_of_lease_without_keys_does_not_bump() -> None:
    sm = SM()
    lid = grant(sm, 60).ID
    sm.apply(SM.encode_lease_revoke(pb.LeaseRevokeRequest(ID=lid)))
    assert sm.revision == 1


def test_keepalive_time_to_live_and_list() -> None:
    sm = SM()
    lid = grant(sm, 10, now_ms=1_000).ID
    put(sm, b"k1", lease=lid)
    put(sm, b"k0", lease=lid)
    t = ttl_of(sm, lid, now_ms=4_500, keys=True)
    assert (t.TTL, t.grantedTTL, list(t.keys)) == (6, 10, [b"k0", b"k1"])
    ka = sm.apply(SM.encode_lease_keepalive(lid, 8_000))
    assert isinstance(ka, pb.LeaseKeepAliveResponse) and (ka.ID, ka.TTL) == (lid, 10)
    assert ttl_of(sm, lid, now_ms=8_000).TTL == 10
    assert ttl_of(sm, lid).TTL == 10  # default: the replicated clock
    unknown = sm.apply(SM.encode_lease_keepalive(999, 8_000))
    assert isinstance(unknown, pb.LeaseKeepAliveResponse) and unknown.TTL == 0
    assert ttl_of(sm, 999).TTL == -1
    assert [s.ID for s in sm.lease_leases().leases] == [lid]


def test_expiry_is_decided_by_the_leader_and_rechecked_on_apply() -> None:
    sm = SM()
    a = grant(sm, 5, now_ms=0).ID
    b = grant(sm, 10, now_ms=0).ID
    put(sm, b"a1", lease=a)
    put(sm, b"a2", lease=a)
    put(sm, b"b1", lease=b)
    assert sm.expired_leases(4_999) == []
    assert sm.expired_leases(5_000) == [a]
    assert sm.expired_leases(5_000) == [a]  # stays due until the expire is applied
    # a keepalive commits before the expire: the expire must not revoke it
    sm.apply(SM.encode_lease_keepalive(a, 4_000))
    res = sm.apply(SM.encode_lease_expire([a], 5_000))
    assert isinstance(res, ExpireResult) and res.revoked == []
    assert sm.expired_leases(9_000) == [a]
    rev = sm.revision
    res = sm.apply(SM.encode_lease_expire(sm.expired_leases(10_000), 10_000))
    assert isinstance(res, ExpireResult) and sorted(res.revoked) == sorted([a, b])
    assert sm.revision == rev + 1 and res.revision == rev + 1  # all keys in one revision
    assert get(sm, b"\x00", b"\x00").count == 0
    assert sm.lease_leases().leases == []


def test_keepalive_of_overdue_lease_reports_not_found() -> None:
    sm = SM()
    lid = grant(sm, 2, now_ms=0).ID
    sm.apply(SM.encode_lease_checkpoint(3_000))
    ka = sm.apply(SM.encode_lease_keepalive(lid, 3_000))
    assert isinstance(ka, pb.LeaseKeepAliveResponse) and ka.TTL == 0


def test_leader_change_neither_resets_nor_shortens_the_ttl() -> None:
    sm = SM()
    lid = grant(sm, 30, now_ms=100_000, term=1).ID  # old leader's clock domain
    sm.apply(SM.encode_lease_checkpoint(120_000, term=1))  # 20 s later: 10 s left
    # new leader, unrelated clock (e.g. a monotonic clock of another machine)
    sm.apply(SM.encode_lease_checkpoint(5_000, term=2))
    assert ttl_of(sm, lid, now_ms=5_000).TTL == 10
    assert sm.expired_leases(14_999, term=2) == []
    assert sm.expired_leases(15_000, term=2) == [lid]
    # a leader of a term whose checkpoint hasn't applied yet sees nothing to expire
    assert sm.expired_leases(10**9, term=3) == []


def test_checkpoint_request_sets_remaining_ttl() -> None:
    sm = SM()
    lid = grant(sm, 100, now_ms=0).ID
    req = pb.LeaseCheckpointRequest(checkpoints=[pb.LeaseCheckpoint(ID=lid, remaining_TTL=7)])
    sm.apply(SM.encode_lease_checkpoint(1_000, 0, req))
    assert ttl_of(sm, lid, now_ms=1_000).TTL == 7


def test_clock_never_goes_backwards_within_a_term() -> None:
    sm = SM()
    lid = grant(sm, 10, now_ms=50_000).ID
    sm.apply(SM.encode_lease_checkpoint(1_000))  # stale reading: ignored
    assert sm.leases.clock_ms == 50_000
    assert ttl_of(sm, lid).TTL == 10


def test_lease_state_survives_snapshot() -> None:
    sm = SM()
    lid = grant(sm, 10, now_ms=1_000, term=3).ID
    put(sm, b"x", lease=lid)
    other = SM()
    other.restore(sm.snapshot())
    assert ttl_of(other, lid, now_ms=2_000, keys=True).keys == [b"x"]
    assert other.expired_leases(11_000, term=3) == [lid]
    res = other.apply(SM.encode_lease_expire([lid], 11_000, 3))
    assert isinstance(res, ExpireResult) and res.revoked == [lid]
    assert get(other, b"x").count == 0


def test_lease_checkpoints_of_a_quiet_store_leave_its_hash_alone() -> None:
    """etcd's Hash of a store nothing writes stays the same. The leader's lease checkpoints
    (every few seconds, in its term and the next) move only the replicated lease clock and
    the deadlines in it: the Hash image leaves them out (etcd's covers a lease's id and
    TTL), the snapshot keeps them (a restore needs them)."""
    sm = SM()
    put(sm, b"k")
    lid = grant(sm, 60, now_ms=10_000, term=1).ID
    hashed, snap = sm.prepare_hash()(), sm.prepare_snapshot()()
    sm.apply(SM.encode_lease_checkpoint(15_000, term=1))
    assert sm.prepare_hash()() == hashed
    assert sm.prepare_snapshot()() != snap
    sm.apply(SM.encode_lease_checkpoint(900, term=2))  # a new leader's unrelated clock
    assert sm.prepare_hash()() == hashed
    assert ttl_of(sm, lid, now_ms=900).TTL == 55
    put(sm, b"k", b"changed")
    assert sm.prepare_hash()() != hashed
    changed = sm.prepare_hash()()
    grant(sm, 30, now_ms=1_000, term=2)
    assert sm.prepare_hash()() != changed
