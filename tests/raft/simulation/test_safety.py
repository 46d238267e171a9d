"""Random fault schedules driven by Hypothesis: every Raft invariant after every step.

Each example is one seeded schedule (see ``accord.raft.simulation``): drops,
duplicates, delays and reordering, symmetric and one-way partitions, crashes
(some between sending and persisting), restarts from disk, membership changes
(simple and joint) and leadership transfers, lease reads under bounded clock
drift, with a client writing and reading; then the faults heal and liveness is
required. The number of examples follows the active Hypothesis profile (``ci`` by
default, ``deep`` with ``HYPOTHESIS_PROFILE=deep``, see ``scripts/deep-sim``).
The last test lets Hypothesis choose the fault rates too (and shrink them).
A failure's message names the seed and the command that replays it exactly:
``python -m accord.raft.simulation --seed N --profile P --nodes K --ticks T``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.raft.simulation import PROFILES, run_schedule

SEEDS = st.integers(0, 2**32 - 1)
NODES = st.sampled_from([3, 5])
TICKS = st.sampled_from([200, 500])


RATES = [0.0, 0.01, 0.03, 0.06, 0.12, 0.25]


@st.composite
def fault_mixes(draw: st.DrawFn) -> str:
    """A base profile with Hypothesis-chosen rates, as a replayable spec string."""
    base = draw(st.sampled_from(sorted(PROFILES)))
    keys = ["drop", "dup", "partition_rate", "crash_rate", "conf_change_rate",
            "transfer_rate"]
    rates = [f"{k}={draw(st.sampled_from(RATES))}" for k in keys]
    flags = [f"pre_vote={draw(st.sampled_from(['true', 'false']))}"]
    return base + "+" + ",".join(rates + flags)


def _check(seed: int, profile: str, nodes: int, ticks: int) -> None:
    result = run_schedule(seed, profile, nodes, ticks=ticks)
    assert result.liveness_ticks >= 0
    assert result.max_term >= 1


@settings(deadline=None)
@given(seed=SEEDS, profile=st.sampled_from(sorted(PROFILES)), nodes=NODES, ticks=TICKS)
def test_any_profile_keeps_every_invariant(seed: int, profile: str, nodes: int,
                                           ticks: int) -> None:
    _check(seed, profile, nodes, ticks)


@settings(deadline=None)
@given(seed=SEEDS, profile=st.sampled_from(["crashes", "figure8", "plain", "chaos"]),
       nodes=NODES, ticks=TICKS)
def test_crashes_and_leader_churn_keep_every_invariant(seed: int, profile: str, nodes: int,
                                                       ticks: int) -> None:
    _check(seed, profile, nodes, ticks)


@settings(deadline=None)
@given(seed=SEEDS, profile=st.sampled_from(["membership", "transfers", "chaos"]),
       nodes=NODES, ticks=TICKS)
def test_membership_changes_and_transfers_keep_every_invariant(seed: int, profile: str,
                                                               nodes: int, ticks: int) -> None:
    _check(seed, profile, nodes, ticks)


@settings(deadline=None)
@given(seed=SEEDS, profile=st.sampled_from(["lease", "partitions", "lossy"]), nodes=NODES,
       ticks=TICKS)
def test_reads_stay_linearizable_under_partitions(seed: int, profile: str, nodes: int,
                                                  ticks: int) -> None:
    _check(seed, profile, nodes, ticks)


@settings(deadline=None)
@given(seed=SEEDS, profile=fault_mixes(), nodes=NODES, ticks=TICKS)
def test_hypothesis_chosen_fault_mixes_keep_every_invariant(seed: int, profile: str,
                                                            nodes: int, ticks: int) -> None:
    _check(seed, profile, nodes, ticks)
