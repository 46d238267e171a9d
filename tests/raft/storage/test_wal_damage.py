"""Torn tails are truncated at every byte offset; bit flips anywhere else are refused
with an error naming file, offset and group; ``accord wal check`` reports without changing."""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path

import pytest

from accord.raft.core.types import Entry, HardState
from accord.raft.storage.format import RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE, scan_segment
from accord.raft.storage.wal import WALCorruptError, WriteAheadLog, WriteBatch
from accord.raft.storage.walcheck import check, main

from .model import Model, Workload, prefix_models


def _segments(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix == ".wal")


def _snapshot_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in _segments(d)}


def _build(
    d: Path, seed: int, nbatches: int, tail: int, seg: int = 4096
) -> tuple[Model, list[WriteBatch]]:
    """A log of ``nbatches`` random batches; returns (model before the tail, tail batches)."""
    gen = Workload(seed, groups=4)
    wal, _ = WriteAheadLog.open(d, segment_bytes=seg, sync=False)
    before = gen.model.copy()
    tail_batches = []
    for i in range(nbatches):
        if i == nbatches - tail:
            before = gen.model.copy()
        b = gen.next_batch()
        if i >= nbatches - tail:
            tail_batches.append(b)
        wal.append_sync(b)
    wal.close()
    return before, tail_batches


def test_torn_tail_truncated_at_every_byte_offset(tmp_path: Path) -> None:
    """A crash's torn write, cut at every byte of the last records of a preallocated
    file whose tail is still zeros (and, at every 5th byte and around every record
    boundary, as a file that simply ends there, as logs without preallocation did):
    recovery keeps exactly the complete records and wipes the rest in place."""
    src = tmp_path / "src"
    # One big segment so the tail batches all live in the last segment.
    before, tail = _build(src, seed=7, nbatches=40, tail=3, seg=1 << 14)
    (seg,) = _segments(src)
    full = seg.read_bytes()
    candidates = prefix_models(before, tail)
    ntail = len(candidates) - 1
    scan = scan_segment(1, seg, last=True)
    ends = [r.offset + RECORD_HEADER_SIZE + len(r.payload) for r in scan.records]
    assert scan.damage is None and len(ends) >= ntail
    data = full[: scan.valid_end]
    assert scan.valid_end == ends[-1] and len(full) == 1 << 14 and not full[len(data):].strip(b"\0")
    tail_start = ends[-ntail - 1]
    work = tmp_path / "work"
    work.mkdir()
    checked = 0
    for cut in range(tail_start, len(data) + 1):
        complete = sum(1 for e in ends[-ntail:] if e <= cut)
        end = ends[-ntail:][complete - 1] if complete else tail_start
        images = [data[:cut] + bytes(len(full) - cut)]
        if cut % 5 == 0 or any(abs(cut - e) <= 1 for e in ends[-ntail - 1 :]):
            images.append(data[:cut])
        for image in images:
            (work / seg.name).write_bytes(image)
            wal, rec = WriteAheadLog.open(work, sync=False)
            wal.close()
            assert rec == candidates[complete].expected(), f"cut at byte {cut}"
            after = (work / seg.name).read_bytes()
            assert len(after) == len(image), "the torn bytes are zeroed, the file keeps its room"
            assert after[:end] == data[:end], f"cut at byte {cut}"
            assert after[end:] == bytes(len(after) - end), f"cut at byte {cut}"
            checked += 1
    assert checked > 1.2 * (len(data) - tail_start + 1) > 240


def test_torn_new_segment_header_and_state_records(tmp_path: Path) -> None:
    src = tmp_path / "src"
    wal, _ = WriteAheadLog.open(src, segment_bytes=4096, sync=False)
    i = 0
    while len(wal.segment_files()) < 2:
        i += 1
        wal.append_sync(
            WriteBatch().add(1, entries=[Entry(1, i, data=b"d" * 300)], hard_state=HardState(1, 1, i))
        )
    wal.close()
    old, new = _segments(src)
    room = new.read_bytes()
    data = room[: scan_segment(int(new.stem, 16), new, last=True).valid_end]
    # Cut short, and (what a preallocated segment leaves) cut with its zero tail intact;
    # a prepared segment is named only once its header is durable.
    images = [data[:cut] for cut in range(len(data))]
    images += [data[:cut] + bytes(len(room) - cut) for cut in range(SEGMENT_HEADER_SIZE, len(data))]
    for n, image in enumerate(images):
        work = tmp_path / f"w{n}"
        work.mkdir()
        shutil.copy(old, work / old.name)
        (work / new.name).write_bytes(image)
        wal, rec = WriteAheadLog.open(work, sync=False)
        wal.close()
        # The batch that triggered the rotation is lost (it was never acknowledged);
        # everything before it is intact.
        last = rec[1].entries[-1].index
        assert last in (i - 1, i)
        assert rec[1].entries == [Entry(1, k, data=b"d" * 300) for k in range(1, last + 1)]
        # The rotating batch's hard state record may be torn off after its entries.
        assert rec[1].hard_state.commit in ((i - 1,) if last == i - 1 else (i - 1, i))
        shutil.rmtree(work)


