"""A reference model of what the WAL must recover, and a random workload generator.

The model is written independently of ``format.GroupReplay``: per group a
dict of entries by index, the snapshot, the conf state and the hard state,
updated record by record in the order the WAL writes them. Tests compare what
``WriteAheadLog.open`` recovers with the model after every acknowledged batch
(and, after a crash or a torn tail, with the model after some record prefix of
the unacknowledged ones).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from accord.raft.core.types import ConfState, Entry, HardState, PersistentState, SnapshotMeta
from accord.raft.storage.wal import WriteBatch

Op = tuple[int, str, Any]
"""(group, kind, value): one WAL record's worth of change."""


@dataclass
class GroupModel:
    hs: HardState = field(default_factory=HardState)
    snap: SnapshotMeta | None = None
    log: dict[int, Entry] = field(default_factory=dict)
    conf: tuple[int, ConfState] | None = None

    @property
    def snap_index(self) -> int:
        return self.snap.index if self.snap else 0

    @property
    def last(self) -> int:
        return max(self.log) if self.log else self.snap_index


@dataclass
class Model:
    groups: dict[int, GroupModel] = field(default_factory=dict)

    @classmethod
    def from_recovered(cls, rec: dict[int, PersistentState], conf_index: int) -> Model:
        """A model of a recovered log; a recovered conf state is taken to have been
        recorded at ``conf_index`` (recoveries do not report it)."""
        m = cls()
        for g, st in rec.items():
            gm = GroupModel(hs=st.hard_state, snap=st.snapshot)
            for e in st.entries:
                gm.log[e.index] = e
            if st.conf_state is not None:
                gm.conf = (conf_index, st.conf_state)
            m.groups[g] = gm
        return m

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def apply(self, op: Op) -> None:
        g, kind, v = op
        if kind == "remove":
            self.groups.pop(g, None)
            return
        gm = self.groups.setdefault(g, GroupModel())
        if kind == "install":
            gm.snap = v
            gm.log = {}
        elif kind == "compact":
            if gm.snap is None or v.index >= gm.snap.index:
                gm.snap = v
            gm.log = {i: e for i, e in gm.log.items() if i > v.index}
        elif kind == "entries":
            first = v[0].index
            gm.log = {i: e for i, e in gm.log.items() if i < first}
            for e in v:
                if e.index > gm.snap_index:
                    gm.log[e.index] = e
        elif kind == "conf":
            if gm.conf is None or v[0] >= gm.conf[0]:
                gm.conf = v
        elif kind == "hs":
            gm.hs = v
        else:
            raise AssertionError(kind)

    def expected(self) -> dict[int, PersistentState]:
        out = {}
        for g, gm in self.groups.items():
            conf = None
            if gm.conf is not None and (gm.snap is None or gm.conf[0] >= gm.snap.index):
                conf = gm.conf[1]
            out[g] = PersistentState(
                hard_state=gm.hs,
                snapshot=gm.snap,
                entries=[gm.log[i] for i in sorted(gm.log)],
                conf_state=conf,
            )
        return out


def batch_ops(batch: WriteBatch) -> list[Op]:
    """The records a batch turns into, in the order the WAL writes them."""
    ops: list[Op] = []
    for g, gw in batch.groups.items():
        if gw.remove:
            ops.append((g, "remove", None))
            continue
        if gw.install is not None:
            ops.append((g, "install", gw.install))
        if gw.compact is not None:
            ops.append((g, "compact", gw.compact))
        if gw.entries:
            ops.append((g, "entries", list(gw.entries)))
        if gw.conf is not None:
            ops.append((g, "conf", gw.conf))
        if gw.hard_state is not None:
            ops.append((g, "hs", gw.hard_state))
    return ops


def prefix_models(model: Model, batches: list[WriteBatch]) -> list[Model]:
    """The model after every record prefix of ``batches`` (the empty prefix first)."""
    m = model.copy()
    out = [m.copy()]
    for b in batches:
        for op in batch_ops(b):
            m.apply(op)
            out.append(m.copy())
    return out


def _conf(rng: random.Random) -> ConfState:
    voters = tuple(sorted(rng.sample(range(1, 6), rng.randint(1, 3))))
    return ConfState(voters=voters, learners=(9,) if rng.random() < 0.3 else ())


class Workload:
    """Deterministic valid random batches for a few groups, starting from a recovered state.

    The same ``seed`` and starting state always give the same batches, so a test
    can regenerate exactly what a killed writer process submitted.
    """

    def __init__(
        self,
        seed: int,
        start: dict[int, PersistentState] | None = None,
        *,
        groups: int = 5,
        conf_base: int | None = None,
    ) -> None:
        """``conf_base``: when set, conf-state records get indexes ``conf_base + n``
        (above anything a previous run used, which recovery cannot report); when
        None, realistic indexes near the snapshot (the model must then never be
        rebuilt from a recovered state)."""
        self.rng = random.Random(seed)
        self.conf_base = conf_base
        self.conf_counter = 0
        base = conf_base if conf_base is not None else 0
        self.model = Model.from_recovered(start or {}, base - 1)
        self.ngroups = groups

    def next_batch(self) -> WriteBatch:
        rng = self.rng
        b = WriteBatch()
        for g in rng.sample(range(1, self.ngroups + 1), rng.randint(1, min(3, self.ngroups))):
            gm = self.model.groups.get(g) or GroupModel()
            r = rng.random()
            if r < 0.02 and g in self.model.groups:
                b.remove_group(g)
                continue
            if r < 0.06:
                idx = gm.last + rng.randint(0, 5)
                b.install_snapshot(g, SnapshotMeta(idx, max(gm.hs.term, 1), _conf(rng)))
                term = max(gm.hs.term, 1)
                b.set_hard_state(g, HardState(term, gm.hs.vote, idx))
                continue
            term = gm.hs.term + (1 if rng.random() < 0.15 else 0)
            if rng.random() < 0.85:
                last = gm.last
                first = last + 1
                if last > gm.snap_index and rng.random() < 0.2:
                    first = rng.randint(gm.snap_index + 1, last)  # conflicting suffix
                    term += 1
                prev_term = gm.log[first - 1].term if first - 1 in gm.log else 0
                term = max(term, prev_term, 1)
                n = rng.randint(1, 4)
                data = [rng.randbytes(rng.randint(0, 120)) for _ in range(n)]
                b.append_entries(g, [Entry(term, first + i, data=data[i]) for i in range(n)])
            if rng.random() < 0.15 and gm.last > gm.snap_index:
                idx = rng.randint(max(gm.snap_index, gm.last - 4), gm.last)
                b.compact(g, SnapshotMeta(idx, gm.log[idx].term if idx in gm.log else 1, _conf(rng)))
            if rng.random() < 0.05:
                if self.conf_base is None:
                    cidx = gm.snap_index + rng.randint(0, 3)
                else:
                    self.conf_counter += 1
                    cidx = self.conf_base + self.conf_counter
                b.set_conf_state(g, cidx, _conf(rng))
            if rng.random() < 0.7 or term > gm.hs.term:
                vote = rng.randint(0, 3) if term > gm.hs.term else gm.hs.vote
                b.set_hard_state(g, HardState(term, vote, rng.randint(0, 3)))
        for op in batch_ops(b):
            self.model.apply(op)
        return b
