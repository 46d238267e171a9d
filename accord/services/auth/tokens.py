"""Token providers: etcd's ``simple`` tokens (the default) and ``jwt`` tokens.

``--auth-token`` takes etcd's syntax: ``simple`` or
``jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256,ttl=5m``.

*Simple tokens* are random strings with no meaning of their own, so every member must
know them: as in etcd, the member that checked the password proposes the new token
through the meta group and every member records it when it applies the entry (this
module holds the table; ``statemachine.py`` fills it). A token lives ``ttl`` seconds
(``--auth-token-ttl``, etcd's 300 by default) after its last use on a member, and dies at
once when its user is deleted or changes password, or when auth is disabled.

*JWT tokens* carry the user name and the auth revision they were issued at, signed with
the configured key (PyJWT); any member with the public key verifies them alone, so
Authenticate needs no consensus round. A JWT issued before a later auth change answers
etcd's ``revision of auth store is old`` and clients authenticate again.
"""

from __future__ import annotations

import re
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import jwt

DEFAULT_TOKEN_TTL_S = 300
"""etcd's ``--auth-token-ttl``."""
DEFAULT_BCRYPT_COST = 10
"""etcd's ``--bcrypt-cost`` (Go's ``bcrypt.DefaultCost``)."""
SIMPLE_PREFIX_LEN = 16
"""etcd's simple tokens: 16 random letters, a dot, the log index that assigned it."""
JWT_DEFAULT_TTL_S = 300
_JWT_METHODS = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                "ES256", "ES384", "ES512", "HS256", "HS384", "HS512"}


@dataclass(frozen=True, slots=True)
class AuthInfo:
    """Who a request comes from, and the auth revision its credential speaks for."""

    user: str
    revision: int
    token: str | None = field(default=None, repr=False, compare=False)
    """The simple token it was looked up from (never printed); None otherwise."""
    at_lookup: bool = False
    """Whether ``revision`` is the store's at lookup time (simple tokens and client
    certificates, as in etcd) rather than one the credential carries (a JWT's): the guard
    looks such an identity up again once its freshness barrier passed."""


def hash_password(password: str, cost: int = DEFAULT_BCRYPT_COST) -> bytes:
    """A bcrypt hash of ``password`` at ``cost`` (slow on purpose: call off the loop)."""
    return bytes(bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)))


def check_password(password: str, password_hash: bytes) -> bool:
    """Whether ``password`` matches ``password_hash`` (slow on purpose)."""
    try:
        return bool(bcrypt.checkpw(password.encode(), password_hash))
    except ValueError:  # an empty or malformed hash never matches
        return False


def new_simple_prefix() -> str:
    """The random part of a simple token."""
    return "".join(secrets.choice(string.ascii_letters) for _ in range(SIMPLE_PREFIX_LEN))