def test_bit_flips_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    wal, _ = WriteAheadLog.open(src, segment_bytes=4096, sync=False)
    rng = random.Random(3)
    for i in range(1, 61):
        b = WriteBatch()
        for g in (1, 2, 3):
            b.add(g, entries=[Entry(2, i, data=rng.randbytes(rng.randint(1, 60)))],
                  hard_state=HardState(2, g, i - 1))
        wal.append_sync(b)
    wal.close()
    segs = _segments(src)
    assert len(segs) >= 3
    last_scan = scan_segment(int(segs[-1].stem, 16), segs[-1], last=True)
    last_rec_start = last_scan.records[-1].offset
    rng = random.Random(11)
    work = tmp_path / "work"
    for trial in range(60):
        si = rng.randrange(len(segs))
        seg = segs[si]
        limit = last_rec_start if si == len(segs) - 1 else seg.stat().st_size
        pos = rng.randrange(0, limit)
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(src, work)
        target = work / seg.name
        raw = bytearray(target.read_bytes())
        raw[pos] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(raw))
        before = _snapshot_files(work)
        with pytest.raises(WALCorruptError) as ei:
            WriteAheadLog.open(work, sync=False)
        err = ei.value
        msg = str(err)
        assert seg.name in msg and "offset" in msg, msg
        assert err.path.endswith(seg.name)
        assert err.offset <= pos, (trial, err.offset, pos)
        # A flip inside a payload leaves the header intact: the group is named.
        scan = scan_segment(int(seg.stem, 16), seg, last=False)
        inside = [r for r in scan.records if r.offset + RECORD_HEADER_SIZE <= pos < r.offset + RECORD_HEADER_SIZE + len(r.payload)]
        if inside:
            assert err.group == inside[0].group and f"group {err.group}" in msg
        assert _snapshot_files(work) == before, "a refused start must change nothing"
        out = io.StringIO()
        assert check(work, out) == 1
        assert "DAMAGED" in out.getvalue() and seg.name in out.getvalue()
        assert _snapshot_files(work) == before, "wal check must change nothing"


def test_missing_middle_segment_is_refused(tmp_path: Path) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, segment_bytes=4096, sync=False)
    for i in range(1, 80):
        wal.append_sync(WriteBatch().append_entries(1, [Entry(1, i, data=b"m" * 200)]))
    wal.close()
    segs = _segments(tmp_path)
    assert len(segs) >= 3
    segs[1].unlink()
    with pytest.raises(WALCorruptError, match="missing"):
        WriteAheadLog.open(tmp_path, sync=False)
    assert check(tmp_path, io.StringIO()) == 1


def test_wal_check_reports_clean_and_torn_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _build(tmp_path, seed=5, nbatches=30, tail=1)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "result: clean" in out and "group 1" in out
    seg = _segments(tmp_path)[-1]
    data = seg.read_bytes()
    end = scan_segment(int(seg.stem, 16), seg, last=True).valid_end
    torn = data[: end - 3] + bytes(len(data) - end + 3)  # the last record's end never reached the disk
    seg.write_bytes(torn)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "torn tail" in out and "will truncate" in out
    assert seg.read_bytes() == torn, "wal check must not repair"
    assert main([str(tmp_path / "nope")]) == 2


def test_wal_check_verifies_snapshot_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from accord.raft.core.types import SnapshotMeta
    from accord.raft.storage.snapshot import SnapshotStore

    _build(tmp_path / "wal", seed=6, nbatches=5, tail=1)
    store = SnapshotStore(tmp_path / "snap")
    with store.writer(2, SnapshotMeta(9, 1)) as w:
        w.write(b"state" * 100)
        info = w.finish()
    args = [str(tmp_path / "wal"), "--snapshots", str(tmp_path / "snap")]
    assert main(args) == 0
    assert "1 file(s), 0 damaged" in capsys.readouterr().out
    raw = bytearray(info.path.read_bytes())
    raw[40] ^= 4
    info.path.write_bytes(bytes(raw))
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "CRC" in out
    assert info.path.read_bytes() == bytes(raw)
