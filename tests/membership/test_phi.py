"""Phi accrual detector: grows with silence, adapts to the rhythm, validates its options."""

from __future__ import annotations

import random

import pytest

from accord.membership.phi import HeartbeatMonitor, PhiAccrualDetector


def feed(det: PhiAccrualDetector, start: float, interval: float, count: int, jitter: float = 0.0, seed: int = 0) -> float:
    rng = random.Random(seed)
    t = start
    for _ in range(count):
        det.heartbeat(t)
        t += interval + rng.uniform(-jitter, jitter)
    return t - interval


def test_phi_is_zero_before_first_heartbeat_and_grows_with_silence() -> None:
    det = PhiAccrualDetector(threshold=8.0)
    assert det.phi(100.0) == 0.0
    last = feed(det, 0.0, 1.0, 50, jitter=0.05)
    values = [det.phi(last + dt) for dt in (0.5, 1.0, 1.5, 2.0, 3.0, 5.0)]
    assert values == sorted(values)
    assert values[0] < 1.0
    assert det.is_available(last + 1.0)
    assert not det.is_available(last + 5.0)


def test_regular_heartbeats_use_the_minimum_std_deviation() -> None:
    det = PhiAccrualDetector(min_std_deviation=0.2)
    feed(det, 0.0, 1.0, 300)
    assert det.std_deviation() == pytest.approx(0.2)
    assert det.samples == 200  # the window slides
    assert det.mean() == pytest.approx(1.0)


def test_acceptable_pause_delays_suspicion() -> None:
    strict = PhiAccrualDetector()
    lenient = PhiAccrualDetector(acceptable_pause=3.0)
    for det in (strict, lenient):
        feed(det, 0.0, 1.0, 30, jitter=0.1, seed=3)
    last = strict.last_heartbeat
    assert last is not None
    assert strict.phi(last + 3.0) > 8.0
    assert lenient.phi(last + 3.0) < 1.0


def test_detector_adapts_to_slower_rhythm() -> None:
    fast = PhiAccrualDetector()
    slow = PhiAccrualDetector()
    feed(fast, 0.0, 0.5, 100, jitter=0.05)
    feed(slow, 0.0, 5.0, 100, jitter=0.5)
    assert fast.phi(fast.last_heartbeat + 2.0) > slow.phi(slow.last_heartbeat + 2.0)  # type: ignore[operator]


@pytest.mark.parametrize(
    "kwargs",
    [{"threshold": 0}, {"max_samples": 0}, {"min_std_deviation": 0}, {"acceptable_pause": -1}, {"first_heartbeat_estimate": 0}],
)
def test_bad_options_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PhiAccrualDetector(**kwargs)  # type: ignore[arg-type]


def test_time_going_backwards_is_rejected_and_changes_nothing() -> None:
    det = PhiAccrualDetector()
    det.heartbeat(10.0)
    det.heartbeat(11.0)
    samples = det.samples
    with pytest.raises(ValueError, match="backwards"):
        det.heartbeat(5.0)
    assert det.samples == samples and det.last_heartbeat == 11.0


def test_monitor_lists_late_peers() -> None:
    mon = HeartbeatMonitor(threshold=5.0)
    for i in range(20):
        mon.heartbeat("a", float(i))
        if i < 10:
            mon.heartbeat("b", float(i))
    assert mon.suspects(19.5) == ["b"]
    assert mon.phi("nobody", 100.0) == 0.0
    mon.remove("b")
    assert mon.suspects(19.5) == []
