"""The linearizability checker itself: it accepts what is linearizable and catches what is not."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.lincheck import INF, Op, check

K = b"k"


def test_sequential_history_is_linearizable() -> None:
    h = [Op(K, "write", 0, 1, 1), Op(K, "read", 2, 3, 1), Op(K, "write", 4, 5, 2),
         Op(K, "read", 6, 7, 2)]
    assert check(h) == []


def test_read_concurrent_with_a_write_may_see_either_value() -> None:
    for seen in (1, 2):
        h = [Op(K, "write", 0, 1, 1), Op(K, "write", 2, 5, 2), Op(K, "read", 3, 4, seen)]
        assert check(h) == []


def test_stale_read_after_an_acknowledged_write_is_caught() -> None:
    h = [Op(K, "write", 0, 1, 1), Op(K, "write", 2, 3, 2), Op(K, "read", 4, 5, 1)]
    [v] = check(h)
    assert v.key == K and "not linearizable" in str(v)


def test_unknown_outcome_write_may_or_may_not_have_happened() -> None:
    base = [Op(K, "write", 0, 1, 1), Op(K, "write", 2, INF, 9)]
    assert check([*base, Op(K, "read", 3, 4, 9)]) == []
    assert check([*base, Op(K, "read", 3, 4, 1)]) == []
    # but once seen, it cannot be unseen
    assert check([*base, Op(K, "read", 3, 4, 9), Op(K, "read", 5, 6, 1)]) != []


def test_cas_results_must_agree_with_the_register() -> None:
    ok = [Op(K, "write", 0, 1, 1), Op(K, "cas", 2, 3, 2, expected=1, ok=True),
          Op(K, "read", 4, 5, 2)]
    assert check(ok) == []
    lying = [Op(K, "write", 0, 1, 1), Op(K, "cas", 2, 3, 2, expected=7, ok=True)]
    assert check(lying) != []
    two_winners = [Op(K, "write", 0, 1, 1), Op(K, "cas", 2, 4, 2, expected=1, ok=True),
                   Op(K, "cas", 2, 4, 3, expected=1, ok=True)]
    assert check(two_winners) != []


def test_keys_are_checked_independently() -> None:
    h = [Op(b"a", "write", 0, 1, 1), Op(b"b", "read", 2, 3, None),
         Op(b"b", "write", 4, 5, 1), Op(b"a", "read", 6, 7, 2)]
    assert [v.key for v in check(h)] == [b"a"]


@st.composite
def sequential_histories(draw: st.DrawFn) -> list[Op]:
    """Histories produced by a real register, with overlapping-but-ordered timings."""
    state = None
    t = 0.0
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["write", "read", "cas"]))
        start, end = t, t + draw(st.floats(0.1, 1.0))
        t = end + draw(st.floats(0.0, 0.5))
        if kind == "write":
            v = draw(st.integers(0, 4))
            state = v
            ops.append(Op(K, "write", start, end, v))
        elif kind == "read":
            ops.append(Op(K, "read", start, end, state))
        else:
            exp, v = draw(st.integers(0, 4)), draw(st.integers(0, 4))
            ok = state == exp
            if ok:
                state = v
            ops.append(Op(K, "cas", start, end, v, expected=exp, ok=ok))
    return ops


@given(sequential_histories())
def test_every_history_of_a_real_register_passes(h: list[Op]) -> None:
    assert check(h) == []


@given(sequential_histories(), st.data())
def test_a_read_of_a_value_never_written_is_caught(h: list[Op], data: st.DataObject) -> None:
    reads = [i for i, op in enumerate(h) if op.kind == "read"]
    if not reads:
        return
    i = data.draw(st.sampled_from(reads))
    op = h[i]
    h[i] = Op(op.key, "read", op.invoke, op.complete, 99)
    assert check(h) != []


def test_long_histories_do_not_exhaust_the_stack() -> None:
    h = []
    for i in range(1200):  # 2,400 operations: deeper than the default recursion limit
        h.append(Op(K, "write", 2 * i, 2 * i + 1, i))
        h.append(Op(K, "read", 2 * i + 1.5, 2 * i + 1.9, i))
    assert check(h) == []
    h[-1] = Op(K, "read", h[-1].invoke, h[-1].complete, 0)
    assert check(h) != []
