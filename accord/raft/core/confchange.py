"""Membership changes: the ConfChange command, its encoding, and the transitions.

A ``ConfChange`` lists single changes (add a voter, add a learner, remove a
node). How it is applied:

* at most one voter changes (and ``joint`` is not forced): the change is applied
  directly ("simple" change; one voter at a time keeps every old and new
  majority overlapping);
* otherwise the group enters joint consensus: the old voters become
  ``voters_outgoing`` and every decision needs a majority of both sets until the
  joint config is left;
* an empty ``ConfChange`` leaves the joint config. With ``auto_leave`` (the
  default) the leader proposes it by itself once the joint entry is applied.

All functions are pure: they take a ``ConfState`` and return a new one, or raise
``ConfChangeError`` saying what is wrong and changing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from accord.raft.core.types import ConfState


class ConfChangeError(ValueError):
    """A membership change that is malformed or not allowed from the current config."""


class ConfChangeType(IntEnum):
    """The kind of one single membership change (numbers are part of the encoding)."""

    ADD_VOTER = 0
    ADD_LEARNER = 1
    REMOVE_NODE = 2


@dataclass(frozen=True, slots=True)
class ConfChangeSingle:
    """One node's change."""

    type: ConfChangeType
    node_id: int


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A membership change proposal (see the module docstring for its semantics)."""

    changes: tuple[ConfChangeSingle, ...] = ()
    auto_leave: bool = True
    """Joint changes only: the leader leaves the joint config by itself."""
    joint: bool = False
    """Force joint consensus even for a change of at most one voter."""

    @property
    def leave_joint(self) -> bool:
        """An empty change is the instruction to leave the joint config."""
        return not self.changes

    @classmethod
    def leave(cls) -> ConfChange:
        """The change that leaves a joint config."""
        return cls()

    def encode(self) -> bytes:
        """msgpack bytes stored as the data of a CONF_CHANGE entry."""
        data: bytes = msgpack.packb(
            [[[int(c.type), c.node_id] for c in self.changes], self.auto_leave, self.joint],
            use_bin_type=True,
        )
        return data

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        """Parse ``encode`` output; raises ConfChangeError on anything malformed."""
        try:
            raw: Any = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise ConfChangeError(f"conf change is not valid msgpack: {exc}") from exc
        if not isinstance(raw, list) or len(raw) != 3:
            raise ConfChangeError("conf change must be a 3-element list [changes, auto_leave, joint]")
        items, auto_leave, joint = raw
        if not isinstance(items, list) or not isinstance(auto_leave, bool) or not isinstance(
            joint, bool
        ):
            raise ConfChangeError("conf change fields have the wrong types")
        changes = []
        for item in items:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
            ):
                raise ConfChangeError(f"conf change item {item!r} is not [type, node_id]")
            t, node = item
            try:
                ctype = ConfChangeType(t)
            except ValueError:
                raise ConfChangeError(f"unknown conf change type {t}") from None
            changes.append(ConfChangeSingle(ctype, node))
        cc = cls(tuple(changes), auto_leave, joint)
        validate(cc)
        return cc


def validate(cc: ConfChange) -> None:
    """Checks that do not depend on the current config (node ids, duplicates)."""
    seen: set[int] = set()
    for c in cc.changes:
        if c.node_id <= 0:
            raise ConfChangeError(f"node id must be > 0, got {c.node_id}")
        if c.node_id in seen:
            raise ConfChangeError(f"node {c.node_id} appears more than once in one conf change")
        seen.add(c.node_id)


def is_joint(cs: ConfState) -> bool:
    """Whether ``cs`` is a joint config."""
    return bool(cs.voters_outgoing)


def uses_joint(cs: ConfState, cc: ConfChange) -> bool:
    """Whether applying ``cc`` to ``cs`` enters a joint config."""
    if cc.leave_joint:
        return False
    if cc.joint:
        return True
    voters = set(cs.voters)
    changed = 0
    for c in cc.changes:
        is_voter = c.node_id in voters
        if (c.type == ConfChangeType.ADD_VOTER and not is_voter) or (
            c.type != ConfChangeType.ADD_VOTER and is_voter
        ):
            changed += 1
    return changed > 1


def apply_conf_change(cs: ConfState, cc: ConfChange) -> ConfState:
    """The config after ``cc``; raises ConfChangeError when ``cc`` is not allowed."""
    validate(cc)
    if not cs.voters:
        # Applying a change to an unknown membership would invent one (a joining
        # node replaying the log could make itself the only voter). Such a node
        # must be started with the group's membership or receive a snapshot.
        raise ConfChangeError("the current membership is empty (unknown); cannot apply a change")
    if cc.leave_joint:
        return _leave_joint(cs)
    if is_joint(cs):
        raise ConfChangeError("the group is in a joint config: leave it before another change")
    if uses_joint(cs, cc):
        return _enter_joint(cs, cc)
    return _simple(cs, cc)


def _apply_changes(
    voters: list[int], learners: list[int], learners_next: list[int],
    outgoing: frozenset[int], cc: ConfChange,
) -> None:
    for c in cc.changes:
        n = c.node_id
        if c.type == ConfChangeType.ADD_VOTER:
            if n in learners:
                learners.remove(n)
            if n in learners_next:
                learners_next.remove(n)
            if n not in voters:
                voters.append(n)
        elif c.type == ConfChangeType.ADD_LEARNER:
            if n in voters:
                voters.remove(n)
            if n in outgoing:
                # Still a voter of the outgoing half: it becomes a learner on leaving.
                if n not in learners_next:
                    learners_next.append(n)
            elif n not in learners:
                learners.append(n)
        else:
            for lst in (voters, learners, learners_next):
                if n in lst:
                    lst.remove(n)


def _simple(cs: ConfState, cc: ConfChange) -> ConfState:
    voters = list(cs.voters)
    learners = list(cs.learners)
    _apply_changes(voters, learners, [], frozenset(), cc)
    if len(set(voters) ^ set(cs.voters)) > 1:
        raise ConfChangeError("more than one voter changed without joint consensus")
    if not voters:
        raise ConfChangeError("the change removes every voter")
    return ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners)))


def _enter_joint(cs: ConfState, cc: ConfChange) -> ConfState:
    outgoing = frozenset(cs.voters)
    voters = list(cs.voters)
    learners = list(cs.learners)
    learners_next: list[int] = []
    _apply_changes(voters, learners, learners_next, outgoing, cc)
    if not voters:
        raise ConfChangeError("the change removes every voter of the incoming config")
    return ConfState(
        voters=tuple(sorted(voters)),
        learners=tuple(sorted(learners)),
        voters_outgoing=tuple(sorted(outgoing)),
        learners_next=tuple(sorted(learners_next)),
        auto_leave=cc.auto_leave,
    )


def _leave_joint(cs: ConfState) -> ConfState:
    if not is_joint(cs):
        raise ConfChangeError("the group is not in a joint config: nothing to leave")
    learners = set(cs.learners) | set(cs.learners_next)
    return ConfState(voters=cs.voters, learners=tuple(sorted(learners)))


def members(cs: ConfState) -> frozenset[int]:
    """Every node the config replicates to (voters of both halves and learners)."""
    return frozenset(cs.voters) | frozenset(cs.voters_outgoing) | frozenset(cs.learners) | frozenset(
        cs.learners_next
    )
