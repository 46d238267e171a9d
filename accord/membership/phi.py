"""The Phi accrual failure detector, for links where heartbeats flow continuously.

Instead of a yes/no timeout it outputs ``phi``, the suspicion level: ``-log10`` of the
probability that a heartbeat arrives even later than now, given the distribution of
recent inter-arrival times (a normal distribution fitted to a sliding window). Phi 1
means a 10% chance the peer is fine, phi 8 one in 10^8. The caller picks a threshold;
detection adapts by itself to each link's rhythm and jitter.

* ``min_std_deviation`` keeps perfectly regular heartbeats from making phi explode at
  the first tiny delay;
* ``acceptable_pause`` is added to the mean: a pause that long (GC, a busy event loop)
  is not suspicious;
* the window starts from ``first_heartbeat_estimate`` so a fresh detector is neither
  blind nor paranoid.

Used for Raft peer liveness and GPU-agent heartbeats. Pure: the caller passes times.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

__all__ = ["HeartbeatMonitor", "PhiAccrualDetector"]


class PhiAccrualDetector:
    """Phi accrual over a sliding window of heartbeat inter-arrival times (seconds)."""

    __slots__ = (
        "_intervals",
        "_last",
        "_sum",
        "_sum_sq",
        "acceptable_pause",
        "first_heartbeat_estimate",
        "max_samples",
        "min_std_deviation",
        "threshold",
    )

    def __init__(
        self,
        threshold: float = 8.0,
        max_samples: int = 200,
        min_std_deviation: float = 0.1,
        acceptable_pause: float = 0.0,
        first_heartbeat_estimate: float = 1.0,
    ) -> None:
        if threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {threshold}")
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        if min_std_deviation <= 0:
            raise ValueError(f"min_std_deviation must be > 0, got {min_std_deviation}")
        if acceptable_pause < 0:
            raise ValueError(f"acceptable_pause must be >= 0, got {acceptable_pause}")
        if first_heartbeat_estimate <= 0:
            raise ValueError(f"first_heartbeat_estimate must be > 0, got {first_heartbeat_estimate}")
        self.threshold = threshold
        self.max_samples = max_samples
        self.min_std_deviation = min_std_deviation
        self.acceptable_pause = acceptable_pause
        self.first_heartbeat_estimate = first_heartbeat_estimate
        self._intervals: deque[float] = deque()
        self._sum = 0.0
        self._sum_sq = 0.0
        self._last: float | None = None

    @property
    def last_heartbeat(self) -> float | None:
        """Time of the latest heartbeat (None before the first)."""
        return self._last

    @property
    def samples(self) -> int:
        """Inter-arrival samples in the window."""
        return len(self._intervals)

    def _add(self, interval: float) -> None:
        self._intervals.append(interval)
        self._sum += interval
        self._sum_sq += interval * interval
        if len(self._intervals) > self.max_samples:
            old = self._intervals.popleft()
            self._sum -= old
            self._sum_sq -= old * old

    def heartbeat(self, now: float) -> None:
        """Record a heartbeat arriving at ``now`` (times must not go backwards)."""
        last = self._last
        if last is None:
            # Seed the window with an estimate: mean = estimate, std = estimate / 4.
            est = self.first_heartbeat_estimate
            std = est / 4
            self._add(est - std)
            self._add(est + std)
        elif now < last:
            raise ValueError(f"heartbeat time went backwards: {now} < {last}")
        else:
            self._add(now - last)
        self._last = now

    def mean(self) -> float:
        """Mean inter-arrival time of the window."""
        return self._sum / len(self._intervals) if self._intervals else self.first_heartbeat_estimate

    def std_deviation(self) -> float:
        """Standard deviation of the window, floored at ``min_std_deviation``."""
        n = len(self._intervals)
        if n == 0:
            return self.min_std_deviation
        var = max(0.0, self._sum_sq / n - (self._sum / n) ** 2)
        return max(math.sqrt(var), self.min_std_deviation)

    def phi(self, now: float) -> float:
        """Suspicion level at ``now``; 0 before the first heartbeat."""
        if self._last is None:
            return 0.0
        elapsed = max(0.0, now - self._last)
        mean = self.mean() + self.acceptable_pause
        std = self.std_deviation()
        # Logistic approximation of the normal CDF's tail (error < 1e-4).
        # P(later) = e / (1 + e) with e = exp(-z), z = y * (1.5976 + 0.070566 y^2).
        y = (elapsed - mean) / std
        z = y * (1.5976 + 0.070566 * y * y)
        if z > 0:  # late: phi = -log10(e / (1 + e)), computed without underflow
            return z / math.log(10) + math.log10(1.0 + math.exp(-z))
        if z < -700:  # so early that a later arrival is certain
            return 0.0
        e = math.exp(-z)
        return -math.log10(1.0 - 1.0 / (1.0 + e))

    def is_available(self, now: float) -> bool:
        """True while phi stays below the threshold."""
        return self.phi(now) < self.threshold


class HeartbeatMonitor:
    """One detector per peer, created on its first heartbeat: ``suspects(now)`` lists the late."""

    def __init__(
        self,
        threshold: float = 8.0,
        max_samples: int = 200,
        min_std_deviation: float = 0.1,
        acceptable_pause: float = 0.0,
        first_heartbeat_estimate: float = 1.0,
    ) -> None:
        def make() -> PhiAccrualDetector:
            return PhiAccrualDetector(
                threshold, max_samples, min_std_deviation, acceptable_pause, first_heartbeat_estimate
            )

        make()  # validate the options once, up front
        self._make = make
        self._detectors: dict[Hashable, PhiAccrualDetector] = {}

    def heartbeat(self, peer: Hashable, now: float) -> None:
        """Record a heartbeat from ``peer``."""
        det = self._detectors.get(peer)
        if det is None:
            det = self._detectors[peer] = self._make()
        det.heartbeat(now)

    def phi(self, peer: Hashable, now: float) -> float:
        """Suspicion level of ``peer`` (0 if never heard from)."""
        det = self._detectors.get(peer)
        return det.phi(now) if det is not None else 0.0

    def suspects(self, now: float) -> list[Hashable]:
        """Peers whose phi is at or above the threshold."""
        return [p for p, d in self._detectors.items() if not d.is_available(now)]

    def remove(self, peer: Hashable) -> None:
        """Forget ``peer`` (it left the group)."""
        self._detectors.pop(peer, None)
