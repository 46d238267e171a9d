"""Property: any sequence of appends, truncations, compactions and restarts recovers
exactly what was acknowledged; a torn final batch recovers a record prefix of it."""

from __future__ import annotations

import os
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.raft.storage.format import scan_segment
from accord.raft.storage.wal import WriteAheadLog

from .model import Model, Workload, prefix_models

STEP = st.tuples(
    st.sampled_from(["batch"] * 6 + ["restart", "torn"]),
    st.integers(min_value=0, max_value=2**32 - 1),
)


def _last_segment(d: Path) -> Path:
    return sorted(p for p in d.iterdir() if p.suffix == ".wal")[-1]


@settings(deadline=None)
@given(
    steps=st.lists(STEP, min_size=1, max_size=80),
    segment_bytes=st.sampled_from([4096, 8192, 1 << 20]),
)
def test_recovery_matches_acknowledged_state(
    tmp_path_factory: object, steps: list[tuple[str, int]], segment_bytes: int
) -> None:
    d = tmp_path_factory.mktemp("wal")  # type: ignore[attr-defined]
    wal, rec = WriteAheadLog.open(d, segment_bytes=segment_bytes, sync=False)
    assert rec == {}
    gen = Workload(0, groups=3)
    try:
        for kind, seed in steps:
            gen.rng.seed(seed)
            if kind == "batch":
                wal.append_sync(gen.next_batch())
            elif kind == "restart":
                wal.close()
                wal, rec = WriteAheadLog.open(d, segment_bytes=segment_bytes, sync=False)
                assert rec == gen.model.expected()
            else:
                # A crash while the last batch was being written: cut its bytes anywhere.
                before: Model = gen.model.copy()
                batch = gen.next_batch()
                written = wal.stats.bytes_written
                deleted = wal.stats.segments_deleted
                wal.append_sync(batch)
                nbytes = wal.stats.bytes_written - written
                wal.close()
                if wal.stats.segments_deleted != deleted:
                    # Segments are deleted only after the batch that allowed it is
                    # durable, so no crash can tear that batch: just restart.
                    wal, rec = WriteAheadLog.open(d, segment_bytes=segment_bytes, sync=False)
                    assert rec == gen.model.expected()
                    continue
                seg = _last_segment(d)
                end = scan_segment(int(seg.stem, 16), seg, last=True).valid_end
                cut = end - random.Random(seed).randint(0, nbytes)
                if seed % 2:
                    os.truncate(seg, cut)  # the file ends there
                else:  # a torn write into the preallocated file: the rest is still zeros
                    with open(seg, "r+b") as f:
                        f.seek(cut)
                        f.write(bytes(end - cut))
                wal, rec = WriteAheadLog.open(d, segment_bytes=segment_bytes, sync=False)
                candidates = prefix_models(before, [batch])
                matches = [m for m in candidates if m.expected() == rec]
                assert matches, f"recovered state after a cut at {cut} is no record prefix"
                gen.model = matches[-1]
        wal.close()
        wal, rec = WriteAheadLog.open(d, segment_bytes=segment_bytes, sync=False)
        assert rec == gen.model.expected()
    finally:
        wal.close()
