"""Suite-wide test configuration: hypothesis profiles, and a watchdog per test.

``ci`` (the default) keeps property and simulation tests bounded so the whole suite
runs in a few minutes on two cores; ``deep`` (``HYPOTHESIS_PROFILE=deep``) runs at
least 10,000 examples per property for long soak runs.

The watchdog: a test that runs longer than ``ACCORD_TEST_WATCHDOG_S`` (default 300 s,
12x the slowest test) is hung, not slow; every thread's stack is written to
``ACCORD_TEST_WATCHDOG_FILE`` (``scripts/test`` prints it; pytest has captured stderr by
then) and the test's process ends, so CI fails with where it hung instead of waiting
out its own limit (under xdist that process is a worker, which ``scripts/test`` does not
let xdist replace: a replacement would run the hung test again).

Two workers (``scripts/test`` runs pytest-xdist with ``-n 2``): the tests of
``tests/integration`` run one after another on one worker, first, while the other
worker takes everything else, a module at a time. Those tests kill, pause and cut off
real daemons and are sized by the faults' deadlines, so no two of them run side by side;
the daemons of other directories (auth, compatibility, locks) do run beside them.
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
# Appended to: each xdist worker opens it.
_watchdog_out = open(_WATCHDOG_FILE, "a") if _WATCHDOG_FILE else sys.stderr


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


DAEMON_TESTS = "tests/integration/"
"""The directory whose tests run real daemons under fault deadlines (see the docstring)."""


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to under xdist: every daemon test one unit, any
    other test its module (whose tests then share a module-scoped cluster, in order)."""
    return "daemons" if nodeid.startswith(DAEMON_TESTS) else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called only under it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduling by scope, with :func:`work_unit` as the scope."""
    from xdist.scheduler import LoadScopeScheduling

    class DaemonsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return DaemonsApart(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The daemon tests first: their unit is the longest, so it starts at once."""
    items.sort(key=lambda i: work_unit(i.nodeid) != "daemons")
