"""The visible demo tells the whole story and checks invariants while doing so."""

from __future__ import annotations

import pytest

from accord.raft.simulation import demo


def test_demo_elects_replicates_and_survives_its_leader(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--seed", "3", "--nodes", "3", "--ticks", "80"]) == 0
    out = capsys.readouterr().out
    assert out.count("becomes LEADER") >= 2
    assert "CRASHES" in out and "restarts from disk" in out
    assert "every invariant held" in out


def test_demo_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    demo.main(["--seed", "4", "--nodes", "5", "--ticks", "60"])
    first = capsys.readouterr().out
    demo.main(["--seed", "4", "--nodes", "5", "--ticks", "60"])
    assert capsys.readouterr().out == first


def test_demo_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        demo.main(["--nodes", "4"])
