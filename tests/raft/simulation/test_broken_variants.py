"""The simulator can fail: each deliberately broken core is caught.

Random search: for each variant the test replays the seed recorded below (the
first seed, in order, that caught it when this test was written); if a change
in the core makes that seed pass, it searches the following seeds, so the claim
checked is always "some seed among the first ``LIMIT`` catches it", never a
canned result, and a moved seed is reported so the record can be updated.

Targeted scenario: committing entries of earlier terms by counting replicas
(Figure 8 of the Raft paper) needs three leaders with a precise interleaving;
random schedules reach it only with the ``figure8`` profile (which cuts leaders
off the moment they are elected or advance their commit index), in about 1.5%
of its schedules. ``scenarios.figure8`` scripts those faults so that it is
caught every time; the checker, not the script, finds the violation, and the
same script passes on the real core.
"""

from __future__ import annotations

import pytest

from accord.raft.simulation import InvariantViolation, default_core, run_schedule
from tests.raft.simulation.broken import VARIANTS
from tests.raft.simulation.scenarios import figure8

# variant -> (profile, nodes, ticks, recorded first catching seed, seeds searched,
#             what the violation must name)
EXPECTED: dict[str, tuple[str, int, int, int, int, tuple[str, ...]]] = {
    "read-no-term-check": ("chaos", 3, 150, 5, 60, ("linearizability",)),
    "vote-no-log-check": ("plain", 3, 150, 3, 60, ("leader completeness", "state machine safety",
                                                   "overwrites committed")),
    "old-term-commit": ("figure8", 3, 300, 32, 400, ("leader completeness",
                                                     "state machine safety",
                                                     "overwrites committed")),
    "lease-forever": ("lease", 3, 150, 13, 60, ("linearizability",)),
    "acks-before-persist": ("crashes", 3, 150, 0, 60, ("before persisting", "on disk")),
    "never-ticks": ("calm", 3, 150, 0, 60, ("liveness",)),
}


def _catch(variant: str, profile: str, nodes: int, ticks: int, seed: int) -> str | None:
    try:
        run_schedule(seed, profile, nodes, ticks=ticks, core_factory=VARIANTS[variant],
                     variant=variant)
    except InvariantViolation as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_random_schedules_catch_the_broken_variant(variant: str) -> None:
    profile, nodes, ticks, recorded, limit, words = EXPECTED[variant]
    seeds = [recorded] + [s for s in range(limit) if s != recorded]
    for seed in seeds:
        failure = _catch(variant, profile, nodes, ticks, seed)
        if failure is not None:
            break
    else:
        pytest.fail(f"no seed among the first {limit} catches the {variant} variant")
    assert any(w in failure for w in words), failure
    assert (f"replay: python -m accord.raft.simulation --seed {seed} --profile {profile} "
            f"--nodes {nodes} --ticks {ticks} --variant {variant}") in failure
    assert seed == recorded, (
        f"the {variant} variant is now first caught by seed {seed}, not {recorded}: "
        f"update EXPECTED\n{failure}")


def test_figure8_scenario_catches_commit_by_counting_old_terms() -> None:
    with pytest.raises(InvariantViolation, match="leader completeness") as info:
        figure8(VARIANTS["old-term-commit"], "old-term-commit")
    assert "replay: pytest tests/raft/simulation/test_broken_variants.py -k figure8" in str(info.value)


def test_figure8_scenario_passes_on_the_real_core() -> None:
    result = figure8(default_core)
    assert result.liveness_ticks >= 0
    assert result.max_term >= 4


def test_replaying_a_caught_seed_fails_the_same_way() -> None:
    profile, nodes, ticks, seed, _, _ = EXPECTED["old-term-commit"]
    first = _catch("old-term-commit", profile, nodes, ticks, seed)
    again = _catch("old-term-commit", profile, nodes, ticks, seed)
    assert first is not None and first == again
