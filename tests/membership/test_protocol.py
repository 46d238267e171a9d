"""The sans-I/O protocol, driven by hand: probes, buddy system, nacks, refutation, push-pull."""

from __future__ import annotations

import random

from accord.membership.config import SwimConfig
from accord.membership.protocol import SwimProtocol
from accord.membership.state import Address, EventKind, MemberState
from accord.membership.wire import (
    Alive,
    Ping,
    Suspect,
    build_packet,
    decode_packet,
    encode_message,
    wrap_update,
)


class Net:
    """Protocols wired together by hand; ``drop`` silences members; time moves on ``run``."""

    def __init__(self, names: list[str], config: SwimConfig | None = None) -> None:
        self.config = config or SwimConfig.lan()
        self.now = 0.0
        self.protos: dict[Address, SwimProtocol] = {}
        self.drop: set[str] = set()
        self.sent: list[tuple[str, Address, bytes]] = []
        for i, name in enumerate(names):
            addr = ("127.0.0.1", 9000 + i)
            self.protos[addr] = SwimProtocol(self.config, name, addr, rng=random.Random(i))

    def by_name(self, name: str) -> SwimProtocol:
        return next(p for p in self.protos.values() if p.name == name)

    def start_converged(self) -> None:
        first = next(iter(self.protos.values()))
        for p in self.protos.values():
            p.start(self.now)
        for p in self.protos.values():
            first.merge_push_pull(p.push_pull_payload(), self.now)
        payload = first.push_pull_payload()
        for p in self.protos.values():
            p.merge_push_pull(payload, self.now)
            p.take_output()

    def flush(self, proto: SwimProtocol) -> None:
        pending = [(proto, proto.take_output().packets)]
        while pending:
            src, packets = pending.pop()
            for addr, data in packets:
                self.sent.append((src.name, addr, data))
                dst = self.protos.get(addr)
                if dst is None or dst.name in self.drop or src.name in self.drop:
                    continue
                dst.handle_packet(src.addr, data, self.now)
                pending.append((dst, dst.take_output().packets))

    def run(self, until: float, step: float = 0.05) -> None:
        while self.now < until:
            self.now = round(self.now + step, 6)
            for p in self.protos.values():
                if p.name not in self.drop:
                    p.tick(self.now)
                    self.flush(p)


def test_converged_group_stays_alive_without_faults() -> None:
    net = Net(["a", "b", "c", "d"])
    net.start_converged()
    net.run(20.0)
    for p in net.protos.values():
        assert p.live_count == 4
        assert all(m.state == MemberState.ALIVE for m in p.members())
        assert p.stats.probes > 10 and p.stats.probe_failures == 0


def test_silent_member_is_suspected_then_declared_dead() -> None:
    net = Net(["a", "b", "c", "d"], SwimConfig.local())
    net.start_converged()
    net.drop.add("d")
    net.run(10.0)
    for name in "abc":
        p = net.by_name(name)
        assert p.member("d").state == MemberState.DEAD  # type: ignore[union-attr]
        assert p.live_count == 3


def test_indirect_probers_send_nacks_for_a_silent_target() -> None:
    net = Net(["a", "b", "c", "d"], SwimConfig.local())
    net.start_converged()
    net.drop.add("d")
    net.run(2.0)
    assert sum(net.by_name(n).stats.nacks_sent for n in "abc") > 0
    # Nacks came back, so the prober does not blame itself: health stays low.
    assert all(net.by_name(n).health_score <= 1 for n in "abc")


def test_isolated_member_raises_its_local_health_score() -> None:
    net = Net(["a", "b", "c", "d"], SwimConfig.local())
    net.start_converged()
    # a hears nothing at all (its packets go out, nothing comes back).
    a = net.by_name("a")
    original = a.handle_packet
    a.handle_packet = lambda src, data, now: None  # type: ignore[method-assign]
    net.run(3.0)
    assert a.health_score >= 3
    a.handle_packet = original  # type: ignore[method-assign]


