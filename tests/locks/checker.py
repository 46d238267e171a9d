"""A mutual-exclusion checker over histories of acquire, guarded write and release.

Input: the grants (token, grant revision) every client saw, the guarded writes the
store committed (read back from its history, so writes whose answer a client never got
count too), and the writes clients were told were refused. It checks that

* tokens only grow: in grant-revision order, grant tokens strictly increase;
* guarded writes of different holders never interleave out of token order: in commit
  order, the tokens of committed writes never go down (once a write with token T2
  committed, no write with an older token T1 < T2 ever commits again);
* every committed write carries a token that was granted, and was committed after its
  grant;
* no write reported as refused is in the store's history.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Write:
    """One committed guarded write: the revision it committed at and its token."""

    revision: int
    token: int
    value: bytes


def check(
    grants: Iterable[tuple[int, int]],
    committed: Iterable[Write],
    refused_values: Iterable[bytes] = (),
) -> list[str]:
    """Every violation found (empty: the history is fine)."""
    problems: list[str] = []
    by_rev = sorted(grants, key=lambda g: g[1])
    granted_at: dict[int, int] = {}
    for (t1, r1), (t2, r2) in itertools.pairwise(by_rev):
        if t2 <= t1:
            problems.append(f"token went back: {t1} granted at rev {r1}, then {t2} at rev {r2}")
    for token, rev in by_rev:
        granted_at[token] = rev
    writes = sorted(committed, key=lambda w: w.revision)
    high = 0
    for w in writes:
        if w.token not in granted_at:
            problems.append(f"write at rev {w.revision} carries token {w.token} that was never granted")
        elif w.revision <= granted_at[w.token]:
            problems.append(f"write at rev {w.revision} precedes the grant of token {w.token}")
        if w.token < high:
            problems.append(
                f"write at rev {w.revision} with token {w.token} after a write with token {high}"
            )
        high = max(high, w.token)
    values = {w.value for w in writes}
    for v in refused_values:
        if v in values:
            problems.append(f"write {v!r} was reported refused but is in the history")
    return problems
