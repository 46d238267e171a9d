"""Protobuf wire-format pieces for responses built as bytes.

Some responses are cheaper to build by concatenating already-serialized fields than
by filling message objects (a watch event sent to a thousand watchers, a batch of
identical put responses): protobuf's wire format allows a message to be the
concatenation of its fields, in any order.
"""

from __future__ import annotations


def varint(n: int) -> bytes:
    """Base-128 varint of ``n``; a negative int64 takes ten bytes, as on the wire."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
