"""Suite-wide test configuration: hypothesis profiles.

``ci`` (the default) keeps property and simulation tests bounded so the whole suite
runs in a few minutes on two cores; ``deep`` (``HYPOTHESIS_PROFILE=deep``) runs at
least 10,000 examples per property for long soak runs.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

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
