"""The simulator itself: determinism, replay, input checks, and checkers that can fail."""

from __future__ import annotations

import pytest

from accord.raft import simulation as simmod
from accord.raft.core.types import Entry, HardState
from accord.raft.simulation import (
    Checker,
    InvariantViolation,
    Read,
    SimNode,
    StateMachine,
    parse_profile,
    run_schedule,
)


def test_same_seed_replays_exactly() -> None:
    a = run_schedule(11, "chaos", 3, ticks=80)
    b = run_schedule(11, "chaos", 3, ticks=80)
    assert a == b
    c = run_schedule(12, "chaos", 3, ticks=80)
    assert c.fingerprint != a.fingerprint


def test_replay_command_runs_a_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    assert simmod.main(["--seed", "5", "--profile", "lossy", "--nodes", "3", "--ticks",
                        "60"]) == 0
    assert capsys.readouterr().out.startswith("ok: seed 5 profile lossy")


def test_replay_command_reports_a_violation(capsys: pytest.CaptureFixture[str]) -> None:
    code = simmod.main(["--seed", "0", "--profile", "calm", "--ticks", "30",
                        "--variant", "never-ticks"])
    assert code == 1
    assert "liveness" in capsys.readouterr().out


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        run_schedule(1, "stormy")
    with pytest.raises(ValueError, match="nodes must be"):
        run_schedule(1, "calm", nodes=0)
    for spec in ("calm+drop", "calm+name=x", "calm+drop=lots", "calm+pre_vote=1",
                 "calm+partition_ticks=3"):
        with pytest.raises(ValueError, match="profile override"):
            parse_profile(spec)


def test_profile_overrides_are_applied_and_named() -> None:
    p = parse_profile("lossy+drop=0.3,crash_rate=0.05,pre_vote=false")
    assert (p.drop, p.crash_rate, p.pre_vote, p.dup) == (0.3, 0.05, False, 0.1)
    assert p.name == "lossy+drop=0.3,crash_rate=0.05,pre_vote=false"
    assert parse_profile("lossy") is simmod.PROFILES["lossy"]


def _fail(msg: str) -> None:
    raise InvariantViolation(msg)


def test_checker_catches_two_leaders_in_one_term() -> None:
    chk = Checker(_fail)
    chk.on_leader(SimNode(1), 3)
    with pytest.raises(InvariantViolation, match="election safety"):
        chk.on_leader(SimNode(2), 3)


def test_checker_catches_divergent_applies() -> None:
    chk = Checker(_fail)
    a, b = SimNode(1), SimNode(2)
    chk.on_apply(a, Entry(1, 1, data=b"w1 a 1"), 1, [])
    with pytest.raises(InvariantViolation, match="state machine safety"):
        chk.on_apply(b, Entry(2, 1, data=b"w2 a 2"), 2, [])


def test_checker_catches_log_mismatch() -> None:
    chk = Checker(_fail)
    a, b = SimNode(1), SimNode(2)
    a.disk.entries = [Entry(1, 1, data=b"x"), Entry(1, 2, data=b"y")]
    b.disk.entries = [Entry(1, 1, data=b"x"), Entry(1, 2, data=b"z")]
    chk.on_append(a, a.disk.entries)
    with pytest.raises(InvariantViolation, match="log matching"):
        chk.on_append(b, b.disk.entries)


def test_checker_catches_a_stale_read() -> None:
    chk = Checker(_fail)
    node = SimNode(1, sm=StateMachine({"a": (1, 2)}, applied=2))
    chk.on_read(node, Read(b"r1", "a", 1, required=2, issued_tick=0))
    with pytest.raises(InvariantViolation, match="linearizability"):
        chk.on_read(node, Read(b"r2", "a", 1, required=5, issued_tick=0))


def test_checker_catches_a_changed_vote() -> None:
    chk = Checker(_fail)
    with pytest.raises(InvariantViolation, match="changed its vote"):
        chk.on_hard_state(SimNode(1), HardState(2, 1, 0), HardState(2, 3, 0))


def test_checker_catches_a_leader_missing_a_committed_entry() -> None:
    chk = Checker(_fail)
    follower, leader = SimNode(1), SimNode(2)
    chk.on_apply(follower, Entry(1, 1, data=b"w1 a 1"), 1, [])
    leader.disk.entries = [Entry(2, 1, data=b"other")]
    with pytest.raises(InvariantViolation, match="leader completeness"):
        chk.on_leader(leader, 2)
