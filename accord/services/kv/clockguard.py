"""Whether this member's clock may stamp revisions: checked against the other members'.

With several shards, a write's revision is its proposer's clock time (``revorder.py``),
so the order of revisions is only as good as the members' clocks:

* a member whose clock is **behind** the others by more than ``--max-clock-offset`` can
  give a write a revision below one acknowledged before it started (real-time order
  broken);
* a member whose clock is **ahead**, or jumps ahead (a wrong NTP step, a VM restored
  from a snapshot), stamps revisions from the future; every later write on the shards it
  wrote to then lands above them, and every member's commit-wait holds each answer
  until its own clock reaches them: the whole store stalls for as long as the clock is
  ahead.

Neither may happen silently. :class:`ClockGuard` refuses to let this member stamp
(:class:`ClockUntrusted`, which the backend answers as UNAVAILABLE, so a client retries
on another member) while either of these holds:

1. **the cluster disagrees**: each peer probe (``node/peerprobe.py``, a health check to
   every member every few seconds) carries the peer's clock; the peer's reading lies
   between this member's readings at send and at receipt, so ``offset = peer - mid``
   is known to within ``err = rtt / 2``. A peer *disagrees* when ``|offset| - err``
   exceeds the allowed offset. When so many peers disagree that this member and the
   rest cannot make a majority of the cluster, this member's clock is the odd one out
   (CockroachDB stops such a node; here it only stops stamping);
2. **the clock stepped**: between two readings the wall clock moved by more than the
   monotonic clock did (beyond ``STEP_US`` plus a rate allowance, which NTP's slewing
   never reaches): untrusted until probes taken *after* the step show a majority
   agreeing with it again, whichever way it went. The prober is asked for a round at
   once (:attr:`wanted`).

With no samples yet (a starting member, a cluster of one), nothing is refused: the
guard acts on evidence, not on its absence. On one host all members read one clock and
a peer can never disagree (its reading lies between this member's two readings).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

STEP_US = 20_000
"""A wall-clock move this much beyond the monotonic clock's is a step (20 ms)."""
PAIR_US = 1_000
"""Two readings of the clocks further apart than this (a preemption) are read again."""
RATE_PPM = 1_000
"""Allowed rate difference between the wall and monotonic clocks (NTP slews at most 500)."""
SAMPLE_TTL_S = 30.0
"""A peer's sample older than this no longer counts (the peer may be gone)."""
CLOCK_FAILPOINT_ENV = "ACCORD_FAILPOINT_CLOCK_MS"
"""Tests only: a daemon started with this set reads its wall clock that many ms off
(``failpoint_clock``), as a member of a real cluster whose clock is wrong would."""


def failpoint_clock(offset_ms: str) -> Callable[[], int]:
    """The wall clock (ns) of a member: the system's, shifted by ``offset_ms`` (the
    failpoint's value; empty: not shifted). A value that is not a number is refused."""
    if not offset_ms:
        return time.time_ns
    try:
        shift = int(float(offset_ms) * 1_000_000)
    except ValueError:
        raise ValueError(f"{CLOCK_FAILPOINT_ENV}={offset_ms!r}: not a number of ms") from None

    def shifted() -> int:
        return time.time_ns() + shift

    return shifted


class ClockUntrusted(Exception):
    """This member's clock disagrees with the cluster's (or just stepped): it must not
    stamp revisions now. The message says why, with the figures."""


@dataclass(slots=True, frozen=True)
class ClockSample:
    """One probe of a peer: its clock minus ours, and how well that is known."""

    offset_us: int
    err_us: int
    at_mono_us: int


