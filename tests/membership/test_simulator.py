"""Whole-group behaviour in the deterministic simulator: joins, crashes, slow members,
partitions, pauses, leaves, metadata, encryption, determinism."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from accord.membership.config import SwimConfig
from accord.membership.simulator import Simulator, views_of
from accord.membership.state import EventKind, MemberEvent, MemberState

DEAD, ALIVE, LEFT = MemberState.DEAD, MemberState.ALIVE, MemberState.LEFT


def all_see(sim: Simulator, subject: int, state: MemberState | None) -> bool:
    counts = views_of(sim, subject)
    return set(counts) == {state}


def run_until_true(sim: Simulator, cond: object, limit: float, step: float = 0.5) -> float:
    """Advance until ``cond()`` holds; returns the simulated time it took."""
    start = sim.now
    while sim.now - start < limit:
        sim.run_for(step)
        if cond():  # type: ignore[operator]
            return sim.now - start
    raise AssertionError(f"condition not met within {limit} simulated seconds")


def test_members_join_through_one_seed_and_converge() -> None:
    sim = Simulator(SwimConfig.lan(), 80, seed=3, loss=0.01, converged=False)
    run_until_true(sim, lambda: all(n.proto.live_count == 80 for n in sim.nodes), 30.0)
    for node in sim.nodes:
        assert all(m.state == ALIVE for m in node.proto.members())


@pytest.mark.parametrize("lifeguard", [False, True])
def test_crashed_members_are_declared_dead_by_everyone_within_the_bound(lifeguard: bool) -> None:
    cfg = SwimConfig.lan().with_lifeguard(lifeguard)
    n = 200
    sim = Simulator(cfg, n, seed=11, loss=0.01)
    sim.run_until(5.0)
    victims = [7, 50, 123]
    for v in victims:
        sim.crash(v)
    # Bound: a full round-robin pass cannot be needed (others probe it too); allow a
    # few probe periods to be probed, the longest suspicion timeout, and dissemination.
    longest = cfg.suspicion_timeout(n) * (cfg.suspicion_max_timeout_mult if lifeguard else 1)
    bound = 10 * cfg.probe_interval + longest
    took = run_until_true(sim, lambda: all(all_see(sim, v, DEAD) for v in victims), bound)
    assert took <= bound
    for node in sim.running():
        assert node.proto.live_count == n - len(victims)


def test_same_seed_gives_the_same_history_and_another_seed_does_not() -> None:
    def trace(seed: int) -> str:
        h = hashlib.sha256()

        def on_event(t: float, i: int, ev: MemberEvent) -> None:
            h.update(f"{t:.9f} {i} {ev.kind.value} {ev.member.name} {ev.member.incarnation}\n".encode())

        sim = Simulator(SwimConfig.lan(), 30, seed=seed, loss=0.05, slow_fraction=0.1, on_event=on_event)
        sim.run_until(5.0)
        sim.crash(3)
        sim.run_until(25.0)
        h.update(repr(sim.totals()).encode())
        # Churn filled packets, yet none exceeded the UDP bound.
        largest = max(n.proto.stats.largest_packet for n in sim.nodes)
        assert 0 < largest <= sim.config.udp_buffer_size
        return h.hexdigest()

    assert trace(5) == trace(5)
    assert trace(5) != trace(6)


def test_lifeguard_cuts_false_deaths_caused_by_slow_members() -> None:
    def false_deaths(lifeguard: bool) -> int:
        healthy_declared = 0
        sim: Simulator

        def on_declare(t: float, observer: int, subject: str) -> None:
            nonlocal healthy_declared
            if not sim.nodes[int(subject[1:])].slow:
                healthy_declared += 1

        sim = Simulator(
            SwimConfig.lan().with_lifeguard(lifeguard), 40, seed=2, loss=0.01,
            slow_fraction=0.1, slow_lag=(0.0, 20.0), slow_episode=(10.0, 60.0),
            on_declare_dead=on_declare,
        )
        sim.run_until(60.0)
        return healthy_declared

    plain, lifeguard = false_deaths(False), false_deaths(True)
    assert plain >= 10
    assert lifeguard * 5 <= plain


@pytest.mark.parametrize("rejoin", [True, False])
def test_partition_then_heal_rejoins_both_sides(rejoin: bool) -> None:
    cfg = replace(SwimConfig.lan(), rejoin_interval=10.0 if rejoin else 0.0, gossip_to_dead_time=20.0)
    n = 40
    sim = Simulator(cfg, n, seed=4, loss=0.01)
    sim.run_until(5.0)
    left, right = list(range(0, 20)), list(range(20, 40))
    sim.partition([left, right])

    def forgotten() -> bool:  # each side declared the other dead and reaped it
        return all(
            sim.view(i, j) is None and sim.view(j, i) is None for i in left for j in right
        )

    def healed() -> bool:
        return all(node.proto.live_count == 40 for node in sim.nodes)

    run_until_true(sim, forgotten, 120.0, step=2.0)
    sim.heal()
    if rejoin:
        run_until_true(sim, healed, 120.0, step=2.0)
    else:
        # Without re-join attempts the two sides never find each other (memberlist #222).
        sim.run_for(120.0)
        assert not healed()


def test_paused_member_is_suspected_then_refutes_after_resuming() -> None:
    sim = Simulator(SwimConfig.lan(), 30, seed=8, loss=0.0)
    sim.run_until(3.0)
    inc = sim.nodes[5].proto.local_member.incarnation
    sim.pause(5, 40.0)  # far past the suspicion timeout: everyone declares it dead
    run_until_true(sim, lambda: all_see(sim, 5, DEAD), 40.0)
    run_until_true(sim, lambda: all_see(sim, 5, ALIVE), 60.0)
    assert sim.nodes[5].proto.local_member.incarnation > inc
    sim.run_for(20.0)
    assert all_see(sim, 5, ALIVE)  # no permanent false death


def test_graceful_leave_and_metadata_updates_disseminate() -> None:
    events: list[tuple[int, MemberEvent]] = []
    sim = Simulator(SwimConfig.lan(), 40, seed=9, loss=0.01, on_event=lambda t, i, e: events.append((i, e)))
    sim.run_until(2.0)
    sim.update_meta(4, {"role": "gpu-agent", "gpus": "sha256:abc"})
    sim.leave(9)

    def meta_everywhere() -> bool:
        return all(
            node.proto.member("n4").meta.get("role") == "gpu-agent"  # type: ignore[union-attr]
            for node in sim.running()
            if node.idx != 9  # it left: nobody talks to it any more
        )

    run_until_true(sim, lambda: all_see(sim, 9, LEFT) and meta_everywhere(), 15.0)
    updated = {i for i, e in events if e.kind is EventKind.UPDATED and e.member.name == "n4"}
    assert len(updated) >= 39
    assert not any(e.kind is EventKind.DEAD and e.member.name == "n9" for _, e in events)


def test_encrypted_group_works_and_a_member_with_the_wrong_key_stays_out() -> None:
    cfg = replace(SwimConfig.lan(), secret_keys=(b"k" * 32,))
    sim = Simulator(cfg, 12, seed=1, converged=False)
    run_until_true(sim, lambda: all(n.proto.live_count == 12 for n in sim.nodes), 20.0)
    # An intruder with another key joins through member 0: nobody lets it in.
    intruder_cfg = replace(SwimConfig.lan(), secret_keys=(b"x" * 32,))
    from accord.membership.protocol import SwimProtocol

    intruder = SwimProtocol(intruder_cfg, "intruder", ("10.9.9.9", 7946))
    intruder.start(sim.now)
    target = sim.nodes[0].proto
    for _, data in [(a, d) for a, d in intruder.take_output().packets] + [(None, intruder.push_pull_payload(True))]:
        target.handle_packet(intruder.addr, data, sim.now)
    assert not target.merge_push_pull(intruder.push_pull_payload(True), sim.now)
    assert target.member("intruder") is None
    assert target.stats.auth_failures >= 2


def test_paused_member_resumes_its_own_probing() -> None:
    sim = Simulator(SwimConfig.lan(), 10, seed=12)
    sim.run_until(2.0)
    probes = sim.nodes[3].proto.stats.probes
    sim.pause(3, 5.0)
    sim.run_until(6.9)
    assert sim.nodes[3].proto.stats.probes == probes  # frozen
    sim.run_until(20.0)
    assert sim.nodes[3].proto.stats.probes >= probes + 10
