"""The meta group's member table: runtime member commands and joining-node ids.

Every command is applied the same way on every replica, refuses bad input with the
etcd error it maps to and changes nothing then; snapshots carry removed ids.
"""

from __future__ import annotations

import pytest

from accord.node.config import Config, ConfigError, joined_member_id, member_id
from accord.services.cluster.members import (
    ClusterStateMachine,
    MemberChangeError,
    MemberRecord,
    ShardPlacement,
)

A, B = 11, 22


def table() -> ClusterStateMachine:
    t = ClusterStateMachine(
        {A: MemberRecord(A, "a", ("http://h:1",)), B: MemberRecord(B, "b", ("http://h:2",))},
        [ShardPlacement(0, 2, (A, B)), ShardPlacement(1, 101, (A, B))])
    return t


def kind_of(t: ClusterStateMachine, cmd: bytes) -> str:
    with pytest.raises(MemberChangeError) as e:
        t.apply(1, cmd)
    return e.value.kind


def test_add_publish_promote_update_remove() -> None:
    t = table()
    seen: list[int] = []
    t.listeners.append(lambda: seen.append(len(t.members)))
    rec = t.apply(1, ClusterStateMachine.encode_add(33, ["http://h:3"], True))
    assert isinstance(rec, MemberRecord) and rec.name == "" and rec.is_learner
    assert all(p.replicas == (A, B, 33) for p in t.shard_map)
    t.apply(2, ClusterStateMachine.encode_publish(33, "c", ["http://h:9"]))
    assert t.members[33].name == "c" and t.members[33].client_urls == ("http://h:9",)
    t.apply(3, ClusterStateMachine.encode_promote(33))
    assert not t.members[33].is_learner
    t.apply(4, ClusterStateMachine.encode_update(33, ["http://h:4"]))
    assert t.members[33].peer_urls == ("http://h:4",)
    t.apply(5, ClusterStateMachine.encode_remove(A))
    assert A not in t.members and t.removed == {A: 5}
    assert all(p.replicas == (B, 33) for p in t.shard_map)
    assert seen == [3, 3, 3, 3, 2]


def test_bad_commands_are_refused_and_change_nothing() -> None:
    t = table()
    before = t.snapshot()
    assert kind_of(t, ClusterStateMachine.encode_add(33, ["http://h:1"], False)) == "url_exists"
    assert kind_of(t, ClusterStateMachine.encode_add(A, ["http://h:7"], False)) == "exists"
    assert kind_of(t, ClusterStateMachine.encode_remove(99)) == "not_found"
    assert kind_of(t, ClusterStateMachine.encode_promote(A)) == "not_learner"
    assert kind_of(t, ClusterStateMachine.encode_update(A, ["http://h:2"])) == "url_exists"
    assert t.snapshot() == before
    t.apply(1, ClusterStateMachine.encode_remove(A))
    assert kind_of(t, ClusterStateMachine.encode_add(A, ["http://h:8"], False)) == "removed"


def test_snapshot_round_trip_keeps_removed_ids() -> None:
    t = table()
    t.apply(1, ClusterStateMachine.encode_add(33, ["http://h:3"], False))
    t.apply(2, ClusterStateMachine.encode_remove(B))
    other = ClusterStateMachine({}, [])
    other.restore(t.snapshot())
    assert other.snapshot() == t.snapshot() and other.removed == {B: 2}


def test_a_joining_node_computes_the_id_member_add_gives_it() -> None:
    urls = ["http://127.0.0.1:7002", "http://127.0.0.1:7001"]
    assert joined_member_id(urls, "tok") == joined_member_id(list(reversed(urls)), "tok")
    assert joined_member_id(urls, "tok") != joined_member_id(urls, "other")
    cfg = Config(name="n4", cluster_token="tok", initial_cluster_state="existing",
                 initial_cluster="n1=http://127.0.0.1:7000,n4=http://127.0.0.1:7001").resolved()
    assert cfg.member_id == joined_member_id(["http://127.0.0.1:7001"], "tok")
    founder = Config(name="n4", cluster_token="tok",
                     initial_cluster="n4=http://127.0.0.1:7001").resolved()
    assert founder.member_id == member_id("n4", "tok")
    # n1 may be a founder or a member added later: both ids are offered for it.
    assert cfg.peer_candidates() == {
        member_id("n1", "tok"): ("127.0.0.1", 7000),
        joined_member_id(["http://127.0.0.1:7000"], "tok"): ("127.0.0.1", 7000),
    }


def test_member_dead_after_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="member-dead-after -1 s: must be >= 0"):
        Config(name="n1", member_dead_after=-1).resolved().validate()
    Config(name="n1", member_dead_after=30).resolved().validate()


def test_repair_counts_a_member_dead_only_when_swim_does_not_hold_it_alive() -> None:
    """A down Raft link alone is not a death while SWIM still sees the member."""
    from types import SimpleNamespace

    from accord.membership.state import Member, MemberState
    from accord.node.members import MemberChanges
    from accord.raft.core.types import ConfState, Role
    from accord.services.cluster.members import ClusterStateMachine, MemberRecord

    me, peer = 1, 2
    core = SimpleNamespace(role=Role.LEADER, conf_state=ConfState(voters=(me, peer)))
    swim_view: dict[str, Member] = {}
    node = SimpleNamespace(
        member_id=me,
        config=SimpleNamespace(member_dead_after=5),
        host=SimpleNamespace(group=lambda gid: SimpleNamespace(core=core)),
        transport=SimpleNamespace(connected=lambda nid: False),
        cluster=ClusterStateMachine({me: MemberRecord(me, "a", ()), peer: MemberRecord(peer, "b", ())}),
        membership=SimpleNamespace(running=True, view=swim_view),
    )
    changes = MemberChanges(node)  # type: ignore[arg-type]
    alive = Member("b", ("127.0.0.1", 1), 1, MemberState.ALIVE, {"id": f"{peer:x}"}, 0.0)
    swim_view["b"] = alive
    assert changes.dead_members(0.0) == [] and changes.dead_members(100.0) == []
    swim_view["b"] = Member("b", ("127.0.0.1", 1), 1, MemberState.DEAD, {"id": f"{peer:x}"}, 0.0)
    assert changes.dead_members(100.0) == []  # down since now
    assert changes.dead_members(106.0) == [peer]
