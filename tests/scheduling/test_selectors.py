"""Device selectors: grammar, quantities, case rules, errors, and a reference model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.services.scheduling.model import SchedulingError
from accord.services.scheduling.selectors import compile_selector, matches, parse_quantity

GiB = 2**30
H100: dict[str, Any] = {"vendor": "nvidia", "model": "H100", "memory": 80 * GiB, "arch": "sm_90", "capability": 9.0}
MI300: dict[str, Any] = {"vendor": "amd", "model": "MI300X", "memory": 192 * GiB, "arch": "gfx942", "capability": 9.42}
T4: dict[str, Any] = {"vendor": "nvidia", "model": "T4", "memory": 16 * GiB, "arch": "sm_75", "capability": 7.5}


@pytest.mark.parametrize("sel,h100,mi300,t4", [
    ("", True, True, True),
    ("vendor == nvidia", True, False, True),
    ("vendor == NVIDIA && memory >= 80GiB", True, False, False),
    ("model in (MI300X, H100)", True, True, False),
    ("model notin (MI300X, H100)", False, False, True),
    ("memory > 100Gi || model == 'T4'", False, True, True),
    ("!(vendor == nvidia)", False, True, False),
    ("capability >= 8.0 && vendor != amd", True, False, False),
    ("arch == sm_90", True, False, False),
    ("memory < 17179869185", False, False, True),
    ("missing == 1", False, False, False),
    ("!missing", True, True, True),
    ("vendor == nvidia && (memory >= 80GiB || arch == sm_75)", True, False, True),
])
def test_examples(sel: str, h100: bool, mi300: bool, t4: bool) -> None:
    assert (matches(sel, H100), matches(sel, MI300), matches(sel, T4)) == (h100, mi300, t4)


def test_quantities() -> None:
    assert parse_quantity("80GiB") == 80 * GiB
    assert parse_quantity("80Gi") == 80 * GiB
    assert parse_quantity("1.5T") == 1.5e12
    assert parse_quantity("512Mi") == 512 * 2**20
    assert parse_quantity("9.0") == 9
    assert parse_quantity("H100") is None


def test_ordering_needs_numbers() -> None:
    assert not matches("model >= A", H100)
    assert matches("memory >= 1", H100)


@pytest.mark.parametrize("bad", [
    "vendor ==", "vendor == nvidia &&", "(vendor == nvidia", "model in H100", "model in (H100",
    "== nvidia", "vendor = nvidia", "vendor == nvidia ; rm", "a && || b", "vendor == nvidia)",
    "__import__('os')", "model in ()",
])
def test_bad_syntax_is_a_clear_error(bad: str) -> None:
    with pytest.raises(SchedulingError, match="selector"):
        compile_selector(bad)


def test_too_long() -> None:
    with pytest.raises(SchedulingError):
        compile_selector("a == 1 && " * 1000 + "a == 1")


# --- property: the parser agrees with a direct evaluation of a generated expression tree ---

ATTRS = st.fixed_dictionaries({
    "vendor": st.sampled_from(["nvidia", "amd", "intel"]),
    "memory": st.sampled_from([16 * GiB, 80 * GiB, 192 * GiB]),
    "count": st.integers(0, 9),
})


def _leaf() -> st.SearchStrategy[tuple[str, Any]]:
    cmp = st.tuples(st.sampled_from(["memory", "count"]), st.sampled_from(["==", "!=", ">=", "<=", ">", "<"]),
                    st.sampled_from([("16GiB", 16 * GiB), ("80GiB", 80 * GiB), ("3", 3), ("7", 7)]))
    eq = st.tuples(st.just("vendor"), st.sampled_from(["==", "!="]),
                   st.sampled_from([("nvidia", "nvidia"), ("AMD", "amd"), ("'intel'", "intel")]))
    member = st.tuples(st.just("vendor"), st.sampled_from(["in", "notin"]),
                       st.lists(st.sampled_from(["nvidia", "amd", "intel"]), min_size=1, max_size=2))
    return st.one_of(cmp, eq, member).map(lambda t: ("leaf", t))


TREES = st.recursive(_leaf(), lambda sub: st.one_of(
    st.tuples(st.just("not"), sub), st.tuples(st.sampled_from(["and", "or"]), sub, sub)), max_leaves=8)


def _render(t: Any) -> str:
    if t[0] == "leaf":
        name, op, val = t[1]
        if op in ("in", "notin"):
            return f"{name} {op} ({', '.join(val)})"
        return f"{name} {op} {val[0]}"
    if t[0] == "not":
        return f"!({_render(t[1])})"
    sym = "&&" if t[0] == "and" else "||"
    return f"({_render(t[1])}) {sym} ({_render(t[2])})"


def _eval(t: Any, a: dict[str, Any]) -> bool:
    if t[0] == "leaf":
        name, op, val = t[1]
        v = a[name]
        if op in ("in", "notin"):
            return bool((v in val) == (op == "in"))
        w = val[1]
        return bool({"==": v == w, "!=": v != w, ">=": v >= w, "<=": v <= w, ">": v > w, "<": v < w}[op])
    if t[0] == "not":
        return not _eval(t[1], a)
    if t[0] == "and":
        return _eval(t[1], a) and _eval(t[2], a)
    return _eval(t[1], a) or _eval(t[2], a)


@given(tree=TREES, attrs=ATTRS)
def test_parser_matches_reference_evaluation(tree: Any, attrs: dict[str, Any]) -> None:
    assert matches(_render(tree), attrs) == _eval(tree, attrs)
