"""``accord snapshot restore``: a member's data directory built from one backup file.

As ``etcdctl snapshot restore`` does, each member of the *new* cluster gets its own data
directory from the same file, with the same ``--name``/``--initial-cluster`` flags it
will then be started with (``accord serve``). The result is a data directory as a
member's own snapshots leave it:

* for every group in the file (the member table, each KV shard, the scheduler and any
  other service), a Raft snapshot at index ``RESTORE_INDEX``, term ``RESTORE_TERM``, whose
  voters are the new cluster's members, holding the group's state machine image; and a
  WAL that records that snapshot installed and committed. Every member gets identical
  snapshots, so the groups' logs agree from the first election on;
* the meta group's image is replaced by the new cluster's table (its members from
  ``--initial-cluster``, every shard on all of them), as etcd's restore replaces the
  member list: the old cluster's member ids and addresses mean nothing to the new one
  (the old cluster's alarms, kept with the table, stay behind too);
* the lease clocks of the KV shards move to the time of the restore and forget the old
  cluster's Raft term (``KVStateMachine.image_for_new_cluster``): the first leader then
  rebases every deadline, so each lease keeps the time it had left when the backup was
  taken (an etcd lease: its remaining TTL, or its TTL);
* ``member`` and ``shards`` as ``accord serve`` writes them. A backup from a cluster of
  ``N`` shards restores as ``N`` shards (the node refuses another ``--shards`` later);
  an etcd backup is split over ``--shards`` shards by the usual key rule;
* with ``--workers W`` (``docs/workers.md``), each worker's groups in its own directory
  (``<data-dir>/worker-<k>``, as ``placement.py`` places them) and the worker count
  recorded, as ``accord serve --workers W`` leaves them. A backup does not depend on the
  worker count of the node that saved it: any backup restores as a node of any.

An etcd backup (no ``accord`` bucket) brings its keys, their history since the last
compaction and its leases (``etcdformat.from_etcd``); a new cluster starts the other
groups empty.

The data directory must not exist or be empty: a restore never mixes into a member's
state (etcd refuses the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accord.node.backend import kv_group
from accord.node.config import Config, ConfigError
from accord.node.members import META_GROUP
from accord.node.placement import PlacementError, WorkerPlan, check_workers
from accord.node.server import (
    check_shard_count,
    initial_table,
    make_dir_durably,
    write_member_file,
)
from accord.raft.core.types import ConfState, HardState, SnapshotMeta
from accord.raft.storage.format import WriteBatch
from accord.raft.storage.snapshot import SnapshotStore
from accord.raft.storage.wal import WriteAheadLog
from accord.services.cluster.snapfile import SnapshotFile
from accord.services.kv import etcdformat
from accord.services.kv.backend import now_ms
from accord.services.kv.statemachine import KVStateMachine

RESTORE_INDEX = 1
RESTORE_TERM = 1


@dataclass(frozen=True, slots=True)
class Restored:
    """What a restore wrote."""

    data_dir: Path
    member_id: int
    shards: int
    revision: int
    groups: tuple[int, ...]


def _group_images(snap: SnapshotFile, cfg: Config,
                  shards_given: bool) -> tuple[int, dict[int, bytes]]:
    """``(shards, group id -> image)`` of the new member, the meta group's excepted."""
    if snap.origin == "etcd":
        shards = cfg.shards
        seeds = [kv_group(i) for i in range(shards)]
        _rev, kv = etcdformat.from_etcd(snap.buckets, shards, seeds)
        kv = [KVStateMachine.image_for_new_cluster(img, now_ms()) for img in kv]
        return shards, {kv_group(i): img for i, img in enumerate(kv)}
    shards = len(snap.kv_groups)
    if shards_given and cfg.shards != shards:
        raise ConfigError(f"--shards {cfg.shards}: this backup holds {shards} shards, and a "
                          f"restore keeps them (leave --shards out, or pass {shards})")
    expected = tuple(kv_group(i) for i in range(shards))
    if snap.kv_groups != expected:
        raise ConfigError(f"the backup's KV groups {list(snap.kv_groups)} are not a node's "
                          f"layout of {shards} shards ({list(expected)})")
    images = dict(snap.groups)
    for gid in snap.kv_groups:
        images[gid] = KVStateMachine.image_for_new_cluster(images[gid], now_ms())
    images.pop(META_GROUP, None)
    return shards, images


def restore_data_dir(snap: SnapshotFile, cfg: Config, *, shards_given: bool = False) -> Restored:
    """Build ``cfg.data_dir`` for member ``cfg.name`` of the cluster ``cfg`` describes
    from ``snap`` (see the module docstring); ``shards_given``: ``cfg.shards`` was asked
    for (an accord backup then must hold that many). Blocking file I/O."""
    cfg = cfg.resolved()
    if cfg.joining:
        raise ConfigError("a restore starts a new cluster: --initial-cluster-state must be "
                          "'new' (add members to it afterwards)")
    members = cfg.members()
    if cfg.name not in members:
        raise ConfigError(f"--name {cfg.name!r} is not a member of --initial-cluster "
                          f"({', '.join(sorted(members))})")
    data_dir = Path(cfg.data_dir)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise ConfigError(f"data directory {data_dir} exists and is not empty: a restore "
                          "builds a new member; point --data-dir at a new directory")
    shards, images = _group_images(snap, cfg, shards_given)
    images[META_GROUP] = initial_table(cfg, shards).prepare_snapshot()()
    voters = tuple(sorted(cfg.member_ids().values()))
    meta = SnapshotMeta(RESTORE_INDEX, RESTORE_TERM, ConfState(voters=voters))
    placed = {data_dir: images}
    plan = None
    if cfg.workers > 1:  # each worker's groups in its own directory (docs/workers.md)
        try:
            plan = WorkerPlan(cfg.workers, shards)
            placed = {plan.data_dir(data_dir, k): {g: images[g] for g in images
                                                   if plan.worker_of_group(g) == k}
                      for k in range(cfg.workers)}
        except PlacementError as e:
            raise ConfigError(str(e)) from None
    make_dir_durably(data_dir)  # a power cut after the restore must not take it
    if plan is not None:
        check_workers(data_dir, plan.workers)  # recorded first, in the empty directory
    for where, theirs in placed.items():
        make_dir_durably(where)
        _write_groups(where, theirs, meta)
        check_shard_count(where, shards)
        write_member_file(where, cfg.member_id, False)
    return Restored(data_dir, cfg.member_id, shards, snap.revision, tuple(sorted(images)))


def _write_groups(data_dir: Path, images: dict[int, bytes], meta: SnapshotMeta) -> None:
    """``images`` as Raft snapshots at ``meta`` in ``data_dir``, and a WAL that records
    them installed and committed."""
    store = SnapshotStore(data_dir / "snap")
    for gid in sorted(images):
        with store.writer(gid, meta) as w:
            w.write(images[gid])
            w.finish()
    wal, _recovered = WriteAheadLog.open(data_dir / "wal")
    try:
        batch = WriteBatch()
        for gid in sorted(images):
            batch.install_snapshot(gid, meta)
            batch.set_hard_state(gid, HardState(term=RESTORE_TERM, commit=RESTORE_INDEX))
        wal.append_sync(batch)
    finally:
        wal.close()
