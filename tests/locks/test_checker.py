"""The mutual-exclusion checker finds what it is meant to find."""

from __future__ import annotations

from tests.locks.checker import Write, check


def test_a_clean_history_passes() -> None:
    grants = [(5, 6), (9, 12)]
    writes = [Write(7, 5, b"a"), Write(8, 5, b"b"), Write(13, 9, b"c")]
    assert check(grants, writes, [b"late"]) == []


def test_interleaved_holders_are_caught() -> None:
    grants = [(5, 6), (9, 12)]
    writes = [Write(7, 5, b"a"), Write(13, 9, b"c"), Write(14, 5, b"stale")]
    assert check(grants, writes) == ["write at rev 14 with token 5 after a write with token 9"]


def test_shrinking_tokens_unknown_tokens_and_refused_writes_are_caught() -> None:
    problems = check([(9, 6), (5, 12)], [Write(3, 9, b"x"), Write(20, 7, b"y")], [b"y"])
    assert problems == [
        "token went back: 9 granted at rev 6, then 5 at rev 12",
        "write at rev 3 precedes the grant of token 9",
        "write at rev 20 carries token 7 that was never granted",
        "write at rev 20 with token 7 after a write with token 9",
        "write b'y' was reported refused but is in the history",
    ]
