"""A linearizability checker for histories of register operations.

Model: every key is an independent register (so a history is checked key by key,
which keeps the search small), with three operations:

* ``write(v)``: sets the value;
* ``read() -> v``: returns the value (``None`` when the key is absent);
* ``cas(expected, v) -> ok``: sets ``v`` iff the value equals ``expected``.

An operation has an invocation time and a response time. An operation whose
outcome is unknown (the client timed out or lost its connection) has no
response: it may have taken effect at any point after its invocation, or never;
the checker tries both. A read that failed is dropped (it changed nothing).

The search is Wing and Gong's: repeatedly pick, among the operations not yet
linearized, one that no other pending operation must precede (nobody pending
responded before it was invoked), apply it to the model, and backtrack on a
mismatch; visited (set of linearized operations, register value) states are
memoized, as in Lowe's refinement of the algorithm.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

INF = math.inf


@dataclass(frozen=True, slots=True)
class Op:
    """One client operation on one key."""

    key: bytes
    kind: str  # "write" | "read" | "cas"
    invoke: float
    complete: float  # INF when the outcome is unknown
    value: Any = None  # written value, or the value read
    expected: Any = None  # cas only
    ok: bool | None = None  # cas result when known

    @property
    def known(self) -> bool:
        return self.complete != INF


@dataclass(frozen=True, slots=True)
class Violation:
    """A key whose history has no linearization, with that history."""

    key: bytes
    ops: tuple[Op, ...]

    def __str__(self) -> str:
        lines = [f"history of key {self.key!r} is not linearizable:"]
        for op in sorted(self.ops, key=lambda o: o.invoke):
            end = "?" if not op.known else f"{op.complete:.4f}"
            lines.append(f"  [{op.invoke:.4f} .. {end}] {op.kind} value={op.value!r} "
                         f"expected={op.expected!r} ok={op.ok}")
        return "\n".join(lines)


def _step(op: Op, state: Any) -> tuple[bool, Any]:
    """Apply ``op`` to the register ``state``: (consistent?, new state)."""
    if op.kind == "write":
        return True, op.value
    if op.kind == "read":
        return op.value == state, state
    if op.kind == "cas":
        matches = state == op.expected
        if op.ok is None:  # unknown outcome: it can only have succeeded if it matched
            return matches, op.value if matches else state
        if op.ok != matches:
            return False, state
        return True, op.value if matches else state
    raise ValueError(f"unknown operation kind {op.kind!r}")


def check_key(ops: list[Op], initial: Any = None, budget: int = 2_000_000) -> bool:
    """Whether one key's history is linearizable (raises if the search budget runs out)."""
    ops = sorted(ops, key=lambda o: o.invoke)
    n = len(ops)
    required = 0
    for i, op in enumerate(ops):
        if op.known:
            required |= 1 << i
    if required == 0:
        return True

    def moves(done: int, state: Any) -> list[tuple[int, Any]]:
        # The earliest response among pending ops bounds which ops may go next.
        horizon = min((ops[i].complete for i in range(n) if not done >> i & 1), default=INF)
        out = []
        for i in range(n):
            if done >> i & 1:
                continue
            op = ops[i]
            if op.invoke > horizon:
                break  # sorted by invocation: nothing later can go first
            ok, nxt = _step(op, state)
            if ok:
                out.append((done | 1 << i, nxt))
        return out

    # Depth-first search with an explicit stack (histories run to thousands of ops).
    seen: set[tuple[int, Any]] = set()
    stack = [iter([(0, initial)])]
    while stack:
        try:
            done, state = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if done & required == required:
            return True
        if (done, state) in seen:
            continue
        seen.add((done, state))
        if len(seen) > budget:
            raise RuntimeError(f"linearizability search gave up after {budget} states")
        stack.append(iter(moves(done, state)))
    return False


def check(history: Iterable[Op], initial: Any = None) -> list[Violation]:
    """Check every key of ``history``; returns the keys that are not linearizable."""
    by_key: dict[bytes, list[Op]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    return [Violation(k, tuple(v)) for k, v in sorted(by_key.items())
            if not check_key(v, initial)]
