"""The clock guard (``clockguard.py``): a member whose clock disagrees with the cluster's,
or just stepped, stamps no revision, so it can neither stall the store with revisions
from the future nor break real-time order with ones from the past.

Clocks here are fakes moved by hand; the peers' "probes" are the readings a probe would
give (our wall clock at send and at receipt, the peer's in between). The broken
variant is a member with no guard: its write after a clock jump lands in the future.
"""

from __future__ import annotations

import time

import pytest

from accord.proto import rpc_pb2 as pb
from accord.services.kv.clockguard import (
    SAMPLE_TTL_S,
    STEP_US,
    ClockGuard,
    ClockUntrusted,
    failpoint_clock,
)
from accord.services.kv.errors import EtcdError
from accord.services.kv.revorder import RevisionOrder
from tests.kv.test_revorder import SHARDS, Member, key_on, shards_of


class Clocks:
    """A wall and a monotonic clock (ns) that move together by 1 us per wall reading
    (so a commit-wait ends), and otherwise only when told to."""

    def __init__(self, wall_us: int = 1_700_000_000_000_000) -> None:
        self.wall = wall_us * 1000
        self.mono = 5_000_000_000
        self.preempt_us = 0
        self.armed = False

    def wall_ns(self) -> int:
        self.advance(1)
        self.armed = self.preempt_us > 0
        return self.wall

    def mono_ns(self) -> int:
        if self.armed:  # the process was preempted between a wall and this reading
            self.advance(self.preempt_us)
            self.preempt_us, self.armed = 0, False
        return self.mono

    def advance(self, us: int) -> None:
        self.wall += us * 1000
        self.mono += us * 1000

    def step(self, us: int) -> None:
        """The wall clock jumps; the monotonic clock does not."""
        self.wall += us * 1000


def guard_of(clocks: Clocks, members: int = 3, max_offset_ms: float = 0.0) -> ClockGuard:
    return ClockGuard(max_offset_ms, cluster_size=lambda: members,
                      wall_ns=clocks.wall_ns, mono_ns=clocks.mono_ns)


