"""An in-process auth store for tests: root, and user ``u`` reading and writing a range
through role ``r``, with auth on and a simple token of ``u``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import msgpack

from accord.services.auth.statemachine import AuthStateMachine, encode, hash_digest
from accord.services.auth.tokens import hash_password


def store_with_user(key: bytes = b"/a", range_end: bytes = b"", now_ms: int = 0) -> tuple[
        AuthStateMachine, str, Callable[..., Any], str]:
    """The store, ``u``'s token (issued at ``now_ms``, default now: stores made with the
    same ``now_ms`` hold the same token), a function applying more changes as root, and
    the password hash of both users (password ``pw``)."""
    sm = AuthStateMachine()
    index = itertools.count(1)

    def run(op: str, *args: Any) -> Any:
        o, *a = msgpack.unpackb(encode(op, "root", *args))
        return sm.apply(next(index), o, a)

    phash = hash_password("pw", 4)
    run("user_add", "root", phash, False)
    run("user_grant", "root", "root")
    run("user_add", "u", phash, False)
    run("role_add", "r")
    run("role_grant", "r", 2, key, range_end)
    run("user_grant", "u", "r")
    run("enable")
    token = run("token", "u", "abcdefghijklmnop", hash_digest(phash),
                now_ms or int(time.time() * 1000))
    return sm, str(token), run, phash