def test_buddy_system_tells_the_suspect_on_the_probe_itself() -> None:
    net = Net(["a", "b", "c"])
    net.start_converged()
    a, b = net.by_name("a"), net.by_name("b")
    # a comes to suspect b (as if a probe had failed).
    suspect = build_packet(None, [wrap_update(encode_message(Suspect(0, "b", "c")))])
    a.handle_packet(("127.0.0.1", 9002), suspect, net.now)
    a.take_output()
    assert a.member("b").state == MemberState.SUSPECT  # type: ignore[union-attr]
    b_inc = b.local_member.incarnation
    # Only a's probe of b carries the news: the first update in it is the suspicion.
    while True:
        net.now += 0.05
        a.tick(net.now)
        packets = a.take_output().packets
        ping = [d for addr, d in packets if addr == b.addr and isinstance(decode_packet(d)[0], Ping)]
        if ping:
            break
    _, updates = decode_packet(ping[0])
    assert updates and updates[0] == Suspect(0, "b", "a")
    b.handle_packet(a.addr, ping[0], net.now)
    assert b.local_member.incarnation == b_inc + 1  # b refuted
    assert b.stats.refutations == 1
    # b's ack carries the refutation back, and a sees b alive again.
    for addr, data in b.take_output().packets:
        if addr == a.addr:
            a.handle_packet(b.addr, data, net.now)
    assert a.member("b").state == MemberState.ALIVE  # type: ignore[union-attr]
    kinds = [e.kind for e in a.take_output().events if e.member.name == "b"]
    assert EventKind.ALIVE in kinds


def test_stale_and_malformed_input_changes_nothing() -> None:
    net = Net(["a", "b"])
    net.start_converged()
    a = net.by_name("a")
    before = {m.name: m for m in a.members()}
    a.handle_packet(("1.2.3.4", 1), b"\xff\xfe", 1.0)
    a.handle_packet(("1.2.3.4", 1), build_packet(None, [b"\xc4\x01\x00"]), 1.0)
    assert a.stats.decode_errors == 2
    assert {m.name: m for m in a.members()} == before
    assert not a.take_output().events


def test_push_pull_turns_remote_dead_into_local_suspicion() -> None:
    net = Net(["a", "b", "c"])
    net.start_converged()
    a, b = net.by_name("a"), net.by_name("b")
    b._dead(0, "c", "b", net.now)  # b alone believes c dead
    a.merge_push_pull(b.push_pull_payload(), net.now)
    assert a.member("c").state == MemberState.SUSPECT  # type: ignore[union-attr]
    # And a member told it is dead refutes instead of dying.
    c = net.by_name("c")
    c.merge_push_pull(b.push_pull_payload(), net.now)
    assert c.local_member.state == MemberState.ALIVE and c.local_member.incarnation == 1


def test_encrypted_group_drops_and_counts_foreign_packets() -> None:
    cfg = SwimConfig.local()
    cfg.secret_keys = (b"s" * 16,)
    net = Net(["a", "b"], cfg)
    net.start_converged()
    net.run(2.0)
    a = net.by_name("a")
    assert a.live_count == 2 and a.stats.auth_failures == 0
    plain = SwimProtocol(SwimConfig.local(), "x", ("127.0.0.1", 9999))
    plain.start(net.now)
    a.handle_packet(plain.addr, plain.push_pull_payload(), net.now)
    assert not a.merge_push_pull(plain.push_pull_payload(), net.now)
    assert a.stats.auth_failures == 2 and a.member("x") is None


def test_packets_stay_within_the_udp_bound_however_much_is_queued() -> None:
    net = Net(["a", "b"])
    net.start_converged()
    a, b = net.by_name("a"), net.by_name("b")
    meta = {"role": "gpu-agent", "gpus": "x" * 200}
    news = [wrap_update(encode_message(Alive(1, f"m{i}", ("10.1.0.1", i), meta))) for i in range(300)]
    for i in range(0, 300, 5):
        a.handle_packet(b.addr, build_packet(None, news[i : i + 5]), net.now)
    assert a.live_count == 302
    net.run(net.now + 3.0)
    sizes = [len(data) for src, _, data in net.sent if src == "a"]
    assert max(sizes) <= a.config.udp_buffer_size
    assert max(sizes) > a.config.udp_buffer_size - 300  # packets were filled
