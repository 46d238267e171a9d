"""bbolt pages: what the writer lays out the reader reads back, and damage is named."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.services.cluster import bbolt

PAGE = bbolt.PAGE_SIZE

keys = st.binary(min_size=1, max_size=40)
values = st.one_of(st.binary(max_size=64), st.integers(4000, 9000).map(lambda n: b"y" * n))
buckets = st.dictionaries(
    st.binary(min_size=1, max_size=12), st.dictionaries(keys, values, max_size=30), max_size=4)


@given(buckets)
def test_written_files_read_back(content: dict[bytes, dict[bytes, bytes]]) -> None:
    data = bbolt.write_db(content)
    assert len(data) % PAGE == 0
    db = bbolt.read_db(data)
    assert db.buckets == content
    assert list(db.buckets) == sorted(content)
    assert db.size == len(data)


def test_many_keys_need_branch_pages_and_still_read_back() -> None:
    content = {b"key": {b"%08d" % i: b"v" * (i % 300) for i in range(20_000)}}
    data = bbolt.write_db(content)
    # more than one level: the root of bucket "key" is a branch page
    root_bucket = bbolt.read_db(data)
    assert root_bucket.buckets == content
    assert len(data) > 200 * PAGE


def test_value_larger_than_a_page_uses_overflow_pages() -> None:
    big = bytes(range(256)) * 100  # 25.6 KB
    data = bbolt.write_db({b"b": {b"k": big, b"small": b"x"}})
    assert bbolt.read_db(data).buckets == {b"b": {b"k": big, b"small": b"x"}}


def _meta_checksum_offset(page: int) -> int:
    return page * PAGE + 16 + 56


def test_one_damaged_meta_page_falls_back_to_the_other() -> None:
    data = bytearray(bbolt.write_db({b"b": {b"k": b"v"}}))
    data[_meta_checksum_offset(0)] ^= 0xFF
    assert bbolt.read_db(bytes(data)).buckets == {b"b": {b"k": b"v"}}


def test_both_meta_pages_damaged_is_refused_naming_the_checksum() -> None:
    data = bytearray(bbolt.write_db({b"b": {b"k": b"v"}}))
    data[_meta_checksum_offset(0)] ^= 0xFF
    data[_meta_checksum_offset(1)] ^= 0xFF
    with pytest.raises(bbolt.BoltError, match="meta page 0: meta page checksum mismatch"):
        bbolt.read_db(bytes(data))


def test_not_a_bbolt_file_is_refused() -> None:
    with pytest.raises(bbolt.BoltError, match="page at offset 0 is not a meta page"):
        bbolt.read_db(b"\x00" * (3 * PAGE))
    with pytest.raises(bbolt.BoltError, match="too short"):
        bbolt.read_db(b"hello")


def test_truncated_file_is_refused_with_its_sizes() -> None:
    data = bbolt.write_db({b"b": {b"%d" % i: b"x" * 100 for i in range(500)}})
    with pytest.raises(bbolt.BoltError, match="truncated: its meta page says"):
        bbolt.read_db(data[: len(data) - PAGE])


def test_a_page_with_a_wrong_id_is_refused() -> None:
    data = bytearray(bbolt.write_db({b"b": {b"k": b"v"}}))
    struct.pack_into("<Q", data, 3 * PAGE, 99)  # page 3 is bucket b's leaf
    with pytest.raises(bbolt.BoltError, match="page 3 at offset 12288 says it is page 99"):
        bbolt.read_db(bytes(data))


def test_a_page_of_the_wrong_type_is_refused() -> None:
    data = bytearray(bbolt.write_db({b"b": {b"k": b"v"}}))
    struct.pack_into("<H", data, 3 * PAGE + 8, bbolt.FREELIST)
    with pytest.raises(bbolt.BoltError, match="page 3: expected a branch or leaf page"):
        bbolt.read_db(bytes(data))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        bbolt.write_db({}, page_size=1000)
    with pytest.raises(ValueError, match="key must not be empty"):
        bbolt.write_db({b"b": {b"": b"v"}})
