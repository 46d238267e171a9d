"""The auth store and permission check against a plain reference model of etcd's rules.

The reference keeps users and roles as plain dicts and sets and decides a request by
brute force over the elementary intervals between every boundary involved; accord
merges intervals and binary-searches. Hypothesis drives both with the same random
commands (users, roles, grants, revokes, deletes, enable/disable) and random requests,
and the answers (including which etcd error) must be the same. A failure prints the
reproducing blob (``print_blob``)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.services.auth import errors
from accord.services.auth.guard import local_guard
from accord.services.auth.perms import Permission, PermissionSet, PermType
from accord.services.auth.statemachine import AuthStateMachine, encode
from accord.services.auth.store import AuthStore
from accord.services.auth.tokens import AuthInfo
from accord.services.kv.errors import EtcdError

INF = None


# --- the reference model ------------------------------------------------------------------
def ref_set(key: bytes, end: bytes, *, request: bool) -> tuple[bytes, bytes | None] | None:
    """The interval a permission (or request) names, by etcd's rules; None: nothing."""
    if not key:
        return None
    if not end:
        return (key, key + b"\x00")
    if end == b"\x00":
        return (key, INF)
    if end <= key:
        return (key, key + b"\x00") if request else None
    return (key, end)


def _lt(a: bytes | None, b: bytes | None) -> bool:
    if a is None:
        return False
    return b is None or a < b


def ref_covered(perms: list[tuple[bytes, bytes | None]], req: tuple[bytes, bytes | None]) -> bool:
    """Every elementary interval of ``req`` lies in some permission (brute force)."""
    points = {req[0], req[1]} | {p for iv in perms for p in iv}
    bounds = sorted(p for p in points if p is not None)
    lo, hi = req
    cuts = [b for b in bounds if not _lt(b, lo) and _lt(b, hi)]
    for start in cuts:
        if not any(not _lt(start, b) and _lt(start, e) for b, e in perms):
            return False
    return True


@dataclass
class Ref:
    """etcd's auth store as plain data."""

    users: dict[str, set[str]] = field(default_factory=dict)
    roles: dict[str, dict[tuple[bytes, bytes], int]] = field(default_factory=dict)
    enabled: bool = False
    revision: int = 1

    def apply(self, cmd: tuple[Any, ...]) -> str | None:
        """Apply a command; the name of the etcd error, or None."""
        op, *a = cmd
        if op == "user_add":
            if not a[0]:
                return "USER_EMPTY"
            if a[0] in self.users:
                return "USER_EXISTS"
            self.users[a[0]] = set()
        elif op == "user_delete":
            if self.enabled and a[0] == "root":
                return "INVALID_AUTH_MGMT"
            if a[0] not in self.users:
                return "USER_NOT_FOUND"
            del self.users[a[0]]
        elif op == "user_grant":
            if a[0] not in self.users:
                return "USER_NOT_FOUND"
            if a[1] != "root" and a[1] not in self.roles:
                return "ROLE_NOT_FOUND"
            if a[1] in self.users[a[0]]:
                return None
            self.users[a[0]].add(a[1])
        elif op == "user_revoke":
            if self.enabled and a == ["root", "root"]:
                return "INVALID_AUTH_MGMT"
            if a[0] not in self.users:
                return "USER_NOT_FOUND"
            if a[1] not in self.users[a[0]]:
                return "ROLE_NOT_GRANTED"
            self.users[a[0]].discard(a[1])
        elif op == "role_add":
            if not a[0]:
                return "ROLE_EMPTY"
            if a[0] in self.roles:
                return "ROLE_EXISTS"
            self.roles[a[0]] = {}
        elif op == "role_delete":
            if self.enabled and a[0] == "root":
                return "INVALID_AUTH_MGMT"
            if a[0] not in self.roles:
                return "ROLE_NOT_FOUND"
            del self.roles[a[0]]
            for roles in self.users.values():
                roles.discard(a[0])
        elif op == "role_grant":
            if a[0] not in self.roles:
                return "ROLE_NOT_FOUND"
            self.roles[a[0]][(a[2], a[3])] = a[1]
        elif op == "role_revoke":
            if a[0] not in self.roles:
                return "ROLE_NOT_FOUND"
            if (a[1], a[2]) not in self.roles[a[0]]:
                return "PERMISSION_NOT_GRANTED"
            del self.roles[a[0]][(a[1], a[2])]
        elif op == "enable":
            if not self.enabled:
                if "root" not in self.users:
                    return "ROOT_USER_MISSING"
                if "root" not in self.users["root"]:
                    return "ROOT_ROLE_MISSING"
                self.enabled = True
            return None
        elif op == "disable":
            self.enabled = False
            return None
        self.revision += 1
        return None

    def decide(self, user: str | None, key: bytes, end: bytes, need: int) -> str | None:
        """etcd's answer to a request: None (allowed) or the error's name."""
        if not self.enabled:
            return None
        if user is None:
            return "USER_EMPTY"
        if user not in self.users:
            return "PERMISSION_DENIED"
        if "root" in self.users[user]:
            return None
        perms = [iv for r in self.users[user] if r in self.roles
                 for (k, e), t in self.roles[r].items() if t in (need, 2)
                 if (iv := ref_set(k, e, request=False)) is not None]
        req = ref_set(key, end, request=True)
        assert req is not None
        return None if ref_covered(perms, req) else "PERMISSION_DENIED"


