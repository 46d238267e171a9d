"""Preallocated segments: zero-filled before use, written in place, recovered at the
end of their records; zero tails are the clean end, zeroed sectors are corruption,
half-prepared segments are discarded, and ``accord wal check`` agrees."""

from __future__ import annotations

import errno
import io
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from accord.raft.core.types import Entry, HardState
from accord.raft.storage import threads as wal_threads
from accord.raft.storage.format import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    list_prepared,
    nonzero_end,
    scan_segment,
    segment_header,
)
from accord.raft.storage.wal import (
    FIRST_SEGMENT_ROOM,
    WALCorruptError,
    WALFatalError,
    WriteAheadLog,
    WriteBatch,
)
from accord.raft.storage.walcheck import check, main

from .model import Workload


def _segments(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix == ".wal")


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "LOCK"}


def _scan(p: Path, last: bool) -> Any:
    return scan_segment(int(p.stem, 16), p, last=last)


def _entries(first: int, n: int, size: int = 40) -> list[Entry]:
    return [Entry(1, i, data=bytes([i % 251]) * size) for i in range(first, first + n)]


def _fill(d: Path, nbatches: int, seg: int, size: int = 300) -> dict[int, Any]:
    """A log of ``nbatches`` one-entry batches of group 1; returns what it recovers."""
    wal, _ = WriteAheadLog.open(d, segment_bytes=seg, sync=False)
    for i in range(1, nbatches + 1):
        wal.append_sync(
            WriteBatch().add(1, entries=_entries(i, 1, size), hard_state=HardState(1, 1, i))
        )
    wal.close()
    wal, rec = WriteAheadLog.open(d, segment_bytes=seg, sync=False)
    wal.close()
    assert rec[1].entries == [e for i in range(1, nbatches + 1) for e in _entries(i, 1, size)]
    return rec


def test_segments_are_zero_filled_before_use_and_grow_to_segment_bytes(tmp_path: Path) -> None:
    seg = 4 << 20
    wal, _ = WriteAheadLog.open(tmp_path, segment_bytes=seg, sync=False)
    try:
        (first,) = wal.segment_files()
        raw = first.read_bytes()
        assert len(raw) == FIRST_SEGMENT_ROOM
        assert raw[:SEGMENT_HEADER_SIZE] == segment_header(1)
        assert nonzero_end(raw, SEGMENT_HEADER_SIZE) == SEGMENT_HEADER_SIZE
        big = bytes(range(256)) * 256  # 64 KiB entries
        i = 0
        sizes: dict[Path, int] = {}
        while len(wal.segment_files()) < 5:
            i += 1
            wal.append_sync(WriteBatch().append_entries(1, [Entry(1, i, data=big)]))
            # Records overwrite the zeros: a segment's file never grows while in use.
            cur = wal.segment_files()[-1]
            assert sizes.setdefault(cur, cur.stat().st_size) == cur.stat().st_size
        files = wal.segment_files()
    finally:
        wal.close()
    # A fresh log starts small; each next segment doubles, up to segment_bytes.
    assert [p.stat().st_size for p in files] == [1 << 20, 2 << 20, 4 << 20, 4 << 20, 4 << 20]
    for p in files[:-1]:
        s = _scan(p, last=False)
        assert s.damage is None and s.valid_end < s.size
        assert s.data_end == s.valid_end, "a rotated segment keeps a clean zero tail"
    assert not list_prepared(tmp_path), "close removes a prepared, unused segment"
    wal, rec = WriteAheadLog.open(tmp_path, segment_bytes=seg, sync=False)
    wal.close()
    assert [e.index for e in rec[1].entries] == list(range(1, i + 1))


def test_appends_continue_at_the_recovered_end_inside_the_file(tmp_path: Path) -> None:
    seg = 1 << 16
    for round_ in range(3):
        wal, rec = WriteAheadLog.open(tmp_path, segment_bytes=seg, sync=False)
        first = 5 * round_ + 1
        assert rec.get(1) is None or rec[1].entries[-1].index == first - 1
        wal.append_sync(WriteBatch().append_entries(1, _entries(first, 5)))
        wal.close()
        (path,) = _segments(tmp_path)
        s = _scan(path, last=True)
        assert path.stat().st_size == seg, "the preallocated file is written in place"
        assert s.damage is None and len(s.records) == round_ + 1
        # Contiguous records: the reopened log wrote right after the last one, not at EOF.
        offs = [r.offset for r in s.records]
        ends = [r.offset + RECORD_HEADER_SIZE + len(r.payload) for r in s.records]
        assert offs[0] == SEGMENT_HEADER_SIZE and offs[1:] == ends[:-1]
    # A torn record is wiped, and the next append goes where it was.
    raw = bytearray(path.read_bytes())
    torn_at = s.valid_end
    raw[torn_at : torn_at + 7] = b"\xac\x01garbg"
    path.write_bytes(bytes(raw))
    wal, rec = WriteAheadLog.open(tmp_path, segment_bytes=seg, sync=False)
    assert wal.stats.truncated_bytes == 7
    wal.append_sync(WriteBatch().append_entries(1, _entries(16, 1)))
    wal.close()
    s = _scan(path, last=True)
    assert s.damage is None and s.records[-1].offset == torn_at
    wal, rec = WriteAheadLog.open(tmp_path, segment_bytes=seg, sync=False)
    wal.close()
    assert rec[1].entries == _entries(1, 16)