def probe(g: ClockGuard, clocks: Clocks, peer: int, peer_offset_us: int, rtt_us: int = 400) -> None:
    """What a probe of ``peer`` (whose clock is ``peer_offset_us`` off ours) reports."""
    sent_mono, sent = g.mono_us(), g.wall_us()
    clocks.advance(rtt_us // 2)
    peer_reads = g.wall_us() + peer_offset_us
    clocks.advance(rtt_us - rtt_us // 2)
    g.observe(peer, sent, peer_reads, g.wall_us(), sent_mono)


def test_peers_on_one_clock_never_disagree_even_with_no_offset_allowed() -> None:
    clocks = Clocks()
    g = guard_of(clocks)
    for _ in range(50):
        probe(g, clocks, 2, 0, rtt_us=7)
        probe(g, clocks, 3, 0, rtt_us=1_000)
        g.check()
    assert g.refusals == 0


def test_a_member_behind_or_ahead_of_a_majority_is_refused_and_says_by_how_much() -> None:
    for offset, way in ((-900_000, "ahead of"), (900_000, "behind")):
        clocks = Clocks()
        g = guard_of(clocks, max_offset_ms=250)
        probe(g, clocks, 2, offset)
        g.check()  # one peer of two disagreeing: this member and the other make a majority
        probe(g, clocks, 3, offset)
        with pytest.raises(ClockUntrusted, match=f"{abs(offset) / 1000:.1f} ms {way} 2 of the other 2"):
            g.check()
        # within the allowed offset (less the probe's uncertainty) both agree again
        probe(g, clocks, 2, 240_000 if offset > 0 else -240_000)
        probe(g, clocks, 3, 0)
        g.check()


def test_the_odd_member_out_is_refused_but_the_majority_is_not() -> None:
    clocks = Clocks()
    good = guard_of(clocks, max_offset_ms=10)
    probe(good, clocks, 2, 0)
    probe(good, clocks, 3, 5_000_000)  # member 3 is 5 s ahead
    good.check()
    odd = guard_of(clocks, max_offset_ms=10)
    probe(odd, clocks, 1, -5_000_000)
    probe(odd, clocks, 2, -5_000_000)
    with pytest.raises(ClockUntrusted):
        odd.check()


def test_a_clock_step_is_refused_until_probes_after_it_agree() -> None:
    clocks = Clocks()
    g = guard_of(clocks, max_offset_ms=50)
    probe(g, clocks, 2, 0)
    probe(g, clocks, 3, 0)
    g.check()
    clocks.step(STEP_US + 5_000)  # ahead by 25 ms: within the allowed offset, but a step
    with pytest.raises(ClockUntrusted, match="stepped"):
        g.check()
    assert g.wanted and g.steps == 1
    with pytest.raises(ClockUntrusted):  # the samples from before the step do not count
        g.check()
    probe(g, clocks, 2, -25_000)  # one peer after the step agrees: with us, a majority
    g.check()
    # a step well beyond the allowed offset: the probes after it disagree
    clocks.step(3_600_000_000)
    with pytest.raises(ClockUntrusted, match="stepped"):
        g.check()
    probe(g, clocks, 2, -3_600_025_000)
    probe(g, clocks, 3, -3_600_000_000)
    with pytest.raises(ClockUntrusted, match="ahead of 2 of the other 2"):
        g.check()


def test_slewing_and_idle_hours_are_not_steps() -> None:
    clocks = Clocks()
    g = guard_of(clocks)
    g.check()
    for _ in range(10):  # an hour idle, with the wall clock slewed at NTP's 500 ppm
        clocks.advance(360_000_000)
        clocks.step(180_000)
        g.check()
    assert g.steps == 0


def test_a_process_preempted_between_two_clock_readings_sees_no_step() -> None:
    clocks = Clocks()
    g = guard_of(clocks)
    for _ in range(5):
        clocks.advance(1_000)
        g.check()
        clocks.advance(1_000)
        clocks.preempt_us = 50_000  # 50 ms: a loaded host's run queue
        g.check()
    assert g.steps == 0


def test_old_samples_expire_and_a_lone_member_never_waits_for_evidence() -> None:
    clocks = Clocks()
    g = guard_of(clocks, max_offset_ms=1)
    probe(g, clocks, 2, 10_000_000)
    probe(g, clocks, 3, 10_000_000)
    with pytest.raises(ClockUntrusted):
        g.check()
    clocks.advance(int(SAMPLE_TTL_S * 1e6) + 1)
    g.check()  # no fresh evidence: nothing refused
    alone = guard_of(clocks, members=1)
    clocks.step(10_000_000)
    alone.check()  # a cluster of one has no one to disagree with


def test_the_failpoint_clock_is_shifted_and_refuses_nonsense() -> None:
    shifted = failpoint_clock("1500")
    assert abs(shifted() - time.time_ns() - 1_500_000_000) < 1_000_000_000
    assert failpoint_clock("") is time.time_ns
    with pytest.raises(ValueError, match="not a number"):
        failpoint_clock("soon")


async def test_a_member_whose_clock_jumps_stamps_nothing_instead_of_the_future() -> None:
    """The store-level check, and its broken variant (no guard): after a one-hour jump a
    member's write would land an hour in the future, and every later write on that shard
    with it (each member's answer then waiting an hour)."""
    hour_us = 3_600_000_000
    for guarded in (True, False):
        machines = shards_of()
        clocks = Clocks(time.time_ns() // 1000)
        honest = Member(machines, time.time_ns)
        jumpy = Member(machines, clocks.wall_ns)
        g = guard_of(clocks, max_offset_ms=50) if guarded else None
        jumpy.order = RevisionOrder(SHARDS, 0.0, clock_ns=clocks.wall_ns, guard=g)
        if g is not None:
            probe(g, clocks, 2, 0)
            probe(g, clocks, 3, 0)
        first = await jumpy.put(pb.PutRequest(key=key_on(2), value=b"a"))
        assert first.header.revision // SHARDS < time.time_ns() // 1000 + 1_000_000
        clocks.step(hour_us)
        if guarded:
            with pytest.raises(EtcdError, match="stepped") as e:
                await jumpy.put(pb.PutRequest(key=key_on(2), value=b"b"))
            assert e.value.code.name == "UNAVAILABLE"
            (kv,) = (await honest.range(pb.RangeRequest(key=key_on(2)))).kvs
            assert kv.value == b"a"  # nothing of the refused write was applied
            after = await honest.put(pb.PutRequest(key=key_on(2), value=b"c"))
            assert after.header.revision // SHARDS < time.time_ns() // 1000 + 1_000_000
        else:
            late = await jumpy.put(pb.PutRequest(key=key_on(2), value=b"b"))
            # the broken variant: a revision an hour ahead of every honest clock
            assert late.header.revision // SHARDS > time.time_ns() // 1000 + hour_us // 2
