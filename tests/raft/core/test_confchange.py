"""ConfChange encoding, simple changes and joint consensus transitions."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.raft.core.confchange import (
    ConfChange,
    ConfChangeError,
    ConfChangeSingle,
    ConfChangeType,
    apply_conf_change,
    is_joint,
    members,
    uses_joint,
)
from accord.raft.core.types import ConfState

AV, AL, RM = ConfChangeType.ADD_VOTER, ConfChangeType.ADD_LEARNER, ConfChangeType.REMOVE_NODE


def cc(*changes: tuple[ConfChangeType, int], auto_leave: bool = True, joint: bool = False
       ) -> ConfChange:
    return ConfChange(tuple(ConfChangeSingle(t, n) for t, n in changes), auto_leave, joint)


def test_encode_decode_roundtrip() -> None:
    for c in (cc(), cc((AV, 4)), cc((AV, 4), (RM, 1), (AL, 9), auto_leave=False, joint=True)):
        assert ConfChange.decode(c.encode()) == c


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\xc1", "msgpack"),
        (msgpack.packb([1, 2]), "3-element"),
        (msgpack.packb([[[7, 1]], True, False]), "unknown conf change type"),
        (msgpack.packb([[[0, 0]], True, False]), "node id must be > 0"),
        (msgpack.packb([[[0, 2], [1, 2]], True, False]), "more than once"),
        (msgpack.packb([[["a", 2]], True, False]), "not \\[type, node_id\\]"),
        (msgpack.packb([[], "yes", False]), "wrong types"),
    ],
)
def test_decode_rejects_malformed(data: bytes, match: str) -> None:
    with pytest.raises(ConfChangeError, match=match):
        ConfChange.decode(data)


def test_simple_changes() -> None:
    cs = ConfState(voters=(1, 2, 3))
    assert apply_conf_change(cs, cc((AV, 4))).voters == (1, 2, 3, 4)
    assert apply_conf_change(cs, cc((RM, 3))).voters == (1, 2)
    demoted = apply_conf_change(cs, cc((AL, 3)))
    assert demoted.voters == (1, 2) and demoted.learners == (3,)
    promoted = apply_conf_change(demoted, cc((AV, 3)))
    assert promoted == cs
    # learners may change freely alongside one voter change
    both = apply_conf_change(cs, cc((AV, 4), (AL, 7), (AL, 8)))
    assert both.voters == (1, 2, 3, 4) and both.learners == (7, 8)
    assert not uses_joint(cs, cc((AV, 4), (AL, 7), (RM, 9)))


def test_simple_refuses_removing_last_voter() -> None:
    with pytest.raises(ConfChangeError, match="every voter"):
        apply_conf_change(ConfState(voters=(1,)), cc((RM, 1)))


def test_enter_and_leave_joint() -> None:
    cs = ConfState(voters=(1, 2, 3), learners=(9,))
    change = cc((AV, 4), (AV, 5), (RM, 1), (AL, 2))
    assert uses_joint(cs, change)
    joint = apply_conf_change(cs, change)
    assert is_joint(joint)
    assert joint.voters == (3, 4, 5)
    assert joint.voters_outgoing == (1, 2, 3)
    assert joint.learners == (9,)
    assert joint.learners_next == (2,)  # still an outgoing voter until we leave
    assert joint.auto_leave
    assert members(joint) == frozenset({1, 2, 3, 4, 5, 9})
    left = apply_conf_change(joint, ConfChange.leave())
    assert left == ConfState(voters=(3, 4, 5), learners=(2, 9))


def test_forced_joint_for_single_change() -> None:
    cs = ConfState(voters=(1, 2, 3))
    joint = apply_conf_change(cs, cc((AV, 4), joint=True, auto_leave=False))
    assert is_joint(joint) and not joint.auto_leave


def test_joint_transition_errors() -> None:
    cs = ConfState(voters=(1, 2, 3))
    with pytest.raises(ConfChangeError, match="not in a joint"):
        apply_conf_change(cs, ConfChange.leave())
    joint = apply_conf_change(cs, cc((AV, 4), (AV, 5)))
    with pytest.raises(ConfChangeError, match="leave it before"):
        apply_conf_change(joint, cc((AV, 6)))
    with pytest.raises(ConfChangeError, match="removes every voter"):
        apply_conf_change(cs, cc((RM, 1), (RM, 2), (RM, 3)))


_single = st.builds(ConfChangeSingle, st.sampled_from(list(ConfChangeType)),
                    st.integers(min_value=1, max_value=6))


@given(st.lists(st.tuples(st.lists(_single, max_size=4), st.booleans(), st.booleans()),
                max_size=12))
def test_random_change_sequences_keep_config_invariants(
    steps: list[tuple[list[ConfChangeSingle], bool, bool]],
) -> None:
    cs = ConfState(voters=(1, 2, 3))
    for singles, auto_leave, joint in steps:
        change = ConfChange(tuple(singles), auto_leave, joint)
        try:
            new = apply_conf_change(cs, change)
        except ConfChangeError:
            continue
        incoming, learners = set(new.voters), set(new.learners)
        assert incoming, "a config always has voters"
        assert not incoming & learners, "no node is both voter and learner"
        assert not set(new.learners_next) & incoming
        assert set(new.learners_next) <= set(new.voters_outgoing)
        assert not set(new.learners_next) & learners
        assert not learners & set(new.voters_outgoing), "outgoing voters become learners via learners_next"
        if not is_joint(cs) and not is_joint(new):
            # simple changes move at most one voter
            assert len(incoming ^ set(cs.voters)) <= 1
        if is_joint(new) and not change.leave_joint:
            assert set(new.voters_outgoing) == set(cs.voters)
        cs = new