# --- strategies ---------------------------------------------------------------------------
NAMES = st.sampled_from(["root", "alice", "root", "alice", "bob", ""])
ROLES = st.sampled_from(["root", "r1", "r2", "r1", "r2", ""])
POOL = [b"", b"a", b"a\x00", b"ab", b"b", b"b\xff", b"ba", b"c", b"\xff"]
"""A few keys, so permission ends often meet other keys (touching and nested ranges)."""
KEYS = st.one_of(st.sampled_from(POOL),
                 st.text(alphabet="ab\x00\xff", max_size=3).map(lambda s: s.encode("latin-1")))
ENDS = st.one_of(st.just(b""), st.just(b"\x00"), KEYS)

COMMANDS = st.one_of(
    st.tuples(st.just("user_add"), NAMES),
    st.tuples(st.just("user_delete"), NAMES),
    st.tuples(st.just("user_grant"), NAMES, ROLES),
    st.tuples(st.just("user_revoke"), NAMES, ROLES),
    st.tuples(st.just("role_add"), ROLES),
    st.tuples(st.just("role_delete"), ROLES),
    st.tuples(st.just("role_grant"), ROLES, st.integers(0, 2), KEYS, ENDS),
    st.tuples(st.just("role_revoke"), ROLES, KEYS, ENDS),
    st.tuples(st.just("enable")),
    st.tuples(st.just("disable")),
)
EXAMPLES = settings(max_examples=max(settings().max_examples, 200))
"""Each example takes about a millisecond: more of them than the ci profile's default."""

REQUESTS = st.tuples(st.one_of(st.none(), NAMES), KEYS.filter(bool), ENDS, st.integers(0, 1))


def _error_name(e: EtcdError) -> str:
    for name in dir(errors):
        if getattr(errors, name) is e:
            return name
    raise AssertionError(f"unexpected error {e!r}")


def _as_command(cmd: tuple[Any, ...]) -> bytes:
    op, *a = cmd
    if op == "user_add":
        return encode(op, "root", a[0], b"hash", False)
    return encode(op, "root", *a)


@EXAMPLES
@given(st.lists(COMMANDS, min_size=1, max_size=40), st.lists(REQUESTS, min_size=1, max_size=30))
def test_store_and_checks_match_the_reference(cmds: list[tuple[Any, ...]],
                                              reqs: list[tuple[Any, ...]]) -> None:

    sm = AuthStateMachine()
    guard = local_guard()
    guard.machine = sm
    ref = Ref()
    index = itertools.count(1)
    for cmd in cmds:
        want = ref.apply(cmd)
        op, *args = msgpack.unpackb(_as_command(cmd))
        # commands come from root (an existing root holding root, or auth is off)
        if sm.store.enabled:
            args[0] = "root"
        try:
            sm.apply(next(index), op, args)
            got = None
        except EtcdError as e:
            got = _error_name(e)
        assert got == want, cmd
        assert sm.store.revision == ref.revision
        assert sm.store.enabled == ref.enabled
        for user, key, end, need in reqs:
            want_d = ref.decide(user, key, end, need)
            info = AuthInfo(user, sm.store.revision) if user is not None else None
            try:
                guard.check(info, [(key, end, PermType(need))])
                got_d = None
            except EtcdError as e:
                got_d = _error_name(e)
            assert got_d == want_d, (user, key, end, need, ref)


