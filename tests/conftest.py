"""Suite-wide test configuration: hypothesis profiles, and a watchdog per test.

``ci`` (the default) keeps property and simulation tests bounded so the whole suite
runs in a few minutes on two cores; ``deep`` (``HYPOTHESIS_PROFILE=deep``) runs at
least 10,000 examples per property for long soak runs.

The watchdog: a test that runs longer than ``ACCORD_TEST_WATCHDOG_S`` (default 300 s,
12x the slowest test) is hung, not slow; every thread's stack is written to
``ACCORD_TEST_WATCHDOG_FILE`` (``scripts/test`` prints it; pytest has captured stderr by
then) and the run stops, so CI fails at once with where it hung instead of waiting out
its own limit.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

WATCHDOG_S = float(os.environ.get("ACCORD_TEST_WATCHDOG_S", "300"))
_WATCHDOG_FILE = os.environ.get("ACCORD_TEST_WATCHDOG_FILE", "")
_watchdog_out = open(_WATCHDOG_FILE, "w") if _WATCHDOG_FILE else sys.stderr


@pytest.fixture(autouse=True)
def _watchdog() -> Iterator[None]:
    if WATCHDOG_S > 0:
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=_watchdog_out)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "deep",
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
