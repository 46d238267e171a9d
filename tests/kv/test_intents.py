"""The record table's expiry: popping a deadline heap forgets exactly what a scan of
every record would (decided records past their retention), so replicas keep agreeing."""

from __future__ import annotations

import random

import pytest

from accord.services.kv.intents import (
    ABORTED,
    COMMITTED,
    PENDING,
    RECORD_RETENTION_MS,
    IntentTable,
    Record,
)


def _scan(records: dict[int, Record], now_ms: int) -> set[int]:
    """The reference: every record a full scan keeps."""
    return {t for t, r in records.items()
            if r.state == PENDING or r.deadline_ms + RECORD_RETENTION_MS >= now_ms}


@pytest.mark.parametrize("seed", range(20))
def test_expiry_forgets_what_a_scan_of_every_record_forgets(seed: int) -> None:
    rnd = random.Random(seed)
    table = IntentTable()
    reference: dict[int, Record] = {}
    now = 1_000_000
    for step in range(400):
        now += rnd.randint(0, 20_000)
        for _ in range(rnd.randint(0, 3)):  # new records, deadlines not in order
            t = rnd.getrandbits(40)
            rec = Record(t, rnd.choice([PENDING, COMMITTED, ABORTED]), step,
                         now + rnd.randint(-10_000, 10_000))
            table.records[t] = rec
            reference[t] = Record(rec.txn_id, rec.state, rec.rev, rec.deadline_ms)
        for t in rnd.sample(sorted(reference), min(2, len(reference))):
            if reference[t].state == PENDING:  # decided later, as by a commit or resolver
                table.records[t].state = reference[t].state = rnd.choice([COMMITTED, ABORTED])
        table.expire_records(now)
        keep = _scan(reference, now)
        reference = {t: reference[t] for t in keep}
        assert set(table.records) == keep, step
    restored = IntentTable.load(table.dump())
    restored.expire_records(now + 2 * RECORD_RETENTION_MS)
    table.expire_records(now + 2 * RECORD_RETENTION_MS)
    assert restored.dump() == table.dump(), "a restored table expires the same records"