POOL_KEYS = st.sampled_from(POOL)
POOL_ENDS = st.sampled_from([b"\x00", *POOL])


@settings(max_examples=max(settings().max_examples, 1000))
@given(st.lists(st.tuples(st.integers(0, 2), POOL_KEYS, POOL_ENDS), max_size=12),
       POOL_KEYS.filter(bool), POOL_ENDS, st.integers(0, 1))
def test_merged_set_matches_brute_force(perms: list[tuple[int, bytes, bytes]], key: bytes,
                                        end: bytes, need: int) -> None:
    ps = [Permission(PermType(t), k, e) for t, k, e in perms]
    merged = PermissionSet.of(ps, PermType(need))
    ivs = [iv for t, k, e in perms if t in (need, 2)
           if (iv := ref_set(k, e, request=False)) is not None]
    req = ref_set(key, end, request=True)
    assert req is not None
    assert merged.covers(key, end) == ref_covered(ivs, req)


def test_root_is_never_locked_out() -> None:
    store = AuthStore()
    store.user_add("root", b"h")
    with pytest.raises(EtcdError) as e:
        store.enable()
    assert e.value == errors.ROOT_ROLE_MISSING
    store.user_grant_role("root", "root")  # needs no role entry named root
    store.enable()
    for change in (lambda: store.user_delete("root"), lambda: store.role_delete("root"),
                   lambda: store.user_revoke_role("root", "root")):
        with pytest.raises(EtcdError) as e:
            change()
        assert e.value == errors.INVALID_AUTH_MGMT
    assert store.rights("root") is not None and store.rights("root").root  # type: ignore[union-attr]


def test_prefix_grant_covers_exactly_the_prefix() -> None:
    store = AuthStore()
    store.user_add("u", b"h")
    store.role_add("r")
    store.role_grant_permission("r", Permission(PermType.READWRITE, b"/app/", b"/app0"))
    store.user_grant_role("u", "r")
    rights = store.rights("u")
    assert rights is not None
    assert rights.allows(b"/app/x", b"", PermType.WRITE)
    assert rights.allows(b"/app/", b"/app0", PermType.READ)
    assert not rights.allows(b"/app/", b"/app1", PermType.READ)
    assert not rights.allows(b"/ap", b"", PermType.READ)
    assert not rights.allows(b"/app/", b"\x00", PermType.READ)


def test_touching_and_nested_ranges_join() -> None:
    read = PermType.READ
    ps = PermissionSet.of([Permission(read, b"a", b"b"), Permission(read, b"b", b"c"),
                           Permission(read, b"ba", b"bb"), Permission(read, b"d", b"")], read)
    assert ps.covers(b"a", b"c") and ps.covers(b"ab", b"bz") and ps.covers(b"d", b"")
    assert not ps.covers(b"a", b"c\x00") and not ps.covers(b"d", b"d\x00\x00")


async def test_a_token_revoked_while_its_request_waited_is_an_invalid_token() -> None:
    # A member looks a simple token up, then waits for the meta group (the barrier); a
    # password change committed meanwhile must answer as etcd, which looks the caller up
    # only after its barrier: "invalid auth token" (not "revision of auth store is old").
    from accord.services.auth.guard import AuthGuard
    from accord.services.auth.statemachine import hash_digest
    from accord.services.auth.tokens import hash_password
    from tests.security.authstores import store_with_user

    sm, token, run, phash = store_with_user()
    revoke = [lambda: run("user_passwd", "u", hash_password("new", 4))]

    async def barrier() -> None:  # the change reaches this member while the call waits
        while revoke:
            revoke.pop()()

    async def commit(command: bytes) -> Any:
        raise AssertionError("no commit expected")

    guard = AuthGuard(sm, commit=commit, barrier=barrier)
    info = guard.identify([("token", token)], None)
    assert info is not None and "abcdefghijklmnop" not in repr(info)
    with pytest.raises(EtcdError) as e:
        await guard.authorize(info, [(b"/a", b"", PermType.READ)])
    assert e.value == errors.INVALID_AUTH_TOKEN
    # A token still valid after the barrier speaks for the revision current then.
    token2 = run("token", "root", "qrstuvwxyzabcdef", hash_digest(phash), int(time.time() * 1000))
    info2 = guard.identify([("token", token2)], None)
    run("role_add", "later")  # an unrelated change while the call waits
    await guard.authorize(info2, [(b"/a", b"", PermType.READ)])