class SimpleTokens:
    """The table of live simple tokens on this member (filled by the meta group's apply)."""

    def __init__(self, ttl_s: float = DEFAULT_TOKEN_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"--auth-token-ttl must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self._clock = clock
        self._tokens: dict[str, tuple[str, float]] = {}
        """token -> (user, deadline on this member's monotonic clock)."""
        self._assigned = 0

    def assign(self, token: str, user: str, age_s: float = 0.0) -> None:
        """Record ``token`` for ``user``, issued ``age_s`` ago (skipped when already dead)."""
        if age_s >= self.ttl_s:
            return
        self._assigned += 1
        if self._assigned % 256 == 0:
            self.expire()
        self._tokens[token] = (user, self._clock() + self.ttl_s - max(age_s, 0.0))

    def user_of(self, token: str) -> str | None:
        """The user of a live token (its life restarts), or ``None``."""
        entry = self._tokens.get(token)
        if entry is None:
            return None
        user, deadline = entry
        now = self._clock()
        if now >= deadline:
            del self._tokens[token]
            return None
        if deadline - now < self.ttl_s - 1.0:  # refresh at most once a second per token
            self._tokens[token] = (user, now + self.ttl_s)
        return user

    def invalidate_user(self, user: str) -> None:
        """Every token of ``user`` dies (deleted, or a new password)."""
        for token in [t for t, (u, _) in self._tokens.items() if u == user]:
            del self._tokens[token]

    def clear(self) -> None:
        """Every token dies (auth disabled)."""
        self._tokens.clear()

    def expire(self) -> int:
        """Drop dead tokens; returns how many."""
        now = self._clock()
        dead = [t for t, (_, d) in self._tokens.items() if d <= now]
        for t in dead:
            del self._tokens[t]
        return len(dead)

    def live(self) -> list[tuple[str, str, float]]:
        """``(token, user, age_s)`` of every live token (for snapshots)."""
        now = self._clock()
        return [(t, u, self.ttl_s - (d - now)) for t, (u, d) in self._tokens.items() if d > now]

    def __len__(self) -> int:
        return len(self._tokens)


class JWTTokens:
    """Signed, self-contained tokens (etcd's ``--auth-token jwt,...``)."""

    def __init__(self, sign_method: str, *, priv_key: bytes | None, pub_key: bytes | None,
                 ttl_s: float = JWT_DEFAULT_TTL_S) -> None:
        if sign_method not in _JWT_METHODS:
            raise ValueError(f"unsupported JWT sign-method {sign_method!r}; "
                             f"use one of {', '.join(sorted(_JWT_METHODS))}")
        if ttl_s <= 0:
            raise ValueError(f"JWT ttl must be positive, got {ttl_s}")
        self.method = sign_method
        self.ttl_s = ttl_s
        if sign_method.startswith("HS"):
            if not priv_key:
                raise ValueError("a JWT HS* sign-method needs priv-key (the shared secret)")
            self._sign_key: Any = priv_key
            self._verify_key: Any = priv_key
        else:
            if not pub_key:
                raise ValueError(f"JWT sign-method {sign_method} needs pub-key")
            self._verify_key = pub_key
            self._sign_key = priv_key
        self._clock = time.time

    @property
    def can_sign(self) -> bool:
        """Whether this member holds the private key (otherwise it only verifies)."""
        return self._sign_key is not None

    def issue(self, user: str, revision: int) -> str:
        """A token for ``user`` at auth ``revision``."""
        if self._sign_key is None:
            raise ValueError("this member has no JWT priv-key and cannot issue tokens")
        now = self._clock()
        claims = {"username": user, "revision": revision, "exp": int(now + self.ttl_s)}
        return str(jwt.encode(claims, self._sign_key, algorithm=self.method))

    def info(self, token: str) -> AuthInfo | None:
        """Who a valid, unexpired token speaks for, or ``None``."""
        try:
            claims = jwt.decode(token, self._verify_key, algorithms=[self.method],
                                options={"require": ["exp", "username", "revision"]})
        except jwt.PyJWTError:
            return None
        user, revision = claims.get("username"), claims.get("revision")
        if not isinstance(user, str) or not isinstance(revision, int):
            return None
        return AuthInfo(user, revision)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """A Go duration (``5m``, ``300s``, ``1h30m``) in seconds."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"bad duration {text!r} (Go syntax: 300s, 5m, 1h)")
    return total


@dataclass(frozen=True, slots=True)
class TokenSpec:
    """A parsed ``--auth-token``: ``simple``, or ``jwt`` with its options."""

    kind: str
    options: tuple[tuple[str, str], ...] = ()

    def jwt(self) -> JWTTokens:
        """The JWT provider these options describe (reads the key files)."""
        opts = dict(self.options)
        method = opts.get("sign-method", "")
        priv = opts.get("priv-key")
        pub = opts.get("pub-key")
        ttl = parse_duration(opts["ttl"]) if "ttl" in opts else JWT_DEFAULT_TTL_S
        priv_bytes = Path(priv).read_bytes() if priv else None
        pub_bytes = Path(pub).read_bytes() if pub else None
        if pub_bytes is None and priv_bytes is not None and not method.startswith("HS"):
            pub_bytes = _public_of(priv_bytes)
        return JWTTokens(method, priv_key=priv_bytes, pub_key=pub_bytes, ttl_s=ttl)


def _public_of(priv_pem: bytes) -> bytes:
    """The PEM public key of a PEM private key."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(priv_pem, password=None)
    return bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def parse_token_spec(text: str) -> TokenSpec:
    """Parse etcd's ``--auth-token`` value; ValueError saying what is wrong."""
    kind, *rest = [part.strip() for part in text.split(",")]
    if kind == "simple":
        if rest:
            raise ValueError("--auth-token simple takes no options")
        return TokenSpec("simple")
    if kind != "jwt":
        raise ValueError(f"--auth-token must be 'simple' or 'jwt,...', got {kind!r}")
    opts: list[tuple[str, str]] = []
    for part in rest:
        name, sep, value = part.partition("=")
        if not sep or name not in ("pub-key", "priv-key", "sign-method", "ttl"):
            raise ValueError(f"bad --auth-token jwt option {part!r} (pub-key=, priv-key=, "
                             "sign-method=, ttl=)")
        opts.append((name, value))
    spec = TokenSpec("jwt", tuple(opts))
    names = dict(opts)
    if "sign-method" not in names:
        raise ValueError("--auth-token jwt needs sign-method=...")
    if "ttl" in names:
        parse_duration(names["ttl"])
    return spec