@pytest.mark.parametrize("where", ["last", "middle"])
def test_zeroed_sector_followed_by_records_is_refused(tmp_path: Path, where: str) -> None:
    src = tmp_path / "src"
    _fill(src, 80, seg=4096, size=60)
    segs = _segments(src)
    assert len(segs) >= 3
    victim = segs[-1] if where == "last" else segs[len(segs) // 2]
    s = _scan(victim, last=victim == segs[-1])
    assert len(s.records) >= 6
    for rec_no, span in ((2, 512), (1, RECORD_HEADER_SIZE)):
        work = tmp_path / f"work{rec_no}"
        shutil.copytree(src, work)
        r = s.records[rec_no]
        target = work / victim.name
        raw = bytearray(target.read_bytes())
        raw[r.offset : r.offset + span] = bytes(span)  # a lost sector: zeros, valid records after
        target.write_bytes(bytes(raw))
        before = _files(work)
        with pytest.raises(WALCorruptError) as ei:
            WriteAheadLog.open(work, segment_bytes=4096, sync=False)
        err = ei.value
        assert err.path.endswith(victim.name) and err.offset == r.offset
        assert "zeros where a record header should be" in str(err)
        assert _files(work) == before, "a refused start changes nothing"
        out = io.StringIO()
        assert check(work, out) == 1
        assert "DAMAGED" in out.getvalue() and victim.name in out.getvalue()
        assert _files(work) == before


def test_a_zeroed_header_of_the_last_segment_is_refused(tmp_path: Path) -> None:
    """A full-size last segment whose header (or whole content) reads as zeros is not a
    half-created file: a prepared segment is named only once its header is durable."""
    src = tmp_path / "src"
    _fill(src, 40, seg=4096)
    last = _segments(src)[-1]
    for n, wipe in enumerate((SEGMENT_HEADER_SIZE, 4096)):
        work = tmp_path / f"w{n}"
        shutil.copytree(src, work)
        raw = bytearray((work / last.name).read_bytes())
        raw[:wipe] = bytes(wipe)
        (work / last.name).write_bytes(bytes(raw))
        before = _files(work)
        with pytest.raises(WALCorruptError, match="bad segment header") as ei:
            WriteAheadLog.open(work, segment_bytes=4096, sync=False)
        assert ei.value.offset == 0 and last.name in str(ei.value)
        assert _files(work) == before


def test_zero_tail_in_a_rotated_segment_is_the_clean_end(tmp_path: Path) -> None:
    src = tmp_path / "src"
    expected = _fill(src, 40, seg=4096)
    segs = _segments(src)
    assert len(segs) >= 3
    rotated = segs[1]
    s = _scan(rotated, last=False)
    assert s.damage is None and s.valid_end < s.size == 4096, "a rotated segment keeps its zero tail"
    assert s.data_end == s.valid_end
    # Garbage in that tail is damage in a segment that is not the last: refused.
    work = tmp_path / "work"
    shutil.copytree(src, work)
    raw = bytearray((work / rotated.name).read_bytes())
    raw[s.valid_end + 100] = 0x5A
    (work / rotated.name).write_bytes(bytes(raw))
    with pytest.raises(WALCorruptError) as ei:
        WriteAheadLog.open(work, segment_bytes=4096, sync=False)
    assert ei.value.offset == s.valid_end and rotated.name in str(ei.value)
    # The same garbage after the last segment's records: a torn write, wiped.
    shutil.rmtree(work)
    shutil.copytree(src, work)
    last = work / segs[-1].name
    ls = _scan(last, last=True)
    assert ls.valid_end + 200 < ls.size
    raw = bytearray(last.read_bytes())
    raw[ls.valid_end + 150] = 0x5A
    last.write_bytes(bytes(raw))
    wal, rec = WriteAheadLog.open(work, segment_bytes=4096, sync=False)
    wal.close()
    assert rec == expected
    assert last.read_bytes()[ls.valid_end :] == bytes(ls.size - ls.valid_end)


def test_half_prepared_next_segment_is_discarded(tmp_path: Path) -> None:
    """A crash while (or after) the helper zero-filled the next segment, before the
    writer used it: whatever state the ``.prep`` file is in, recovery removes it."""
    src = tmp_path / "src"
    wal, _ = WriteAheadLog.open(src, segment_bytes=4096, sync=False)
    gen = Workload(5, groups=3, conf_base=1_000_000)
    prep: list[Path] = []
    deadline = time.monotonic() + 10
    while not prep:
        wal.append_sync(gen.next_batch())
        # The helper starts once the segment is a quarter full; wait for it, bounded.
        while time.monotonic() < deadline:
            prep = list_prepared(src)
            if not prep or prep[0].stat().st_size == 4096:
                break
            time.sleep(0.001)
        assert time.monotonic() < deadline
    crashed = {p.name: p.read_bytes() for p in src.iterdir() if p.name != "LOCK"}  # the crash
    expected = gen.model.expected()
    wal.close()
    (name,) = [n for n in crashed if n.endswith(".prep")]
    full = crashed[name]
    assert len(full) == 4096 and full[:SEGMENT_HEADER_SIZE] == segment_header(int(name[:16], 16))
    variants = [b"", full[:7], full[:SEGMENT_HEADER_SIZE], full[:1000], full, b"\x01" * 4096]
    for n, prepared in enumerate(variants):
        work = tmp_path / f"w{n}"
        work.mkdir()
        for fname, data in crashed.items():
            (work / fname).write_bytes(prepared if fname == name else data)
        wal, rec = WriteAheadLog.open(work, segment_bytes=4096, sync=False)
        after = Workload(n, rec, groups=3, conf_base=2_000_000)
        try:
            assert rec == expected, f"variant {n}"
            assert not list_prepared(work), "the half-prepared segment is removed"
            nseg = len(wal.segment_files())
            for _ in range(30):  # and the log goes on, through new segments as usual
                wal.append_sync(after.next_batch())
            assert wal.stats.segments_created >= 1 and wal.segment_files()[-1].stat().st_size == 4096
            assert max(int(p.stem, 16) for p in wal.segment_files()) > nseg
        finally:
            wal.close()
        out = io.StringIO()
        assert check(work, out) == 0, out.getvalue()
        wal, rec = WriteAheadLog.open(work, segment_bytes=4096, sync=False)
        wal.close()
        assert rec == after.model.expected()


def test_wal_check_on_a_healthy_preallocated_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(tmp_path, 30, seg=4096)
    (tmp_path / "00000000000000ff.wal.prep").write_bytes(bytes(4096))  # left by a crash
    before = _files(tmp_path)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "result: clean" in out and "preallocated zeros" in out
    assert "torn" not in out and "DAMAGED" not in out
    assert "00000000000000ff.wal.prep" in out and "never used" in out
    assert _files(tmp_path) == before, "wal check changes nothing"


def test_a_failed_preparation_stops_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal, _ = WriteAheadLog.open(tmp_path, segment_bytes=4096, sync=False)

    def no_space(*args: object, **kw: object) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wal_threads, "prepare_segment", no_space)
    acked = 0
    try:
        with pytest.raises(WALFatalError, match="No space"):
            for i in range(1, 100):
                wal.append_sync(WriteBatch().append_entries(1, _entries(i, 1, 300)))
                acked = i
        assert acked >= 1 and wal.failed is not None
        with pytest.raises(WALFatalError):
            wal.append_sync(WriteBatch().append_entries(1, _entries(acked + 1, 1, 300)))
    finally:
        wal.close()
    monkeypatch.undo()
    wal, rec = WriteAheadLog.open(tmp_path, segment_bytes=4096, sync=False)
    wal.close()
    assert rec[1].entries == [e for i in range(1, acked + 1) for e in _entries(i, 1, 300)]


def test_nonzero_end_matches_a_plain_scan() -> None:
    rng = random.Random(9)
    for _ in range(300):
        n = rng.choice([0, 1, 19, 4095, 4096, 4097, 50_000, (1 << 20) + 3, (2 << 20) + 4099])
        data = bytearray(n)
        for _ in range(rng.randint(0, 3)):
            if n:
                data[rng.randrange(n)] = rng.randint(1, 255)
        start = rng.randint(0, n)
        want = start + len(bytes(data[start:]).rstrip(b"\0"))
        assert nonzero_end(bytes(data), start) == want
