"""Property test: random lease workloads (grant, attach, keepalive, time passing, expiry,
revoke, delete) agree with a naive model of deadlines and attached keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from accord.proto import rpc_pb2 as pb
from accord.services.kv import errors
from accord.services.kv.errors import EtcdError
from accord.services.kv.statemachine import ExpireResult
from accord.services.kv.statemachine import KVStateMachine as SM
from tests.kv.helpers import delete, get, put

KEYS = [b"a", b"b", b"c", b"d"]


@dataclass
class LeaseModel:
    ttl: int
    deadline: int
    keys: set[bytes] = field(default_factory=set)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("grant"), st.integers(-1, 5)),
        st.tuples(st.just("advance"), st.integers(0, 3_000)),
        st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(-1, 3)),
        st.tuples(st.just("keepalive"), st.integers(0, 3)),
        st.tuples(st.just("expire"),),
        st.tuples(st.just("revoke"), st.integers(0, 3)),
        st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    ),
    max_size=40,
)


@given(ops)
def test_leases_agree_with_naive_model(program: list[tuple]) -> None:  # type: ignore[type-arg]
    sm = SM()
    now = 1_000
    ids: list[int] = []  # every id ever granted (revoked ones stay, to test not-found)
    model: dict[int, LeaseModel] = {}
    owner: dict[bytes, int] = {}  # live key -> lease (0 = none)

    def lease_at(i: int) -> int:
        return ids[i % len(ids)] if ids else 424242

    for op in program:
        kind = op[0]
        if kind == "grant":
            resp = sm.apply(SM.encode_lease_grant(pb.LeaseGrantRequest(TTL=op[1]), now))
            assert isinstance(resp, pb.LeaseGrantResponse)
            ttl = max(op[1], 2)
            assert resp.TTL == ttl and resp.ID not in model
            ids.append(resp.ID)
            model[resp.ID] = LeaseModel(ttl, now + ttl * 1000)
        elif kind == "advance":
            now += op[1]
            sm.apply(SM.encode_lease_checkpoint(now))
        elif kind == "put":
            _, key, which = op
            lid = 0 if which < 0 else lease_at(which)
            try:
                put(sm, key, lease=lid)
            except EtcdError as e:
                assert e == errors.LEASE_NOT_FOUND and lid not in model
                continue
            assert lid == 0 or lid in model
            old = owner.get(key, 0)
            if old:
                model[old].keys.discard(key)
            owner[key] = lid
            if lid:
                model[lid].keys.add(key)
        elif kind == "keepalive":
            lid = lease_at(op[1])
            resp = sm.apply(SM.encode_lease_keepalive(lid, now))
            assert isinstance(resp, pb.LeaseKeepAliveResponse)
            m = model.get(lid)
            if m is None or m.deadline <= now:
                assert resp.TTL == 0
            else:
                assert resp.TTL == m.ttl
                m.deadline = now + m.ttl * 1000
        elif kind == "expire":
            due = sm.expired_leases(now)
            assert sorted(due) == sorted(i for i, m in model.items() if m.deadline <= now)
            res = sm.apply(SM.encode_lease_expire(due, now))
            assert isinstance(res, ExpireResult) and sorted(res.revoked) == sorted(due)
            for lid in due:
                for key in model.pop(lid).keys:
                    del owner[key]
        elif kind == "revoke":
            lid = lease_at(op[1])
            try:
                sm.apply(SM.encode_lease_revoke(pb.LeaseRevokeRequest(ID=lid)))
            except EtcdError as e:
                assert e == errors.LEASE_NOT_FOUND and lid not in model
                continue
            for key in model.pop(lid).keys:
                del owner[key]
        else:
            resp_d = delete(sm, op[1])
            assert resp_d.deleted == (1 if op[1] in owner else 0)
            lid = owner.pop(op[1], 0)
            if lid:
                model[lid].keys.discard(op[1])

        # the whole observable state agrees with the model
        live = get(sm, b"\x00", b"\x00")
        assert {kv.key: kv.lease for kv in live.kvs} == owner
        by_expiry = sorted(model, key=lambda i: (model[i].deadline, i))
        assert [s.ID for s in sm.lease_leases().leases] == by_expiry
        for lid in ids:
            t = sm.lease_time_to_live(pb.LeaseTimeToLiveRequest(ID=lid, keys=True), now)
            m = model.get(lid)
            if m is None:
                assert t.TTL == -1
            else:
                assert t.TTL == max(0, (m.deadline - now) // 1000)
                assert set(t.keys) == m.keys and t.grantedTTL == m.ttl

    copy = SM()
    copy.restore(sm.snapshot())
    assert copy.snapshot() == sm.snapshot()
    assert sorted(copy.expired_leases(now + 10**7)) == sorted(model)
