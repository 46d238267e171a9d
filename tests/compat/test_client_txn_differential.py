"""Differential: the client's transaction builder against a real etcd and against accord.

Both servers start empty and get the same sequence of requests for the whole module, so
revisions stay in lockstep and results compare as they are: every generated txn (compares
on value, version, mod, create and lease, of a key or a prefix, with each operator; then
and else branches of gets, puts, deletes and nested txns) is built with
``client.txn().if_(...).then(...).else_(...)`` and committed through the client to both;
the typed results must be equal, and so must a refusal's code and message.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from accord.client import ClientError, Compare, Op, TxnResult
from accord.client.sync import SyncClient
from tests.compat.servers import accord_server, etcd_server

KEYS = ["a", "ab", "b"]
VALUES = ["", "x", "y"]


@dataclass
class Pair:
    etcd: SyncClient
    accord: SyncClient
    ns: Iterator[int]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data = tmp_path_factory.mktemp("etcd-txn")
    with etcd_server(Path(data)) as etcd, accord_server() as acc:
        e = SyncClient([etcd.endpoint], call_timeout_s=10.0)
        a = SyncClient([acc.endpoint], call_timeout_s=10.0)
        try:
            yield Pair(e, a, itertools.count())
        finally:
            e.close()
            a.close()


# A compare or op is generated as a recipe (a tuple) and built for each side's namespace.
compares = st.tuples(
    st.sampled_from(["value", "version", "mod", "create", "lease"]),
    st.sampled_from(KEYS), st.booleans(), st.sampled_from(["==", "!=", "<", ">"]),
    st.integers(0, 6), st.sampled_from(VALUES))
leaf_ops = st.one_of(
    st.tuples(st.just("get"), st.sampled_from(KEYS), st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.sampled_from(VALUES), st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.booleans(), st.booleans()),
)
ops = st.one_of(leaf_ops, st.tuples(st.just("txn"), st.lists(compares, max_size=2),
                                    st.lists(leaf_ops, max_size=2), st.lists(leaf_ops, max_size=2)))
txns = st.tuples(st.lists(compares, max_size=3), st.lists(ops, max_size=3),
                 st.lists(ops, max_size=3))
seeds = st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=4)


def build_compare(ns: str, recipe: tuple[Any, ...], base: int) -> Compare:
    target, key, prefix, op, n, value = recipe
    t = getattr(Compare, target)(ns + key, prefix=prefix)
    # revisions are absolute: compare around the example's first revision
    operand: Any = value if target == "value" else (base + n - 3 if target in ("mod", "create")
                                                    else n)
    if op == "==":
        return t == operand  # type: ignore[no-any-return]
    if op == "!=":
        return t != operand  # type: ignore[no-any-return]
    return t < operand if op == "<" else t > operand  # type: ignore[no-any-return]


def build_op(ns: str, recipe: tuple[Any, ...], base: int) -> Op:
    kind = recipe[0]
    if kind == "get":
        _, key, prefix, limit = recipe
        return Op.get(ns + key, prefix=prefix, limit=limit)
    if kind == "put":
        _, key, value, prev = recipe
        return Op.put(ns + key, value, prev_kv=prev)
    if kind == "delete":
        _, key, prefix, prev = recipe
        return Op.delete(ns + key, prefix=prefix, prev_kv=prev)
    _, cs, then, other = recipe
    return Op.txn([build_compare(ns, c, base) for c in cs],
                  [build_op(ns, o, base) for o in then], [build_op(ns, o, base) for o in other])


def commit(c: SyncClient, ns: str, recipe: tuple[Any, ...], base: int) -> TxnResult | tuple[str, str]:
    cs, then, other = recipe
    try:
        return (c.txn().if_(*(build_compare(ns, x, base) for x in cs))
                .then(*(build_op(ns, o, base) for o in then))
                .else_(*(build_op(ns, o, base) for o in other)).commit())
    except ClientError as e:
        return (e.code.name, e.message)


@settings(deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seeds, st.lists(txns, min_size=1, max_size=4))
def test_txn_builder_gives_etcds_answers(pair: Pair, seed: list[tuple[str, str]],
                                         recipes: list[tuple[Any, ...]]) -> None:
    ns = f"/tx{next(pair.ns)}/"
    base = 0
    for key, value in seed:
        re_, ra = pair.etcd.put(ns + key, value), pair.accord.put(ns + key, value)
        assert re_ == ra
        base = base or ra.revision
    base = base or pair.accord.range(ns, count_only=True).revision
    for recipe in recipes:
        expected = commit(pair.etcd, ns, recipe, base)
        got = commit(pair.accord, ns, recipe, base)
        assert got == expected, f"txn {recipe}"
    assert pair.accord.range(ns, prefix=True) == pair.etcd.range(ns, prefix=True)
