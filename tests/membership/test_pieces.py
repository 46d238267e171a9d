"""Wire codec, encryption, dissemination queue, suspicion timer, local health, config."""

from __future__ import annotations

import math

import pytest

from accord.membership.awareness import LocalHealth
from accord.membership.broadcast import TransmitQueue
from accord.membership.config import SwimConfig
from accord.membership.crypto import SEAL_OVERHEAD, AuthError, Keyring
from accord.membership.state import MemberState, validate_meta
from accord.membership.suspicion import Suspicion
from accord.membership.wire import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    Nack,
    Ping,
    PushPullState,
    Suspect,
    WireError,
    build_packet,
    decode_packet,
    decode_push_pull,
    encode_message,
    encode_push_pull,
    wrap_update,
)


def test_packet_round_trip() -> None:
    main = Ping(7, "b", "a", ("127.0.0.1", 7946))
    updates: list[Alive | Suspect | Dead] = [
        Alive(3, "c", ("10.0.0.3", 1), {"role": "raft"}),
        Suspect(1, "d", "a"),
        Dead(2, "e", "e"),
    ]
    data = build_packet(encode_message(main), [wrap_update(encode_message(u)) for u in updates])
    got_main, got_updates = decode_packet(data)
    assert got_main == main
    assert got_updates == updates
    others: list[Ack | Nack | IndirectPing] = [
        Ack(1), Nack(2), IndirectPing(3, "t", ("h", 2), "s", ("h", 3), True)
    ]
    for msg in others:
        assert decode_packet(build_packet(encode_message(msg), []))[0] == msg
    gossip_only = build_packet(None, [wrap_update(encode_message(updates[1]))])
    assert decode_packet(gossip_only) == (None, [updates[1]])


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00garbage", build_packet(b"\x92\x63\x01", []), b"\x92\x02\xc0", build_packet(encode_message(Ack(1)), [b"\x01"])],
)
def test_malformed_packets_raise_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_packet(data)


def test_push_pull_round_trip_and_errors() -> None:
    state = PushPullState(True, [("a", ("h", 1), 4, MemberState.SUSPECT, {"k": "v"})])
    assert decode_push_pull(encode_push_pull(state)) == state
    with pytest.raises(WireError):
        decode_push_pull(b"\x93\x01\xc3\x91\x92\x01\x02")


def test_keyring_seals_opens_and_rotates() -> None:
    old, new = b"k" * 16, b"n" * 32
    sealed = Keyring([old]).seal(b"hello")
    assert len(sealed) == 5 + SEAL_OVERHEAD
    assert Keyring([new, old]).open(sealed) == b"hello"  # rotation: old key still opens
    with pytest.raises(AuthError):
        Keyring([new]).open(sealed)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(AuthError):
        Keyring([old]).open(tampered)
    with pytest.raises(ValueError):
        Keyring([b"short"])


def test_queue_sends_newest_first_and_respects_the_limit() -> None:
    q = TransmitQueue()
    q.queue("a", b"A" * 10)
    q.queue("b", b"B" * 10)
    assert q.take(1000, limit=3) == [b"B" * 10, b"A" * 10]
    q.queue("c", b"C" * 10)  # fewer transmits: goes first
    assert q.take(1000, limit=3)[0] == b"C" * 10
    assert q.transmits("a") == 2
    q.take(1000, limit=3)
    assert q.transmits("a") is None and len(q) == 1  # a and b used up their 3 sends
    q.take(1000, limit=3)
    q.take(1000, limit=3)
    assert not q


def test_queue_replaces_updates_about_the_same_member_and_respects_budget() -> None:
    q = TransmitQueue()
    q.queue("a", b"old")
    q.queue("a", b"new!")
    assert len(q) == 1 and q.pending("a") == b"new!"
    for i in range(10):
        q.queue(f"m{i}", bytes(100))
    taken = q.take(350, limit=5)
    assert len(taken) == 3 and sum(map(len, taken)) <= 350


def test_queue_sheds_when_full() -> None:
    q = TransmitQueue(max_items=4)
    for i in range(6):
        q.queue(f"m{i}", b"x")
    assert len(q) == 4


def test_suspicion_timeout_shrinks_with_independent_confirmations() -> None:
    s = Suspicion("a", 1, start=100.0, k=3, min_timeout=2.0, max_timeout=20.0)
    assert s.deadline() == pytest.approx(120.0)
    assert not s.confirm("a")  # the origin does not count
    assert s.confirm("b") and not s.confirm("b")
    assert s.timeout() == pytest.approx(20.0 - 18.0 * math.log(2) / math.log(4))
    assert s.confirm("c") and s.confirm("d")
    assert s.timeout() == pytest.approx(2.0)
    assert not s.confirm("e")  # k reached
    fixed = Suspicion("a", 1, start=0.0, k=0, min_timeout=5.0, max_timeout=30.0)
    assert fixed.deadline() == 5.0


def test_local_health_scales_and_saturates() -> None:
    h = LocalHealth(max_score=8)
    h.apply(5)
    h.apply(5)
    assert h.score == 8 and h.scale(0.5) == pytest.approx(4.5)
    h.apply(-20)
    assert h.score == 0
    off = LocalHealth(8, enabled=False)
    off.apply(3)
    assert off.scale(1.0) == 1.0


def test_config_profiles_and_validation() -> None:
    lan, wan, local = SwimConfig.lan(), SwimConfig.wan(), SwimConfig.local()
    assert local.probe_interval < lan.probe_interval < wan.probe_interval
    assert lan.suspicion_timeout(100) == pytest.approx(8.0)
    assert lan.retransmit_limit(100) == 12
    assert lan.push_pull_period(1000) > lan.push_pull_period(10)
    plain = lan.with_lifeguard(False)
    assert lan.lifeguard and not plain.lifeguard
    with pytest.raises(ValueError, match="probe_timeout"):
        SwimConfig(probe_interval=1.0, probe_timeout=1.5)
    with pytest.raises(ValueError, match="unknown membership profile"):
        SwimConfig.profile("moon")
    with pytest.raises(ValueError, match="secret keys"):
        SwimConfig(secret_keys=(b"123",))


def test_metadata_validation() -> None:
    assert validate_meta({"role": "raft"}) == {"role": "raft"}
    with pytest.raises(ValueError, match="string"):
        validate_meta({"gpus": 8})
    with pytest.raises(ValueError, match="limit"):
        validate_meta({"blob": "x" * 600})