class ClockGuard:
    """The verdict on this member's clock (see the module docstring)."""

    def __init__(self, max_offset_ms: float, *, cluster_size: Callable[[], int],
                 wall_ns: Callable[[], int] = time.time_ns,
                 mono_ns: Callable[[], int] = time.monotonic_ns) -> None:
        if max_offset_ms < 0:
            raise ValueError("max_offset_ms must be >= 0")
        self.max_offset_us = int(max_offset_ms * 1000)
        self._cluster_size = cluster_size
        self.wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._samples: dict[int, ClockSample] = {}
        self._anchor = self._reading() or (wall_ns() // 1000, mono_ns() // 1000)
        self._stepped_at: int | None = None
        """Monotonic µs of the last step seen; None once probes after it agreed."""
        self.steps = 0
        self.refusals = 0
        self.wanted = False
        """Set when a step was seen: the prober should run a round now (it clears it)."""

    def wall_us(self) -> int:
        """This member's wall clock in microseconds (what peers are told it reads)."""
        return self.wall_ns() // 1000

    def mono_us(self) -> int:
        """This member's monotonic clock in microseconds."""
        return self._mono_ns() // 1000

    def _reading(self) -> tuple[int, int] | None:
        """The wall and monotonic clocks read together (µs): the wall clock between two
        monotonic readings at most ``PAIR_US`` apart (a process preempted between two
        readings would otherwise look like a step); None if no such pair came in a few
        tries (the step check is then left for the next stamp)."""
        for _ in range(3):
            before = self._mono_ns()
            wall = self.wall_ns()
            after = self._mono_ns()
            if after - before <= PAIR_US * 1000:
                return wall // 1000, (before + after) // 2000
        return None

    # --- evidence ---------------------------------------------------------------------
    def observe(self, peer: int, sent_us: int, peer_us: int, received_us: int,
                sent_mono_us: int) -> ClockSample:
        """Record a probe of ``peer``: our wall clock at send and receipt, the peer's in
        between, and our monotonic clock at send (to tell samples after a step)."""
        if received_us < sent_us:  # our clock went back during the probe: no evidence
            received_us = sent_us
        mid = (sent_us + received_us) // 2
        sample = ClockSample(peer_us - mid, (received_us - sent_us + 1) // 2, sent_mono_us)
        self._samples[peer] = sample
        return sample

    def samples(self) -> dict[int, ClockSample]:
        """The last sample of each peer (for metrics)."""
        return dict(self._samples)

    def disagrees(self, sample: ClockSample) -> bool:
        """Whether a sample shows the two clocks further apart than allowed."""
        return abs(sample.offset_us) - sample.err_us > self.max_offset_us

    # --- the verdict ------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`ClockUntrusted` if this member may not stamp now."""
        reason = self.reason()
        if reason is not None:
            self.refusals += 1
            raise ClockUntrusted(reason)

    def reason(self) -> str | None:
        """Why this member's clock is not to be used now, or None if it may be."""
        mono = self._mono_ns() // 1000
        pair = self._reading()
        if pair is not None:
            wall, mono = pair
            a_wall, a_mono = self._anchor
            self._anchor = pair
            elapsed = max(0, mono - a_mono)
            moved = (wall - a_wall) - elapsed
            if abs(moved) > STEP_US + elapsed * RATE_PPM // 1_000_000:
                self._stepped_at = mono
                self.steps += 1
                self.wanted = True
        fresh = {p: s for p, s in self._samples.items()
                 if mono - s.at_mono_us <= SAMPLE_TTL_S * 1e6}
        n = max(self._cluster_size(), len(fresh) + 1)
        quorum = n // 2 + 1
        against = [s for s in fresh.values() if self.disagrees(s)]
        if len(against) > n - quorum:
            worst = max(against, key=lambda s: abs(s.offset_us))
            way = "ahead of" if worst.offset_us < 0 else "behind"
            return (f"accord: this member's clock is {abs(worst.offset_us) / 1000:.1f} ms "
                    f"{way} {len(against)} of the other {n - 1} members' (more than "
                    f"--max-clock-offset {self.max_offset_us / 1000:g} ms): writes through "
                    "it are refused until its clock agrees with the cluster; use another "
                    "member meanwhile")
        if self._stepped_at is not None:
            after = [s for s in fresh.values() if s.at_mono_us >= self._stepped_at]
            if n > 1 and sum(1 for s in after if not self.disagrees(s)) < quorum - 1:
                return ("accord: this member's wall clock just stepped (it moved unlike "
                        "its monotonic clock); writes through it are refused until probes "
                        "of the other members show it agreeing with theirs again")
            self._stepped_at = None
        return None
